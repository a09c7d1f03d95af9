"""Prompt formatting for encoders: static prefixes and instruction templates, one path for every backend.

Two mechanisms, both resolved per mteb task and prompt type:

* **Static prompts** (``prompts``), e.g. e5's ``{"query": "query: ", "document": "passage: "}``. Keys
  follow mteb's ``model_prompts`` convention, first match wins: ``"<TaskName>-query"``,
  ``"<TaskName>"``, ``"<TaskType>-query"``, ``"<TaskType>"``, ``"query"``/``"document"``.
  mteb's own vLLM wrapper never sets ``model_prompts``, so these prefixes are silently dropped
  there; here they always reach the model.
* **Instruction templates** (``instruction_template``), e.g.
  ``"Instruct: {instruction}\\nQuery: "`` (e5-mistral, Qwen3-Embedding) or a callable
  ``(instruction, prompt_type) -> str``. The instruction is the task's own (``TaskMetadata.prompt``,
  else mteb's default for the task type) unless ``instructions`` overrides it per task name, task
  type or prompt type. Documents get no instruction unless ``apply_instruction_to_documents``.

The final prefix is ``<formatted instruction><static prompt>`` and is prepended to each text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mteb.models.abs_encoder import AbsEncoder, get_prompt
from mteb.types import PromptType

from ..utils.errors import OptionError, UsageError

InstructionTemplate = str | Callable[[str, PromptType | None], str]


def _check_str_mapping(name: str, value: Mapping[str, str] | None) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise OptionError(f"{name} must be a dict of str to str, got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise OptionError(f"{name}[{k!r}] must map str to str, got {type(v).__name__}")
    return dict(value)


class PromptResolver(AbsEncoder):
    """Resolves the prefix of a task's texts; every backend (encoders, rerankers) holds one.

    It subclasses ``AbsEncoder`` only to reuse mteb's own instruction lookup
    (``get_task_instruction``: task name, task type, prompt type, then the task's metadata); it is
    not a model and its ``encode`` raises.

    Args:
        prompts: static prefixes keyed as described in the module docstring.
        instruction_template: string containing ``{instruction}`` or a callable
            ``(instruction, prompt_type) -> str``.
        instructions: per task name / task type / prompt type instruction overrides.
        apply_instruction_to_documents: also prefix documents with the formatted instruction.

    Raises:
        UsageError: a string template without ``{instruction}``.
        TypeError: prompts or instructions that are not ``dict[str, str]``.
    """

    def __init__(
        self,
        *,
        prompts: Mapping[str, str] | None = None,
        instruction_template: InstructionTemplate | None = None,
        instructions: Mapping[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
    ) -> None:
        self.model_prompts = _check_str_mapping("prompts", prompts)
        self.prompts_dict = _check_str_mapping("instructions", instructions) or None
        if isinstance(instruction_template, str) and "{instruction}" not in instruction_template:
            raise UsageError(f"instruction_template must contain '{{instruction}}': {instruction_template!r}")
        if (
            instruction_template is not None
            and not isinstance(instruction_template, str)
            and not callable(instruction_template)
        ):
            raise OptionError("instruction_template must be a str or a callable (instruction, prompt_type) -> str")
        self.instruction_template = instruction_template
        self.apply_instruction_to_documents = apply_instruction_to_documents

    def encode(self, *args: Any, **kwargs: Any):
        raise TypeError("PromptResolver formats prompts; it is not a model")

    def prefix(self, task_metadata: Any, prompt_type: PromptType | None) -> str:
        """The string prepended to every text of ``task_metadata`` for ``prompt_type``."""
        static = get_prompt(self.model_prompts, task_metadata, prompt_type) or ""
        instruction = ""
        if self.instruction_template is not None and (
            prompt_type != PromptType.document or self.apply_instruction_to_documents
        ):
            instruction = self.get_task_instruction(task_metadata, prompt_type)
        return instruction + static

    def task_instruction(self, task_metadata: Any) -> str | None:
        """The raw query instruction for a task (no template): an ``instructions`` override by task
        name or type, else the task's own ``metadata.prompt``; None when neither exists."""
        for key in (task_metadata.name, task_metadata.type, PromptType.query.value):
            if self.prompts_dict and key in self.prompts_dict:
                return self.prompts_dict[key]
        prompt = task_metadata.prompt
        if isinstance(prompt, dict):
            prompt = prompt.get(PromptType.query.value)
        return prompt or None


def check_texts(texts: Any, offset: int = 0) -> list[str]:
    """``texts`` as a list of str.

    Raises:
        OptionError: naming the index and value of the first item that is not a str.
    """
    if isinstance(texts, str):
        raise OptionError("expected a sequence of texts, got a single str")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise OptionError(f"input {offset + i} is {type(t).__name__} {t!r:.80}, expected str")
    return out


def inputs_from(inputs: Any, prefix: str, model_inputs: Any):
    """Batch by batch (never all at once), the model inputs of an mteb ``DataLoader``: ``model_inputs(texts,
    images)`` of each batch's prefixed texts and its images (either may be None: mteb's image tasks send
    ``{"image": [...]}``, fused ones both).

    Raises:
        OptionError: a text that is not a str (named by its index in the loader).
    """
    seen = 0
    for batch in inputs:
        texts = batch.get("text")
        if texts is not None:
            texts = check_texts(texts, seen)
            texts = [prefix + t for t in texts] if prefix else texts
        items = model_inputs(texts, batch.get("image"))
        seen += len(items)
        yield items


def resolve_prompting(
    model: str | None,
    kind: str,
    *,
    preset: Any = None,
    prompts: Mapping[str, str] | None = None,
    instruction_template: InstructionTemplate | None = None,
    instructions: Mapping[str, str] | None = None,
    apply_instruction_to_documents: bool = False,
) -> tuple[PromptResolver, Any]:
    """The prompt resolver and preset of one backend of ``kind`` (``encoder`` or ``reranker``).

    The preset (``preset`` by name, else the one whose pattern matches ``model``; see
    :func:`vllm_eval.models.presets.resolve_preset`) supplies ``prompts`` and ``instruction_template``
    where the caller gave none; explicit arguments always win.

    Returns:
        ``(PromptResolver, ModelPreset or None)``.

    Raises:
        UnknownNameError, UsageError: an unknown preset, or one of another kind.
        OptionError: prompts or instructions that are not ``dict[str, str]``.
    """
    from .presets import resolve_preset

    found = resolve_preset(model, kind, preset)
    if found is not None:
        prompts = prompts if prompts is not None else found.prompts
        instruction_template = instruction_template if instruction_template is not None else found.instruction_template
    resolver = PromptResolver(
        prompts=prompts,
        instruction_template=instruction_template,
        instructions=instructions,
        apply_instruction_to_documents=apply_instruction_to_documents,
    )
    return resolver, found
