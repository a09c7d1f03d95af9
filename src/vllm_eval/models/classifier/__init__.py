"""Sequence classifiers (``*ForSequenceClassification``): vLLM's ``classify`` task, the transformers
reference and served models, over one base (:class:`~vllm_eval.models.classifier.base.ClassifierBase`)."""

from .base import ClassifierBase

__all__ = ["ClassifierBase"]
