"""What :func:`vllm_eval.generate` does with lm-evaluation-harness's tasks: the checks before the model starts, the
model (our engine as :class:`~vllm_eval.models.generator.lmeval.VllmLM`, or lm-eval's own ``HFLM`` as the reference),
lm-eval's evaluator, its result files and our ``summary.json``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from ..utils.timeline import phase

logger = logging.getLogger(__name__)

#: ``simple_evaluate`` keywords ``generate`` passes through under lm-eval's names.
EVALUATE_OPTIONS = (
    "num_fewshot",
    "samples",
    "apply_chat_template",
    "fewshot_as_multiturn",
    "system_instruction",
    "gen_kwargs",
    "predict_only",
    "bootstrap_iters",
    "confirm_run_unsafe_code",
    "random_seed",
    "numpy_random_seed",
    "torch_random_seed",
    "fewshot_random_seed",
)
#: lm-eval's model options (``--model_args`` of its ``vllm`` / ``hf`` models) ``generate`` takes as its own flags.
MODEL_OPTIONS = ("max_gen_toks", "add_bos_token", "prefix_token_id", "truncation_side")
#: lm-eval's HFLM batch size here (its default is 1; the reference's numbers do not depend on it).
HF_BATCH_SIZE = 8
#: Backends that run lm-eval's tasks here.
BACKENDS = ("vllm", "hf", "remote")


def check_lm_eval_call(backend: str, limit: Any, evaluate: dict[str, Any]) -> None:
    """The values checked before anything loads.

    Raises:
        UsageError: a backend that cannot run lm-eval's tasks, a bad ``limit``, ``samples`` with ``limit``.
    """
    if backend not in BACKENDS:
        raise UsageError(
            f"--backend {backend} does not run lm-eval's tasks yet; use --backend vllm (our engine), hf "
            "(lm-eval's HFLM, the reference) or remote (a served model)"
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0):
        raise UsageError(f"--limit: a count >= 1 or a fraction in (0, 1), got {limit!r}")
    if limit is not None and isinstance(limit, float) and limit >= 1 and not limit.is_integer():
        raise UsageError(f"--limit: a count >= 1 or a fraction in (0, 1), got {limit!r}")
    if limit is not None and evaluate.get("samples") is not None:
        raise UsageError("give --limit or --samples, not both (lm-eval's rule)")


def chat_template_needed(model_path: str, apply_chat_template: Any) -> None:
    """Raises UsageError when a chat template is asked for and the model's tokenizer has none (before loading)."""
    if not apply_chat_template:
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise UsageError(f"--apply-chat-template: model {model_path!r} has no chat template (its tokenizer has none)")
    if isinstance(apply_chat_template, str) and isinstance(template, dict) and apply_chat_template not in template:
        raise UsageError(
            f"--apply-chat-template {apply_chat_template!r}: {model_path!r} has templates {sorted(template)} only"
        )


#: what in a ``config.json`` marks a model that may take images (a vision tower's config, or its image tokens);
#: a model with none of them is refused an image task; any one lets vLLM decide
_VISION_KEYS = (
    "vision_config",
    "visual",
    "vision_tower",
    "mm_vision_tower",
    "img_processor",
    "image_token_index",
    "image_token_id",
    "image_processor",
)


def images_supported(model_path: str, prepared: Any) -> None:
    """Raises UsageError, before loading, when a task shows images (``doc_to_image``) and the model's
    ``config.json`` has nothing of a vision part (:data:`_VISION_KEYS`, or an architecture named for vision):
    lm-eval would refuse it only after the engine started."""
    if not getattr(prepared, "multimodal", False):
        return
    from ..utils.modelinfo import local_snapshot, model_json

    folder = local_snapshot(model_path, None)
    if folder is None or not (folder / "config.json").is_file():
        return  # not readable here: the engine says
    config = model_json(folder / "config.json")
    named = " ".join(config.get("architectures") or [])
    if not any(k in config for k in _VISION_KEYS) and not any(w in named for w in ("Vision", "VL", "Llava", "Image")):
        shown = sorted(t for t, task in prepared.tasks.items() if getattr(task.config, "doc_to_image", None))
        raise UsageError(
            f"task {shown[0]!r} shows images, and model {model_path!r} takes none (its config.json has no "
            "vision_config): give a vision-language model, or a text-only task"
        )


def build_model(
    session: Any,
    model: Any,
    model_options: dict[str, Any],
    show_progress: bool,
    prepared: Any = None,
    apply_chat_template: Any = None,
) -> Any:
    """The lm-eval model of the call: :class:`VllmLM` on our engine (``vllm``), lm-eval's ``HFLM`` (``hf``), lm-eval's
    ``LocalCompletionsAPI`` against the server (``remote``,
    :func:`~vllm_eval.models.generator.lmeval_remote.remote_lm`)."""
    path = getattr(model, "path", model)
    options = {k: v for k, v in model_options.items() if v is not None}
    if session.spec.remote:
        from ..models.generator.lmeval_remote import remote_lm

        tokenizer = session.spec.options.get("tokenizer")
        types = getattr(prepared, "output_types", None)
        lm = remote_lm(session.spec.http, model, tokenizer=tokenizer, output_types=types, **options)
        if apply_chat_template and not getattr(lm.tokenizer, "chat_template", None):
            raise UsageError(f"--apply-chat-template: tokenizer {lm.tokenizer.name_or_path!r} has no chat template")
        return lm
    if session.spec.name == "hf":
        from lm_eval.models.huggingface import HFLM

        given = session.spec.options
        import torch

        hf = {"device": given.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")}
        dtype = given.get("dtype") or session.engine.get("dtype") or "float32"
        return HFLM(pretrained=path, dtype=dtype, batch_size=HF_BATCH_SIZE, **hf, **options)
    from ..models.generator.lmeval import VllmLM

    generator = session.spec.load(model, raw_prompts=True, show_progress_bar=show_progress)
    if getattr(generator, "_multimodal", False):  # a model that takes images: lm-eval's tasks with images too
        from ..models.generator.lmeval_vlm import VllmVLM

        return VllmVLM(generator=generator, show_progress_bar=show_progress, **options)
    return VllmLM(generator=generator, show_progress_bar=show_progress, **options)


def run(
    session: Any,
    model: Any,
    prepared: Any,
    *,
    cache: Any,
    limit: Any,
    log_samples: bool,
    evaluate: dict[str, Any],
    model_options: dict[str, Any],
    show_progress: bool,
) -> dict[str, Any]:
    """Start the model, run lm-eval's evaluator on ``prepared``, write lm-eval's files and ``summary.json``.

    Returns:
        ``results`` (lm-eval's dict without samples), ``samples``, ``results_path``, ``samples_paths``,
        ``model_name``, ``truncated`` (contexts cut to fit, by request type) and ``seconds``.
    """
    from ..tasks.lmeval import run_tasks

    output_dir = session.output_dir or os.path.join("results", "generate")
    path = str(getattr(model, "path", model) or "")
    with phase("model"):
        lm = build_model(session, model, model_options, show_progress, prepared, evaluate.get("apply_chat_template"))
    generator = getattr(lm, "generator", None)
    try:
        if generator is not None:
            generator.use_cache(cache)
        args = {"pretrained": path, **session.engine, **{k: v for k, v in model_options.items() if v is not None}}
        if session.spec.remote:  # the served name, and where it was served
            path = str(lm.model)
            args = {"model": path, "base_url": lm.base_url, "tokenizer": lm.tokenizer.name_or_path}
        with phase("evaluate"):
            ran = run_tasks(
                lm, prepared, output_dir=output_dir, model_args=args, log_samples=log_samples, limit=limit, **evaluate
            )
        truncated = dict(getattr(lm, "truncated", {}))
        for kind, n in truncated.items():
            if n:
                logger.warning(
                    "%d %s requests were longer than the context (%d tokens): cut on the left, as lm-eval does",
                    n,
                    kind,
                    lm.max_length,
                )
        summary = _write_summary(session, generator or lm, path, ran, truncated)
    finally:
        if generator is not None:  # built here for the call (VllmLM does not own it): its engine released now
            generator.close()
    return {
        "results": ran.results,
        "samples": ran.samples,
        "results_path": ran.results_path,
        "samples_paths": ran.samples_paths,
        "summary_path": summary,
        "model_name": path,
        "truncated": truncated,
        "seconds": ran.seconds,
    }


def _write_summary(session: Any, backend: Any, path: str, ran: Any, truncated: dict[str, int]) -> Path | None:
    """``summary.json`` in the output folder (beside lm-eval's folder of the model), with where lm-eval's files
    are (:func:`write_summary`)."""
    if ran.results_path is None:
        return None
    info = {
        "model": path,
        "command": sys.argv,
        "task_framework": "lm-eval",
        "lm_eval_results": str(Path(ran.results_path).resolve()),
        "lm_eval_samples": {k: str(Path(v).resolve()) for k, v in ran.samples_paths.items()},
        "evaluate_seconds": round(ran.seconds, 2),
        "truncated": truncated,
    }
    target = ran.results_path.parent.parent / "summary.json"  # in --output-dir, where compare and report look
    return write_summary(session, backend, ran.results, target, info)


def write_summary(session: Any, backend: Any, results: dict[str, Any], target: Path, info: dict[str, Any]) -> Path:
    """``summary.json`` at ``target`` of lm-eval's (or lmms-eval's, whose results have lm-eval's shape) results:
    the run's main scores as rows, the engine options, versions, timeline and ``info``
    (:func:`~vllm_eval.evaluation.results.write_summary`, the one summary writer)."""
    from ..evaluation.results import TaskScore
    from ..evaluation.results import write_summary as write
    from ..tasks.lmeval import main_scores

    framework = info.get("task_framework", "lm-eval")
    rows = [
        TaskScore(task=name, task_type=f"{framework} {filt}", main_score_name=metric, main_score=value, seconds=0.0)
        for name, metric, value, filt in main_scores(results)
    ]
    write(backend, rows, target, info, session.started)
    return target
