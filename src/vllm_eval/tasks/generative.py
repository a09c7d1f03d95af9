"""Offline generative tasks (multiple choice) and their runner.

* ``PangLeePolarity`` (text): is a movie-review sentence positive or negative? 200 real sentences
  from gensim's ``pang_lee_polarity.cor``.
* ``Digits`` (vision): which digit is shown? scikit-learn's ``load_digits`` — 1,797 real 8×8
  handwritten digits (UCI Optical Recognition of Handwritten Digits), upscaled to 64×64 — the
  offline analogue of eva's PatchCamelyon yes/no task.

:func:`run_multiple_choice` runs a task through any generator backend
(:class:`~vllm_eval.models.generator.base.GeneratorBase`)
either by generating and parsing answers, or by log-likelihood of each option (lm-evaluation-harness
style, no parsing), and writes ``results.json`` and ``samples.jsonl``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..utils.errors import UnknownNameError, UsageError
from . import data
from .multiple_choice import (
    LETTERS,
    AnswerFormat,
    MCItem,
    MissingAnswersError,
    build_prompt,
    extract_answer,
    mc_metrics,
    split_reasoning,
)


@dataclass(frozen=True)
class GenerativeTask:
    """A multiple-choice task: metadata plus a loader of :class:`MCItem`s."""

    name: str
    description: str
    reference: str
    modality: Literal["text", "image"]
    letters: bool
    load: Callable[[], list[MCItem]]


def _pang_lee_items() -> list[MCItem]:
    items = []
    for i, (text, label) in enumerate(data.pang_lee_polarity()):
        question = f'Is the sentiment of this movie review sentence positive or negative?\n\nSentence: "{text}"'
        items.append(
            MCItem(
                id=f"pang-lee-{i}",
                question=question,
                options=("negative", "positive"),
                target=0 if label == "neg" else 1,
            )
        )
    return items


@lru_cache(maxsize=1)
def _digit_images(scale: int = 8) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    # 0-16 grey levels, ink high: upscale by pixel repetition and draw dark ink on white.
    imgs = (255 - digits.images / 16.0 * 255).round().astype(np.uint8)
    imgs = np.repeat(np.repeat(imgs, scale, axis=1), scale, axis=2)
    return imgs, digits.target.astype(int)


def _digit_items() -> list[MCItem]:
    imgs, targets = _digit_images()
    question = "Which digit (0-9) is handwritten in the image?"
    options = tuple(str(d) for d in range(10))
    return [
        MCItem(id=f"digits-{i}", question=question, options=options, target=int(t), images=(imgs[i],))
        for i, t in enumerate(targets)
    ]


GENERATIVE_TASKS: dict[str, GenerativeTask] = {
    "PangLeePolarity": GenerativeTask(
        name="PangLeePolarity",
        description="200 movie-review sentences (Pang & Lee 2005), positive or negative",
        reference="https://www.cs.cornell.edu/people/pabo/movie-review-data/",
        modality="text",
        letters=False,
        load=_pang_lee_items,
    ),
    "Digits": GenerativeTask(
        name="Digits",
        description="1,797 real 8x8 handwritten digits (scikit-learn load_digits), upscaled to 64x64; which digit?",
        reference="https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits",
        modality="image",
        letters=False,
        load=_digit_items,
    ),
}


#: Names this command knew before lm-eval's tasks ran here, and lm-eval's task for each (one way to run a benchmark).
LM_EVAL_ALIASES = {"mmlu": "mmlu", "arc-challenge": "arc_challenge", "arc-easy": "arc_easy"}


def get_generative_task(name: str) -> GenerativeTask:
    """The offline generative task called ``name`` (case-insensitive).

    Raises:
        UnknownNameError: unknown task (the message lists the known ones).
    """
    for key, task in GENERATIVE_TASKS.items():
        if key.lower() == name.lower():
            return task
    raise UnknownNameError(f"unknown generative task {name!r}; known: {', '.join(GENERATIVE_TASKS)}")


def is_own_task(name: str) -> bool:
    """Whether ``name`` is one of this project's offline generative tasks (else it is lm-eval's)."""
    return name.lower() in {k.lower() for k in GENERATIVE_TASKS}


def _resolve_answer(answer: str | int, options: list[str], where: str) -> int:
    if isinstance(answer, int):
        if 0 <= answer < len(options):
            return answer
        raise UsageError(f"{where}: field 'answer' {answer} is not an option index (0..{len(options) - 1})")
    lowered = [o.strip().lower() for o in options]
    if answer.strip().lower() in lowered:
        return lowered.index(answer.strip().lower())
    letter = answer.strip().strip("().").upper()
    if len(letter) == 1 and letter in LETTERS[: len(options)]:
        return LETTERS.index(letter)
    raise UsageError(f"{where}: field 'answer' {answer!r} is neither an option, its letter nor its index")


def load_multiple_choice_file(path: str | Path) -> GenerativeTask:
    """A ``multiple_choice`` data file (see :mod:`vllm_eval.tasks.owndata`) as a :class:`GenerativeTask`.

    ``answer`` may be the option's text, its letter (``B``) or its 0-based index; ``image`` is a path
    relative to the data file (read with Pillow when the task runs). Options are named by letter.

    Raises:
        DataUnavailableError: no such file.
        UsageError: a row that breaks the schema, an answer that names no option, or an image file that is
            missing or not an image (file, line and field named).
    """
    from .owndata import check_str_list, load_image, read_rows, where

    path = Path(path)
    rows = read_rows(path, "multiple_choice")
    check_str_list(path, rows, "options", min_len=2)
    items: list[tuple[str, tuple[str, ...], int, str | None]] = []
    for i, r in enumerate(rows):
        target = _resolve_answer(r["answer"], r["options"], where(path, i))
        if r.get("image"):
            load_image(path, i, r["image"])  # decoded now, so a damaged image is named before any model loads
        items.append((r["question"], tuple(r["options"]), target, r.get("image")))

    def load() -> list[MCItem]:
        return [
            MCItem(
                id=f"{path.stem}-{i}",
                question=q,
                options=opts,
                target=t,
                images=(load_image(path, i, img),) if img else (),
            )
            for i, (q, opts, t, img) in enumerate(items)
        ]

    return GenerativeTask(
        name=path.stem,
        description=f"multiple-choice questions from {path.name}",
        reference=str(path),
        modality="image" if any(img for *_, img in items) else "text",
        letters=True,
        load=load,
    )


def _budget(max_missing: float, n: int) -> int:
    if max_missing < 0:
        raise UsageError(f"max_missing must be >= 0, got {max_missing}")
    return int(max_missing * n) if max_missing <= 1 else int(max_missing)


def run_multiple_choice(
    generator: Any,
    task: GenerativeTask,
    *,
    answer_format: AnswerFormat = "json",
    scoring: Literal["generate", "loglikelihood"] = "generate",
    letters: bool | None = None,
    reasoning: bool = False,
    limit: int | None = None,
    max_missing: float = 0.1,
    output_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate ``generator`` on a multiple-choice ``task``.

    Args:
        answer_format: how the answer is asked for and parsed (``scoring="generate"`` only).
        scoring: ``generate`` (sample, parse) or ``loglikelihood`` (argmax over options of
            the summed log-probability of the option's tokens, images shown as in generation).
        letters: name options by letter (default: the task's choice).
        reasoning: ask for brief reasoning before the answer (in the prompt; a reasoning model's
            own reasoning is split off by the generator's ``think_end_token``, and counted in
            ``metrics["reasoning_unfinished"]`` when the model never closed it).
        limit: evaluate the first ``limit`` samples only.
        max_missing: budget of unparsable answers: a fraction of the samples when ≤ 1, a count
            when > 1. Exceeding it raises after the results are written.
        output_dir: where ``results.json`` and ``samples.jsonl`` go.

    Returns:
        The results dict (also written to ``results.json``).

    Raises:
        MissingAnswersError: more missing answers than the budget (files already written).
        UsageError: an image task for a text-only generator, an unknown format or scoring.
    """
    from ..evaluation.results import package_versions, write_task_results

    if scoring not in ("generate", "loglikelihood"):
        raise UsageError(f"scoring must be 'generate' or 'loglikelihood', got {scoring!r}")
    if task.modality != "text" and not generator.supports_images:
        raise UsageError(f"{type(generator).__name__} is text-only; {task.name} shows images")
    letters = task.letters if letters is None else letters
    think = generator.think_end_token
    items = task.load()[: limit if limit else None]
    budget = _budget(max_missing, len(items))
    start = time.perf_counter()
    unfinished = 0
    if scoring == "generate":
        preds, samples = _by_generation(generator, items, answer_format, letters, reasoning)
        unfinished = sum(s.get("reasoning_finished") is False for s in samples)
    else:
        preds, samples = _by_loglikelihood(generator, items, letters)
    n_options = max(len(it.options) for it in items) if items else 0
    metrics = mc_metrics([it.target for it in items], preds, n_options)
    if think and scoring == "generate":
        metrics["reasoning_unfinished"] = float(unfinished)
    results = {
        "task": task.name,
        "metrics": metrics,
        "config": {
            "answer_format": answer_format if scoring == "generate" else None,
            "scoring": scoring,
            "letters": letters,
            "reasoning": reasoning,
            "think_end_token": think,
            "chat_template_kwargs": (
                generator.scoring_template_kwargs() if scoring == "loglikelihood" else generator.chat_template_kwargs
            )
            or None,
            "limit": limit,
            "max_missing": max_missing,
            "missing_budget": budget,
            "sampling": {**_sampling_dict(generator)},
        },
        "model": generator.model,
        "engine_kwargs": getattr(generator, "engine_kwargs", None),
        "seed": getattr(generator.sampling, "seed", None),
        "versions": package_versions(),
        "seconds": round(time.perf_counter() - start, 2),
    }
    if output_dir:
        write_task_results(output_dir, results, samples)
    missing = int(metrics["missing"])
    if missing > budget:
        where = f"; results and samples are in {output_dir}" if output_dir else ""
        cut = (
            f"; {unfinished} stopped inside their reasoning (no {think!r} within max_tokens "
            f"{generator.sampling.max_tokens}: raise --max-tokens)"
            if unfinished
            else ""
        )
        raise MissingAnswersError(
            f"{missing} of {len(items)} outputs had no parsable {answer_format} answer, over the "
            f"budget of {budget} (max_missing={max_missing}){cut}{where}"
        )
    results["samples"] = samples
    return results


def _by_generation(
    generator: Any, items: list[MCItem], answer_format: AnswerFormat, letters: bool, reasoning: bool
) -> tuple[list[int | None], list[dict[str, Any]]]:
    """Generate, split off reasoning, parse: (predicted option or None per item, sample records)."""
    think = generator.think_end_token
    prompts = [build_prompt(it, answer_format, letters=letters, reasoning=reasoning) for it in items]
    gens = generator.generate(((p, it.images) for p, it in zip(prompts, items)), total=len(items))
    preds, samples = [], []
    for it, g in zip(items, gens):
        thought, answer = split_reasoning(g.output, think, g.prompt)
        p = None if answer is None else extract_answer(answer, answer_format, it.options, letters=letters)
        sample = {
            "id": it.id,
            "prompt": g.prompt,
            "output": g.output,
            "parsed": None if p is None else it.options[p],
            "target": it.options[it.target],
            "correct": p == it.target,
        }
        if think:
            sample.update(reasoning=thought, reasoning_finished=answer is not None)
        preds.append(p)
        samples.append(sample)
    return preds, samples


def _by_loglikelihood(
    generator: Any, items: list[MCItem], letters: bool
) -> tuple[list[int | None], list[dict[str, Any]]]:
    """Score every option by log-likelihood: (argmax option per item, sample records)."""
    contexts, conts, owners, shown = [], [], [], []
    for k, it in enumerate(items):
        ctx = build_prompt(it, "raw", letters=letters)
        for i, opt in enumerate(it.options):
            contexts.append(ctx)
            conts.append(LETTERS[i] if letters else opt)
            owners.append(k)
            shown.append(it.images)  # the same objects for every option: one request per question
    scores = generator.loglikelihoods(contexts, conts, shown if any(shown) else None)
    per_item: list[list[float]] = [[] for _ in items]
    for k, s in zip(owners, scores):
        per_item[k].append(float(s))
    preds: list[int | None] = [int(np.argmax(s)) for s in per_item]
    samples = [
        {
            "id": it.id,
            "prompt": generator.render_for_scoring(build_prompt(it, "raw", letters=letters), it.images),
            "output": {"loglikelihoods": dict(zip(it.options, s))},
            "parsed": it.options[p],
            "target": it.options[it.target],
            "correct": p == it.target,
        }
        for it, s, p in zip(items, per_item, preds)
    ]
    return preds, samples


def _sampling_dict(generator: Any) -> dict[str, Any]:
    sp = generator.sampling
    return {k: getattr(sp, k) for k in ("temperature", "top_p", "top_k", "max_tokens", "seed") if hasattr(sp, k)}
