"""Token classifiers (``*ForTokenClassification``, e.g. NER): vLLM's ``token_classify`` pooling task and
the transformers reference, over one base (:class:`~vllm_eval.models.token_classifier.base.TokenClassifierBase`)."""

from .base import TokenClassifierBase

__all__ = ["TokenClassifierBase"]
