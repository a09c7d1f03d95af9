"""The kinds of model, each described once: what the CLI, ``compare`` and the presets ask of a kind.

A kind is a family of backends sharing one base class (:mod:`vllm_eval.models.backends` maps each
``(kind, backend)`` to its class). Its :class:`Kind` names the command that evaluates it, the
reference configuration ``compare`` checks vLLM against, the preset kinds its backends apply
(``vllm-eval models --kind``) and the tasks ``compare`` runs by default. The names are the same
everywhere a user types one (``compare --kind``, ``models --kind``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..utils.errors import UnknownNameError


@dataclass(frozen=True)
class Kind:
    """One kind of model.

    Attributes:
        name: the kind's name (``encoder``, ``reranker`` ...), a key of the backend table.
        command: the ``vllm-eval`` subcommand that evaluates it.
        reference: ``BACKEND:DTYPE`` of the reference implementation ``compare`` checks against.
        preset_kinds: kinds of :mod:`vllm_eval.models.presets` entries its backends apply (may be empty).
        default_tasks: tasks ``compare`` runs when none are named (empty: the command's own default).
        description: one line for listings.
        cosine: ``compare`` measures agreement of outputs by cosine (vectors), else by |Δ| (scores, probabilities).
    """

    name: str
    command: str
    reference: str
    preset_kinds: tuple[str, ...] = ()
    default_tasks: tuple[str, ...] = ()
    description: str = ""
    cosine: bool = False

    @property
    def reference_backend(self) -> str:
        """The backend name of :attr:`reference`."""
        return self.reference.partition(":")[0]


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("encoder", "run", "st:float32", ("embedding",), (), "embedding models (one vector per text)", True),
        Kind(
            "reranker",
            "rerank",
            "st:float32",
            ("reranker",),
            ("LeeKnownItemRetrieval",),
            "cross-encoders and LLM rerankers (one score per query-document pair)",
        ),
        Kind(
            "generator",
            "generate",
            "hf:float32",
            ("language", "multimodal"),
            ("PangLeePolarity",),
            "chat LLMs and VLMs (multiple choice by answer or log-likelihood)",
        ),
        Kind(
            "classifier",
            "classify",
            "hf:float32",
            (),
            ("PangLeePolarity",),
            "sequence classifiers and reward models (probabilities or scores per text)",
        ),
        Kind(
            "transcriber",
            "transcribe",
            "hf:float32",
            (),
            ("AsteriskPrompts.en",),
            "speech-to-text models (a transcript or an English translation per audio; Whisper)",
        ),
        Kind(
            "token_classifier",
            "token-classify",
            "hf:float32",
            (),
            (),
            "token classifiers (a label per word, e.g. NER)",
        ),
        Kind(
            "token_embedder",
            "run",
            "hf:float32",
            (),
            ("LeeKnownItemRetrieval",),
            "multi-vector models (one vector per token, MaxSim; ColBERT)",
            True,
        ),
        Kind(
            "sparse_encoder",
            "run",
            "st:float32",
            (),
            ("LeeKnownItemRetrieval",),
            "learned sparse retrievers (one weight per vocabulary id, dot product; SPLADE, BGE-M3 lexical)",
        ),
    )
}


def get_kind(name: str) -> Kind:
    """The :class:`Kind` called ``name``.

    Raises:
        UnknownNameError: no such kind (the kinds are listed).
    """
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownNameError(f"unknown kind {name!r}; kinds: {', '.join(KINDS)}") from None


def kind_of_preset(preset_kind: str) -> str:
    """The model kind whose backends apply presets of ``preset_kind`` (``embedding`` -> ``encoder``).

    Raises:
        UnknownNameError: no kind applies it.
    """
    for kind in KINDS.values():
        if preset_kind in kind.preset_kinds:
            return kind.name
    raise UnknownNameError(f"no kind of model applies {preset_kind!r} presets")
