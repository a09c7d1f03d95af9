"""``VllmLMMS``: this project's generator as an lmms-eval model (``lmms-eval --model vllm-eval``).

lmms-eval 0.7.3 loads outside models through the entry-point group ``lmms_eval.models``
(``lmms_eval/models/registry_v2.py``, ``load_entrypoint_manifests``); this package registers :func:`manifest` there, so
``lmms-eval --model vllm-eval --model_args model=...`` works once it is installed. The class is a "simple" lmms-eval
model (``is_simple = True``: requests carry ``(contexts, gen_kwargs, doc_to_visual, doc_id, task, split)``) and gives
what lmms-eval's own vLLM models (``lmms_eval/models/simple/vllm.py``, ``chat/vllm.py``) lack:

* every request of a call in flight at once on one :class:`~vllm_eval.models.generator.vllm.VllmGenerator` (theirs
  send ``batch_size`` requests per ``llm.chat``, 1 by default), over replicas on every GPU or Ray actors in one
  process (``data_parallel_size``; theirs need a ``torchrun`` launch);
* ``loglikelihood`` (theirs ``assert False``): lmms-eval's loss, the mean negative log-likelihood per token of the
  continuation after the context rendered with the chat template, the document's images shown as in generation;
* the output cache (``cache_dir``): a run stopped and started again computes only what was not stored.

Sampling is lmms-eval's: its defaults (temperature 0, top_p 0.95, ``max_new_tokens`` the model's, 1024) under each
request's ``gen_kwargs``, grouped so that requests of one setting go together; ``until`` strings stop generation as
lmms-eval's transformers models cut at them (its vLLM models ignore them).
"""

from __future__ import annotations

import json
from typing import Any

from lmms_eval.api.model import lmms

from ...utils.errors import UsageError

#: The name lmms-eval knows this model by (``--model vllm-eval``).
MODEL_ID = "vllm-eval"
#: lmms-eval's sampling defaults of its vLLM models (temperature, top_p) and their ``max_new_tokens``.
LMMS_DEFAULTS = {"temperature": 0.0, "top_p": 0.95}
LMMS_MAX_NEW_TOKENS = 1024


def manifest() -> Any:
    """lmms-eval's ``ModelManifest`` of :class:`VllmLMMS` (the ``lmms_eval.models`` entry point's payload)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=f"{__name__}.VllmLMMS")


class VllmLMMS(lmms):
    """An lmms-eval model on this project's vLLM generator.

    Args:
        model: a model path or hub id (``pretrained`` is taken as its alias).
        image_first: images before the text in the user turn (lmms-eval's vLLM option; default after, as there).
        max_new_tokens: the default answer length when a task's ``gen_kwargs`` give none.
        batch_size, device: lmms-eval's command-line values; unused (every request is in flight at once, the engine
            places itself).
        generator: a started :class:`~vllm_eval.models.generator.vllm.VllmGenerator` to use instead of starting one
            (tests, and callers that hold one engine for many runs); it is not closed here, and its output cache is
            kept unless ``cache_dir`` is given.
        cache_dir: the output cache's folder (default: ``~/.cache/vllm-eval``, as this project's commands): a run
            stopped and started again computes only the answers not stored.
        no_cache: no output cache.
        **kwargs: :class:`~vllm_eval.models.generator.vllm.VllmGenerator`'s options and vLLM's ``EngineArgs``
            (``data_parallel_size``, ``tensor_parallel_size``, ``max_model_len``, ``dtype``, ``chat_template``,
            ``cache_dir`` ...); lmms-eval's strings are parsed as JSON where they are JSON.

    Raises:
        UsageError: no model; a cache folder that cannot be made or read. Later, a request with images for a model
            vLLM loads as text-only (its task and document named).
    """

    is_simple = True

    def __init__(
        self,
        model: str | None = None,
        pretrained: str | None = None,
        *,
        image_first: bool = False,
        max_new_tokens: int = LMMS_MAX_NEW_TOKENS,
        batch_size: Any = None,
        device: Any = None,
        generator: Any = None,
        cache_dir: str | None = None,
        no_cache: Any = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.max_new_tokens = int(max_new_tokens)
        self._owned = generator is None
        if generator is None:
            from .vllm import VllmGenerator

            name = model or pretrained
            if not name:
                raise UsageError("lmms-eval's --model_args need model=<path or hub id> for vllm-eval")
            options = {k: _parsed(v) for k, v in kwargs.items()}
            position = "before" if _flag(image_first) else "after"
            generator = VllmGenerator(name, image_position=position, show_progress_bar=False, **options)
        self.generator = generator
        if _flag(no_cache):
            generator.use_cache(None)
        elif self._owned or cache_dir:
            from ..cache import OutputCache, default_cache_dir

            generator.use_cache(OutputCache(cache_dir or default_cache_dir()))

    def close(self) -> None:
        """Stop the engine this model started (not a ``generator`` it was given)."""
        if self._owned and self.generator is not None:
            self.generator.close()
        self.generator = None

    # --- requests ------------------------------------------------------------------------------------------------

    def _visuals(self, doc_to_visual: Any, doc_id: Any, task: str, split: str) -> list[Any]:
        """The request's images: ``doc_to_visual`` of its document (``self.task_dict``, set by lmms-eval's
        evaluator), flattened; none where it gives None."""
        if doc_to_visual is None:
            return []
        got = doc_to_visual(self.task_dict[task][split][doc_id])
        out: list[Any] = []
        for item in got if isinstance(got, (list, tuple)) else [got]:
            if isinstance(item, (list, tuple)):
                out.extend(item)
            elif item is not None:
                out.append(item)
        if out and not getattr(self.generator, "_multimodal", True):
            raise UsageError(
                f"{task}: document {doc_id} shows images, and model {self.generator.model!r} takes none (vLLM loads"
                " it as a text-only model)"
            )
        for item in out:
            if isinstance(item, str) and item.lower().endswith((".mp4", ".avi", ".mov", ".flv", ".wmv", ".webm")):
                raise UsageError(
                    f"{task}: document {doc_id} has a video ({item}); vllm-eval's lmms-eval model takes images"
                )
        return out

    def _sampling(self, gen_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """vLLM ``SamplingParams`` values of one request's lmms-eval ``gen_kwargs``."""
        gen = dict(gen_kwargs or {})
        until = gen.pop("until", None)
        out = {**LMMS_DEFAULTS, "max_tokens": int(gen.pop("max_new_tokens", None) or self.max_new_tokens)}
        for key in ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty"):
            if gen.get(key) is not None:
                out[key] = gen[key]
        if not out["top_p"]:  # lmms-eval's tasks write top_p 0 for greedy; vLLM wants (0, 1]
            out["top_p"] = 1.0
        stops = [until] if isinstance(until, str) else list(until or [])
        if stops:
            out["stop"] = stops
        return out

    def generate_until(self, requests: list[Any]) -> list[str]:
        """One answer per request, in order: requests of one sampling setting generated together, all in flight."""
        groups: dict[str, list[int]] = {}
        samples, settings = [], []
        for i, req in enumerate(requests):
            contexts, gen_kwargs, doc_to_visual, doc_id, task, split = req.arguments
            settings.append(self._sampling(gen_kwargs))
            samples.append((contexts, self._visuals(doc_to_visual, doc_id, task, split)))
            groups.setdefault(json.dumps(settings[-1], sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(requests)
        for idx in groups.values():
            for i, gen in zip(idx, self._generate_with(settings[idx[0]], [samples[i] for i in idx]), strict=True):
                out[i] = gen.output
        return out

    def _generate_with(self, sampling: dict[str, Any], samples: list[tuple[str, list[Any]]]) -> list[Any]:
        with self.generator.sampled(sampling):
            return self.generator.generate(samples, total=len(samples))

    def loglikelihood(self, requests: list[Any]) -> list[Any]:
        """``(loss, is_greedy)`` per request, as lmms-eval's ``GenerationResult`` whose ``text`` is that pair.

        ``loss`` is lmms-eval's: every one of its transformers models returns the mean negative log-likelihood per
        token of the continuation (its ``multiple_choice`` scoring takes the ``argmin``), float64 nats per token;
        here of ``doc_to_target``'s text (or the string given) after the context as the chat template renders it,
        images shown as in generation. Their models' mean also takes in the template's tokens after the answer (the
        end-of-turn marker); this one does not. ``is_greedy``: greedy decoding gives the continuation's text.

        lmms-eval 0.7.3's evaluator passes every answer through ``unwrap_generation_output``, which turns a bare
        ``(float, bool)`` into its ``str`` (so its ``multiple_choice`` tasks fail to unpack them); a
        ``GenerationResult``'s ``text`` goes through as it is.
        """
        from lmms_eval.api.instance import GenerationResult

        contexts, continuations, images = [], [], []
        for req in requests:
            if len(req.arguments) == 2:  # acc_mutual_info's unconditional requests: no document, no images
                contexts.append(req.arguments[0])
                continuations.append(str(req.arguments[1]))
                images.append([])
                continue
            context, doc_to_target, doc_to_visual, doc_id, task, split = req.arguments
            doc = self.task_dict[task][split][doc_id]
            target = doc_to_target(doc) if callable(doc_to_target) else doc_to_target
            if isinstance(target, list):
                target = target[0]
            contexts.append(context)
            continuations.append(str(target))
            images.append(self._visuals(doc_to_visual, doc_id, task, split))
        if not requests:
            return []
        scores = self.generator.loglikelihoods(contexts, continuations, images if any(images) else None)
        tokenizer = self.generator.tokenizer
        lengths = [max(len(tokenizer(c, add_special_tokens=False)["input_ids"]), 1) for c in continuations]
        greedy = self._greedy(contexts, continuations, images, lengths)
        return [GenerationResult(text=(-float(s) / n, g)) for s, n, g in zip(scores, lengths, greedy, strict=True)]

    def _greedy(
        self, contexts: list[str], continuations: list[str], images: list[list[Any]], lengths: list[int]
    ) -> list[bool]:
        """Whether greedy decoding of ``lengths[i]`` tokens after context ``i`` gives continuation ``i``'s text: one
        generation per distinct context, images and length (the options of a question share theirs)."""
        from ..images import image_digest

        keys = [(n, c, *(image_digest(im) for im in ims)) for c, ims, n in zip(contexts, images, lengths, strict=True)]
        slot: dict[tuple[Any, ...], int] = {}
        by_length: dict[int, list[tuple[str, list[Any]]]] = {}
        for key, ctx, ims in zip(keys, contexts, images, strict=True):
            if key not in slot:
                slot[key] = len(by_length.setdefault(key[0], []))
                by_length[key[0]].append((ctx, ims))
        answers = {
            n: [g.output for g in self._generate_with({"temperature": 0.0, "top_p": 1.0, "max_tokens": n}, samples)]
            for n, samples in by_length.items()
        }
        return [answers[key[0]][slot[key]] == cont for key, cont in zip(keys, continuations, strict=True)]

    def generate_until_multi_round(self, requests: list[Any]) -> list[str]:
        raise UsageError("vllm-eval's lmms-eval model answers one round per request (generate_until)")


def _parsed(value: Any) -> Any:
    """lmms-eval's ``--model_args`` values: JSON where they are JSON (``{...}``, numbers, booleans)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(value, value)


def _flag(value: Any) -> bool:
    return _parsed(value) is True
