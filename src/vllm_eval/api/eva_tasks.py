"""kaiko-eva's tasks (``eva.PatchCamelyon``, ``eva.PathMMUAtlas``, ``eva.PubMedQA``, ``eva.QuiltVQA``) in
``generate``: every task's files checked before the model starts and read and sampled before or while it starts
(:func:`_start_reading`), all its requests in flight at once, then
eva's extraction, metrics and ``results.json`` (:mod:`vllm_eval.tasks.eva`). Quilt-VQA's judge is a second model,
started after the first is shut down (this project's engine, ``judge_model=``) or served (``judge_endpoint=``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..utils.errors import MissingAnswersError, UsageError

#: eva's module of ``MAX_NEW_TOKENS``.
CONSTANTS = "language/models/constants.py"
#: ``generate`` keywords for eva's tasks only.
EVA_OPTIONS = ("data_root", "judge_model", "judge_endpoint", "missing_limit", "n_runs", "download")


def eva_sampling(given: dict[str, Any]) -> dict[str, Any]:
    """eva's ``VllmModel`` sampling (temperature 0, top_p 1, top_k -1, ``max_tokens`` eva's ``MAX_NEW_TOKENS``),
    under the user's values."""
    from ..utils.eva_source import module_namespace

    # Read from eva's source: importing eva.language takes seconds (Lightning, litellm) that the engine's start hides
    # when the tasks are read on their thread.
    max_new = module_namespace(CONSTANTS, needed={"MAX_NEW_TOKENS"}).get("MAX_NEW_TOKENS")
    if not isinstance(max_new, int):
        raise UsageError(f"kaiko-eva's {CONSTANTS} has no MAX_NEW_TOKENS (a release this project has not read)")
    return {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": max_new, **given}


def eva_engine_default(name: str) -> Any:
    """The engine option ``name`` of eva's multimodal ``VllmModel._default_model_kwargs``
    (eva/multimodal/models/wrappers/vllm.py, read from eva's installed source): ``enforce_eager`` is True there
    ("reduce start-up time"), so eva's image tasks start eager here too unless ``enforce_eager`` is given. eva's
    other defaults (``max_model_len``, ``gpu_memory_utilization``) are sizing, which this project does itself."""
    from ..utils.eva_source import class_attribute

    return class_attribute("multimodal/models/wrappers/vllm.py", "VllmModel", "_default_model_kwargs").get(name)


class EvaJudge:
    """eva's judge-model protocol over a generator backend: called with eva's ``TextBatch`` (``text``: one message
    series per prompt), returns ``{"generated_text": [str, ...]}``, as eva's model wrappers do."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self.calls: list[dict[str, Any]] = []

    def __call__(self, batch: Any) -> dict[str, list[str]]:
        texts = ["\n".join(str(m.content) for m in series) for series in batch.text]
        outs = self.generator.generate(((t, ()) for t in texts), total=len(texts))
        self.calls.extend({"prompt": g.prompt, "output": g.output} for g in outs)
        return {"generated_text": [g.output for g in outs]}


def run_eva(
    model: Any,
    tasks: list[Any],
    *,
    prepare_session: Callable[..., Any],
    result_cls: type,
    backend: str,
    limit: int | None,
    sampling: dict[str, Any],
    output_dir: Any,
    cache_at: tuple[Any, bool],
    show_progress: bool,
    verbose: bool,
    started: float | None,
    options: dict[str, Any],
) -> Any:
    """Run eva's ``tasks`` (:class:`~vllm_eval.tasks.eva.EvaTask`) on ``model``; see :func:`vllm_eval.generate`.

    Raises:
        DataUnavailableError: a task's file is missing (before any model starts); with ``download``, a file that
            could not be fetched.
        UsageError: a free-form task without a judge, both judges, a bad option.
    """
    from ..utils.timeline import phase
    from .checks import open_cache, require_model, resolve_model, task_output_dirs

    data_root = options.pop("data_root", None)
    judge_model, judge_endpoint = options.pop("judge_model", None), options.pop("judge_endpoint", None)
    missing_limit, n_runs = options.pop("missing_limit", None), options.pop("n_runs", None)
    download = options.pop("download", None)
    if judge_model and judge_endpoint:
        raise UsageError("give --judge-model or --judge-endpoint, not both")
    free = [t.name for t in tasks if t.free_form]
    if free and not (judge_model or judge_endpoint):
        raise UsageError(
            f"{', '.join(free)}: scored by an LLM judge (eva's GEvalCorrectness): give --judge-model "
            "MODEL (run here after the model) or --judge-endpoint URL (a served one)"
        )
    if not options.get("preset"):  # eva's VllmModel: images after the text; its registered models say their own
        options.setdefault("image_position", "after")
    if backend == "vllm" and options.get("enforce_eager") is None and any(t.modality == "image" for t in tasks):
        options["enforce_eager"] = eva_engine_default("enforce_eager")
    # Before the tasks: a bad option is named in seconds, not after eva's imports and the data are read.
    with phase("imports"):
        session = prepare_session(backend, options, output_dir, verbose, started)
    with phase("tasks"):
        _check_data(tasks, data_root, download, show_progress)
    how = {"num_samples": limit, "missing_limit": 5 if missing_limit is None else missing_limit, "n_runs": n_runs}
    work, cache = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-eval-tasks"), None
    try:
        image_limits, ready, pending = _start_reading(work, tasks, data_root, how, _overlaps(session))
        with phase("model"):
            model = None if model is None else os.fspath(model)
            require_model(model, session.spec.remote)
            resolved = resolve_model(model, session.spec.remote)
        outputs = task_output_dirs(session.output_dir, "generate", tasks)
        cache = open_cache(*cache_at)
        internal = {"sampling": eva_sampling(sampling), "show_progress_bar": show_progress, **image_limits}
        generated: dict[str, tuple[list[str], list[str]]] = {}
        with session.spec.load(resolved, **internal) as generator:
            generator.use_cache(cache)
            name, engine_kwargs = generator.model, getattr(generator, "engine_kwargs", None)
            prepared = ready.result()
            for p, requests in zip(prepared, pending, strict=True):
                generator.system_prompt = p.task.system_prompt  # the config's, part of the cache's identity
                gens = generator.generate(requests.result(), total=p.size)
                generated[p.task.name] = ([g.output for g in gens], [g.prompt for g in gens])
            position = generator.image_position
        judge = _judge(prepare_session, judge_model, judge_endpoint, backend, show_progress, verbose, started, free)
        results, errors = _score_all(prepared, generated, judge, outputs, name, engine_kwargs, position)
    finally:
        work.shutdown(wait=True, cancel_futures=True)
        if cache is not None:
            cache.close()
    return result_cls(
        results=results,
        model_name=name,
        backend=session.spec.name,
        output_dirs={t.name: Path(out) for t, out in zip(tasks, outputs, strict=True)},
        errors=errors,
        cache=cache,
    )


def _check_data(tasks: list[Any], data_root: Any, download: Any, show_progress: bool) -> None:
    """Fetch the tasks' missing files (``download``), then check that they are all there: a missing one is named
    in milliseconds, before any model starts."""
    from ..tasks import eva

    for t in tasks:
        if download:
            from ..tasks.eva_download import download_task

            download_task(t, eva.task_folder(t, data_root), show_progress=show_progress)
        eva.check_files(t, data_root)


def _overlaps(session: Any) -> bool:
    """Whether eva's reading may run while the model starts: a served model, or a vLLM engine whose core runs in
    its own process. Not beside an engine starting in this process: on the 2-core CPU build the two shared the
    cores and the run took longer (61.1 and 59.2 s sequential against 64.8 and 65.1 s; with the core in its own
    process 105.8 and 112.0 s against 102.8 and 103.6 s)."""
    from ..engine.procenv import generation_core_apart

    return bool(session.spec.remote) or (session.spec.runs_engine and generation_core_apart())


def _start_reading(work: ThreadPoolExecutor, tasks: list, data_root: Any, how: dict, overlap: bool) -> tuple:
    """``(image limits, future of the prepared tasks, a future of each task's requests)``, the reading and the
    images' decoding left to ``work`` (one thread), which runs them while the engine starts. With ``overlap``, where
    the layout fixes the images' size (PatchCamelyon) or there are none, eva's imports and samplers run there too;
    otherwise the tasks are read here first (the engine's profiling needs the sampled images' size)."""
    from ..tasks import eva

    image_limits = _image_limits([eva.fixed_image_size(t) for t in tasks if t.modality == "image"])
    if image_limits is None or not overlap:
        early = _prepare_all(tasks, data_root, how)
        image_limits = _image_limits([wh for p in early if p.task.modality == "image" and (wh := p.largest_image())])
        ready = work.submit(lambda: early)
    else:
        ready = work.submit(_prepare_all, tasks, data_root, how)
    # Submitted after the reading, on the same thread: each task's images are decoded once it is read.
    pending = [work.submit(lambda i=i: ready.result()[i].requests()) for i in range(len(tasks))]
    return image_limits or {}, ready, pending


def _prepare_all(tasks: list[Any], data_root: Any, how: dict[str, Any]) -> list[Any]:
    """:func:`vllm_eval.tasks.eva.prepare` of every task (eva's readers and samplers; their imports)."""
    from ..tasks import eva
    from ..utils.timeline import phase

    with phase("tasks"):
        return [eva.prepare(t, data_root, **how) for t in tasks]


def _image_limits(sizes: list[tuple[int, int] | None]) -> dict[str, Any] | None:
    """The generator's ``max_images_per_prompt`` and ``largest_image`` for eva's image tasks, given each one's
    ``(width, height)``: one image per prompt, and the largest width and height, so that vLLM profiles at that
    size (:func:`vllm_eval.models.generator.vllm.image_limits`). ``{}`` for text tasks only; None where a size is
    not known yet."""
    if any(wh is None for wh in sizes):
        return None
    if not sizes:
        return {}
    return {"max_images_per_prompt": 1, "largest_image": (max(w for w, _ in sizes), max(h for _, h in sizes))}  # type: ignore[union-attr]


def _judge(prepare_session, judge_model, judge_endpoint, backend, show_progress, verbose, started, free) -> Any:
    """The judge's generator, started now (the model under test is shut down), as a context manager; None when
    no task needs one."""
    if not free:
        return None
    judge_backend = "remote" if judge_endpoint else backend
    opts = {"endpoint": judge_endpoint} if judge_endpoint else {}
    session = prepare_session(judge_backend, opts, None, verbose, started)
    from .checks import resolve_model

    resolved = resolve_model(judge_model, session.spec.remote)
    return session.spec.load(resolved, sampling=eva_sampling({}), show_progress_bar=show_progress)


def _score_all(prepared, generated, judge_cm, outputs, name, engine_kwargs, position) -> tuple[dict, dict]:
    from ..tasks import eva

    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}

    def one(p: Any, out: str, judge: Any) -> None:
        texts, prompts = generated[p.task.name]
        extra = {"model": name, "engine_kwargs": engine_kwargs, "image_position": position}
        try:
            results[p.task.name] = eva.score(p, texts, judge=judge, output_dir=out, extra=extra, prompts=prompts)
        except MissingAnswersError as exc:  # the files are written; the other tasks still run
            errors[p.task.name] = str(exc)
            results[p.task.name] = json.loads((Path(out) / "results.json").read_text())

    for p, out in zip(prepared, outputs, strict=True):
        if not p.task.free_form:
            one(p, out, None)
    if judge_cm is not None:
        with judge_cm as judge_generator:
            for p, out in zip(prepared, outputs, strict=True):
                if p.task.free_form:
                    one(p, out, EvaJudge(judge_generator))
    return results, errors
