"""``vllm_eval.generate``: a generative model on lm-evaluation-harness's tasks (by lm-eval's names, with lm-eval's
prompts, metrics and result files), or on this project's multiple-choice tasks and files, by answer or by
log-likelihood; everything ``vllm-eval generate`` does, from Python.

The shape of lm-evaluation-harness's ``simple_evaluate``: one call that checks every option before anything
loads, selects the tasks (by name or your own file), starts the backend once (a vLLM engine, transformers, or
servers), scores each task and writes its ``results.json`` and ``samples.jsonl``. ``vllm-eval generate`` parses
its flags and calls it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tasks import split_names
from ..tasks.eva import find_eva_task
from ..tasks.generative import LM_EVAL_ALIASES, is_own_task
from ..utils.errors import UsageError
from ..utils.timeline import phase
from .checks import chat_template, check_model_argument, open_cache, require_model, resolve_model, task_output_dirs
from .command_sweep import sweepable
from .eva_tasks import EVA_OPTIONS, run_eva
from .lm_eval_tasks import EVALUATE_OPTIONS, MODEL_OPTIONS
from .lmms_tasks import lmms_names
from .session import Session, prepare, split_options

#: Backend options ``generate`` passes on when given; the capability options (``device``, ``endpoint`` ...) too.
BACKEND_OPTIONS = (
    "preset",
    "chat_template",
    "chat_template_kwargs",
    "think_end_token",
    "system_prompt",
    "raw_prompts",
    "image_position",
)
ANSWER_FORMATS = ("json", "xml", "boxed", "raw")
SCORINGS = ("generate", "loglikelihood")
#: lm-eval's options ``generate`` takes for lm-eval's tasks (:mod:`vllm_eval.api.lm_eval_tasks`).
LM_EVAL_KEYWORDS = ("include_path", "log_samples", *EVALUATE_OPTIONS, *MODEL_OPTIONS)
#: ``SamplingParams`` names of the keywords ``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``sampling_seed``.
SAMPLING = ("temperature", "top_p", "top_k", "max_tokens", "seed")


@dataclass
class GenerationResult:
    """What :func:`generate` returns.

    Attributes:
        results: per task name, in task order, the task's results (as in its ``results.json``: ``metrics``
            with ``accuracy``, ``macro_f1``, ``missing``, ``n_samples`` ...; ``config``, ``model``, ``seconds``
            ...) and ``samples``, one dict per sample (prompt, raw output, parsed answer, target, correct). A
            task over its missing-answer budget is here too, read back from its ``results.json`` (no
            ``samples``: they are in its ``samples.jsonl``), and in ``errors``.
        model_name: the model as the backend names it (its path, or the served name).
        backend: the backend's table name (``vllm``, ``hf``, ``remote``).
        output_dirs: per task name, the folder of its ``results.json`` and ``samples.jsonl``.
        errors: per task name, why it failed: more unparsable answers than ``max_missing`` allows.
        cache: the output cache (:class:`~vllm_eval.models.cache.OutputCache`, closed), None with ``no_cache``.
    """

    results: dict[str, dict[str, Any]]
    model_name: str
    backend: str
    output_dirs: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    cache: Any = None
    #: lm-eval's tasks: lm-eval's whole results dict (``results``, ``groups``, ``configs``, ``versions``, ``n-shot``,
    #: ``higher_is_better``, ``n-samples``, ``config`` ...) and where its files and ``summary.json`` went.
    lm_eval: dict[str, Any] | None = None

    @property
    def failed(self) -> list[str]:
        """The tasks over their missing-answer budget."""
        return list(self.errors)

    @property
    def scores(self) -> dict[str, float]:
        """By task name, of the tasks that did not fail: accuracy; for lm-eval's tasks (and groups) their first
        metric under its first filter, as lm-eval's table prints it."""
        if self.lm_eval is not None:
            from ..tasks.lmeval import main_scores

            return {name: value for name, _, value, _ in main_scores(self.lm_eval["results"])}
        return {
            t: r["main_score"]["value"] if "main_score" in r else r["metrics"]["accuracy"]
            for t, r in self.results.items()
            if t not in self.errors
        }


@sweepable("generate")
def generate(
    model: str | os.PathLike | None = None,
    tasks: list[str] | str | None = None,
    *,
    data: str | os.PathLike | None = None,
    backend: str = "vllm",
    answer_format: str = "json",
    scoring: str = "generate",
    letters: bool | None = None,
    reasoning: bool = False,
    limit: int | None = None,
    max_missing: float = 0.1,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_tokens: int | None = None,
    sampling_seed: int | None = None,
    output_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    no_cache: bool = False,
    show_progress: bool = True,
    verbose: bool = False,
    started: float | None = None,
    **options: Any,
) -> GenerationResult:
    """Evaluate a generative model (a chat LLM, or a VLM on image tasks) on multiple-choice tasks.

    Every keyword has the name of ``vllm-eval generate``'s flag (``--max-tokens`` is ``max_tokens=``, the sampling
    seed ``--sampling-seed`` is ``sampling_seed=``; ``seed=`` is the engine's). Call it under
    ``if __name__ == "__main__":``: vLLM starts its processes with ``spawn``.

    Args:
        model: a model directory or hub id (offline: a cached one); for a served model the served name
            (optional: default the server's).
        tasks: task names (a list, or one string of comma-separated names): lm-eval's task, group and tag names and
            task YAML paths (``mmlu``, ``gsm8k`` ...: lm-eval's prompts, metrics and result files; see
            :mod:`vllm_eval.api.lm_eval_tasks`), lmms-eval's as ``lmms.<task>`` (:mod:`vllm_eval.api.lmms_tasks`),
            eva's as ``eva.<task>``, or this project's ``PangLeePolarity``, ``Digits`` (offline; one kind per call).
        data: your own multiple-choice file instead of ``tasks`` (``.jsonl``/``.csv``/``.parquet`` with question,
            options, answer [, image]).
        backend: ``vllm`` (default), ``hf`` (transformers, the reference), ``remote`` (``/v1/chat/completions``
            of running servers).
        answer_format: how the answer is asked for and parsed: ``json``, ``xml``, ``boxed``, ``raw``.
        scoring: ``generate`` (sample an answer and parse it) or ``loglikelihood`` (the option whose tokens have
            the highest summed log-probability after the prompt).
        letters: name options by letter (default: the task's choice). ``reasoning``: ask for brief reasoning first.
        limit: the first ``limit`` samples of each task only.
        max_missing: budget of unparsable answers: a fraction of the samples if <= 1, else a count.
        temperature, top_p, top_k, max_tokens, sampling_seed: ``SamplingParams`` (defaults: temperature 0,
            top_p 1, max_tokens 256, seed 0).
        output_dir: one task's ``results.json`` and ``samples.jsonl`` go here, several tasks' to
            ``<output_dir>/<task>`` (created now); default ``results/generate/<task>``.
        cache_dir, no_cache: the output cache's folder (default ``$VLLMEVAL_CACHE_DIR``, else
            ``~/.cache/vllm-eval``), or none at all.
        show_progress: progress bars. ``verbose``: vLLM's INFO logs and third-party warnings. ``started``: when
            the call started (``time.time()``); default now.
        **options: lm-eval's options for its tasks, under its names (:data:`LM_EVAL_KEYWORDS`: ``num_fewshot``,
            ``include_path``, ``apply_chat_template``, ``gen_kwargs`` ...; ``limit`` may be a fraction). Else backend
            options (``preset``, ``chat_template`` (a file or the Jinja text),
            ``chat_template_kwargs``, ``think_end_token``, ``system_prompt``, ``raw_prompts``, ``image_position``,
            ``device``, ``data_parallel_size``, ``endpoint`` ...) and vLLM ``EngineArgs`` (``dtype``,
            ``max_model_len``, ``seed`` ...; checked against vLLM's list).

    Returns:
        A :class:`GenerationResult`. A task with more unparsable answers than ``max_missing`` allows does not
        raise: it is in ``errors`` (its files are written), and the other tasks run.

    Raises:
        UsageError: a bad option or combination, no tasks, no model for a local backend, a scoring or task the
            backend cannot do (one line, before anything loads).
        OptionError: an unknown engine option (close names suggested).
        UnknownNameError: an unknown backend or task. ModelNotFoundError: a local model that does not exist.
        EngineError, EndpointError: a failure of the engine or a server while running.
    """
    check_model_argument(model)
    lm_options = {k: v for k in LM_EVAL_KEYWORDS if (v := options.pop(k, None)) is not None}
    names = None if tasks is None or data is not None else split_names(tasks)
    given = (temperature, top_p, top_k, max_tokens, sampling_seed)
    sampling = {name: v for name, v in zip(SAMPLING, given, strict=True) if v is not None}
    call = dict(backend=backend, limit=limit, output_dir=output_dir, verbose=verbose, started=started)
    if framework := _other_framework(model, names, call, lm_options, options, sampling, (cache_dir, no_cache)):
        return framework(show_progress)
    if names and not all(is_own_task(n) for n in names):
        return _lm_eval(model, names, call, lm_options, options, (cache_dir, no_cache), show_progress)  # lm-eval's
    if lm_options:
        raise UsageError(f"{', '.join(sorted(lm_options))}: lm-eval's options, for lm-eval's tasks only")
    _check_values(answer_format, scoring, limit, max_missing)
    with phase("imports"):  # mostly the backend's imports, then the option checks
        session = _prepare(backend, options, output_dir, verbose, started)
    with phase("tasks"):
        selected = generative_tasks(tasks, None if data is None else os.fspath(data))
    with phase("model"):
        model = None if model is None else os.fspath(model)
        require_model(model, session.spec.remote)
        resolved = resolve_model(model, session.spec.remote)
    _check_capabilities(backend, scoring, session.spec.cls, selected)
    outputs = task_output_dirs(session.output_dir, "generate", selected)
    how = dict(answer_format=answer_format, scoring=scoring, letters=letters, reasoning=reasoning)
    how.update(limit=limit, max_missing=max_missing)
    return _run(session, resolved, selected, outputs, sampling, (cache_dir, no_cache), show_progress, how)


def _other_framework(
    model: Any,
    names: list[str] | None,
    call: dict[str, Any],
    lm_options: dict[str, Any],
    options: dict[str, Any],
    sampling: dict[str, Any],
    cache_at: tuple[Any, bool],
) -> Any:
    """The call that runs eva's (``eva.<task>``) or lmms-eval's (``lmms.<task>``) tasks, given ``show_progress``;
    None for lm-eval's and this project's tasks."""
    if eva_tasks := _eva_tasks(names, options):
        return lambda progress: _eva(model, eva_tasks, call, (sampling, cache_at, progress), lm_options, options)
    if lmms := lmms_names(names):
        return lambda progress: _lmms(model, lmms, call, lm_options, options, cache_at, progress)
    return None


def _eva_tasks(names: list[str] | None, options: dict[str, Any]) -> list[Any]:
    """The eva tasks among ``names`` (with a None for each other name), or [] when there are none; eva's options
    (:data:`~vllm_eval.api.eva_tasks.EVA_OPTIONS`) are refused without them."""
    found = [find_eva_task(n) for n in names or ()]
    if not any(found):
        given = sorted(k for k in EVA_OPTIONS if options.get(k) is not None)
        if given:
            raise UsageError(f"{', '.join(given)}: options of eva's tasks (eva.PatchCamelyon ...) only")
        for k in EVA_OPTIONS:
            options.pop(k, None)
        return []
    return found


def _eva(model: Any, tasks: list[Any], call: dict, run: tuple, lm_options: dict, options: dict) -> Any:
    """eva's tasks (:func:`~vllm_eval.api.eva_tasks.run_eva`), in a call of their own."""
    if not all(tasks):
        raise UsageError("eva's tasks (eva.PatchCamelyon ...) run in a call of their own, without other tasks")
    if lm_options:
        raise UsageError(f"{', '.join(sorted(lm_options))}: lm-eval's options, for lm-eval's tasks only")
    call.update(prepare_session=_prepare, result_cls=GenerationResult, options=options)
    call.update(sampling=run[0], cache_at=run[1], show_progress=run[2])
    return run_eva(model, tasks, **call)


def _lmms(
    model: Any,
    names: list[str],
    call: dict[str, Any],
    lm_options: dict[str, Any],
    options: dict[str, Any],
    cache_at: tuple[Any, bool],
    show_progress: bool,
) -> GenerationResult:
    """lmms-eval's tasks (:mod:`~vllm_eval.api.lmms_tasks`): names and options checked before the model starts,
    then lmms-eval's evaluator on our engine, its files and ``summary.json``."""
    from . import lmms_tasks

    taken = {"include_path", "log_samples", *lmms_tasks.EVALUATE_OPTIONS}
    if other := sorted(k for k in lm_options if k not in taken):
        raise UsageError(f"{', '.join(other)}: lm-eval's options, not taken by lmms-eval's tasks")
    if call["backend"] != "vllm":
        raise UsageError(f"lmms-eval's tasks run on --backend vllm (our engine), not {call['backend']}")
    with phase("imports"):
        session = _prepare(call["backend"], options, call["output_dir"], call["verbose"], call["started"])
    with phase("tasks"):
        manager = lmms_tasks.prepare_tasks(names, lm_options.get("include_path"), call["verbose"])
    with phase("model"):
        model = None if model is None else os.fspath(model)
        require_model(model, session.spec.remote)
        resolved = resolve_model(model, session.spec.remote)
    cache = open_cache(*cache_at)
    try:
        ran = lmms_tasks.run(
            session,
            resolved,
            names,
            manager,
            cache=cache,
            limit=call["limit"],
            log_samples=lm_options.get("log_samples") is not False,
            evaluate={k: lm_options.get(k) for k in lmms_tasks.EVALUATE_OPTIONS},
            show_progress=show_progress,
        )
    finally:
        if cache is not None:
            cache.close()
    return _framework_result(session, ran, cache)


def _lm_eval(
    model: Any,
    names: list[str],
    call: dict[str, Any],
    lm_options: dict[str, Any],
    options: dict[str, Any],
    cache_at: tuple[Any, bool],
    show_progress: bool,
) -> GenerationResult:
    """lm-eval's tasks: every check before the model starts (names, data, unsafe code, chat template), then
    lm-eval's evaluator on our engine (or lm-eval's HFLM), its files and ``summary.json``."""
    from ..tasks.lmeval import prepare_tasks
    from . import lm_eval_tasks

    evaluate = {k: lm_options[k] for k in EVALUATE_OPTIONS if lm_options.get(k) is not None}
    model_options = {k: lm_options[k] for k in MODEL_OPTIONS if k in lm_options}
    lm_eval_tasks.check_lm_eval_call(call["backend"], call["limit"], evaluate)
    with phase("imports"):
        session = _prepare(call["backend"], options, call["output_dir"], call["verbose"], call["started"])
    names = [LM_EVAL_ALIASES.get(n.lower(), n) for n in names]
    with phase("tasks"):
        prepared = prepare_tasks(
            names, lm_options.get("include_path"), confirm_run_unsafe_code=bool(evaluate.get("confirm_run_unsafe_code"))
        )
    with phase("model"):
        model = None if model is None else os.fspath(model)
        require_model(model, session.spec.remote)
        resolved = resolve_model(model, session.spec.remote)
        if not session.spec.remote:  # a served model's tokenizer is loaded (and checked) with the model
            path = str(getattr(resolved, "path", resolved))
            lm_eval_tasks.chat_template_needed(path, evaluate.get("apply_chat_template"))
            lm_eval_tasks.images_supported(path, prepared)
    cache = open_cache(*cache_at)
    try:
        ran = lm_eval_tasks.run(
            session,
            resolved,
            prepared,
            cache=cache,
            limit=call["limit"],
            log_samples=lm_options.get("log_samples") is not False,
            evaluate=evaluate,
            model_options=model_options,
            show_progress=show_progress,
        )
    finally:
        if cache is not None:
            cache.close()
    return _framework_result(session, ran, cache)


def _framework_result(session: Session, ran: dict[str, Any], cache: Any) -> GenerationResult:
    """The :class:`GenerationResult` of lm-eval's or lmms-eval's run (``ran``: its ``run``'s dict)."""
    results = {name: dict(metrics) for name, metrics in ran["results"].get("results", {}).items()}
    folder = ran["results_path"].parent if ran["results_path"] is not None else None
    return GenerationResult(
        results=results,
        model_name=ran["model_name"],
        backend=session.spec.name,
        output_dirs={name: folder for name in results} if folder is not None else {},
        cache=cache,
        lm_eval=ran,
    )


def _prepare(backend: str, options: dict[str, Any], output_dir: Any, verbose: bool, started: float | None) -> Session:
    """The shared checks (:func:`~vllm_eval.api.session.prepare`) of a generator call's options."""
    # Read before the backend checks, as the command always did: a template that is neither a file nor Jinja text
    # is named before a backend that takes none.
    options = {**options, "chat_template": chat_template(options.get("chat_template"))}
    backend_options, engine = split_options(options, BACKEND_OPTIONS)
    return prepare(
        "generator",
        [backend],
        backend_options,
        engine,
        output_dir=None if output_dir is None else os.fspath(output_dir),
        verbose=verbose,
        http_batch_size=1,  # one chat request per prompt
        started=started,
    )


def _run(
    session: Session,
    model: Any,
    tasks: list[Any],
    outputs: list[str],
    sampling: dict[str, Any],
    cache_at: tuple[Any, bool],
    show_progress: bool,
    how: dict[str, Any],
) -> GenerationResult:
    """Start the backend once, run every task; the engine is shut down and the cache closed on return."""
    from ..tasks.generative import run_multiple_choice
    from ..utils.errors import MissingAnswersError

    internal: dict[str, Any] = {
        "sampling": sampling,
        "show_progress_bar": show_progress,
        "max_images_per_prompt": 1 if any(t.modality == "image" for t in tasks) else None,
    }
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    cache = open_cache(*cache_at)
    try:
        with session.spec.load(model, **internal) as generator:
            generator.use_cache(cache)
            for task, out in zip(tasks, outputs, strict=True):
                try:
                    results[task.name] = run_multiple_choice(generator, task, output_dir=out, **how)
                except MissingAnswersError as exc:  # the files are written; the other tasks still run
                    errors[task.name] = str(exc)
                    results[task.name] = json.loads((Path(out) / "results.json").read_text())
            name = generator.model
    finally:
        if cache is not None:
            cache.close()
    return GenerationResult(
        results=results,
        model_name=name,
        backend=session.spec.name,
        output_dirs={t.name: Path(out) for t, out in zip(tasks, outputs, strict=True)},
        errors=errors,
        cache=cache,
    )


def generative_tasks(names: list[str] | str | None, data: str | None) -> list[Any]:
    """``generate``'s tasks: ``data`` as a multiple-choice task, else by name (required).

    Raises:
        UsageError: both or neither given; an unknown name; a hub task offline and not cached.
    """
    from ..tasks.registry import load_file, load_task

    if data:
        if names:
            raise UsageError("give --data FILE or --tasks, not both")
        return [load_file("generate", data)]
    if names is None:
        raise UsageError(
            "--tasks is required: lm-eval's tasks (mmlu, gsm8k ...), PangLeePolarity, Digits (`vllm-eval tasks`), "
            "or --data FILE"
        )
    return [load_task("generate", name) for name in split_names(names)]


def _check_values(answer_format: str, scoring: str, limit: int | None, max_missing: float) -> None:
    """The values the command's parser checks, checked for a call from Python too (before anything loads)."""
    if answer_format not in ANSWER_FORMATS:
        raise UsageError(f"--answer-format must be one of {', '.join(ANSWER_FORMATS)}, not {answer_format!r}")
    if scoring not in SCORINGS:
        raise UsageError(f"--scoring must be one of {', '.join(SCORINGS)}, not {scoring!r}")
    if limit is not None and limit < 1:
        raise UsageError(f"--limit: must be a positive integer, got {limit!r}")
    if max_missing < 0:
        raise UsageError(f"--max-missing: must be a number >= 0, got {max_missing!r}")


def _check_capabilities(backend: str, scoring: str, cls: type, tasks: list[Any]) -> None:
    """Refuse scoring and tasks the chosen generator backend cannot honour."""
    if scoring == "loglikelihood" and not cls.supports_loglikelihood:
        raise UsageError(
            f"--scoring loglikelihood needs exact prompt log-probabilities, which --backend "
            f"{backend} cannot give; use --scoring generate"
        )
    if not cls.supports_images:
        images = [t.name for t in tasks if t.modality != "text"]
        if images:
            raise UsageError(f"--backend {backend} is text-only; {', '.join(images)} shows images")
