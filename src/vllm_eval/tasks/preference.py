"""Reward-model evaluation on preference pairs: does the model score the chosen response higher?

Data is :class:`PreferencePairs` (prompt, chosen, rejected, optional subset): your own file
(``--data FILE``, schema ``preference``, see :mod:`vllm_eval.tasks.owndata`) or RewardBench
(``allenai/reward-bench``, split ``filtered``, from the hub or its local cache). Each (prompt,
response) is rendered as a user turn and an assistant turn through the model's chat template, and
scored by a classifier backend with ``use_activation=False`` (the reward is the model's one logit).

Metrics as RewardBench defines them (Lambert et al. 2024, arXiv:2403.13787; ``scripts/run_rm.py``
of allenai/reward-bench): a pair is won when ``reward(chosen) > reward(rejected)`` strictly (a tie
is a loss); accuracy is the share of pairs won, overall and per subset. RewardBench's section
scores (Chat, Chat Hard, Safety, Reasoning: weighted means of subsets) are not computed here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import UnknownNameError, UsageError

#: RewardBench on the hub: dataset id and the split its leaderboard scores.
REWARD_BENCH = ("allenai/reward-bench", "filtered")


@dataclass(frozen=True)
class PreferencePairs:
    """Prompts, each with a chosen (preferred) and a rejected response, and an optional subset name."""

    name: str
    prompts: list[str]
    chosen: list[str]
    rejected: list[str]
    subsets: list[str] | None
    source: str


def load_preference_file(path: str | Path) -> PreferencePairs:
    """A ``preference`` data file (``prompt``, ``chosen``, ``rejected``, optional ``subset``).

    Raises:
        DataUnavailableError: no such file.
        UsageError: a row that breaks the schema (file, line and field named).
    """
    from .owndata import read_rows

    rows = read_rows(path, "preference")
    subsets = [r.get("subset") for r in rows]
    return PreferencePairs(
        Path(path).stem,
        [r["prompt"] for r in rows],
        [r["chosen"] for r in rows],
        [r["rejected"] for r in rows],
        [s or "default" for s in subsets] if any(subsets) else None,
        str(path),
    )


def load_reward_bench() -> PreferencePairs:
    """RewardBench's ``filtered`` split (2,985 pairs in 23 subsets) through ``datasets``.

    Raises:
        DataUnavailableError: the hub is offline and the dataset is not in the local cache.
    """
    from ..utils.hub import require_dataset

    path, split = REWARD_BENCH
    require_dataset(path, "RewardBench", "pass your own pairs with --data FILE")
    import datasets

    table = datasets.load_dataset(path, split=split)
    return PreferencePairs(
        "RewardBench",
        list(table["prompt"]),
        list(table["chosen"]),
        list(table["rejected"]),
        list(table["subset"]),
        f"{path} ({split})",
    )


PREFERENCE_TASKS = {"RewardBench": load_reward_bench}


def get_preference_data(name: str) -> PreferencePairs:
    """The preference task called ``name`` (case-insensitive).

    Raises:
        UnknownNameError: an unknown name (the known ones listed).
        DataUnavailableError: its data cannot be had offline.
    """
    for key, load in PREFERENCE_TASKS.items():
        if key.lower() == name.lower():
            return load()
    raise UnknownNameError(f"unknown preference task {name!r}; known: {', '.join(PREFERENCE_TASKS)}")


def render_conversations(
    tokenizer: Any, prompts: list[str], responses: list[str], chat_template: str | None = None
) -> list[str]:
    """Each (prompt, response) as the text of a user turn and an assistant turn in the chat template.

    Raises:
        UsageError: the tokenizer has no chat template and none is given.
    """
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise UsageError(
            "the model's tokenizer has no chat template; pass one with --chat-template (a file or the Jinja text)"
        )
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}, {"role": "assistant", "content": r}],
            chat_template=template,
            tokenize=False,
        )
        for p, r in zip(prompts, responses, strict=True)
    ]


def pairwise_metrics(chosen: np.ndarray, rejected: np.ndarray, subsets: list[str] | None = None) -> dict[str, Any]:
    """RewardBench's pairwise accuracy and the reward margins.

    Args:
        chosen, rejected: float (n,) rewards of each pair's chosen and rejected response.
        subsets: the subset of each pair, for per-subset accuracy (None: no breakdown).

    Returns:
        ``accuracy`` (share of pairs with chosen > rejected; ties lose), ``ties``, ``n_pairs``,
        ``margin_mean`` and ``margin_median`` (chosen - rejected), ``chosen_mean``,
        ``rejected_mean``, and ``per_subset`` {name: {accuracy, n_pairs, margin_mean}} with subsets.
    """
    chosen = np.asarray(chosen, dtype=np.float64)
    rejected = np.asarray(rejected, dtype=np.float64)
    won = chosen > rejected
    margin = chosen - rejected
    out: dict[str, Any] = {
        "accuracy": float(won.mean()) if len(won) else 0.0,
        "ties": int((chosen == rejected).sum()),
        "n_pairs": len(won),
        "margin_mean": float(margin.mean()) if len(won) else 0.0,
        "margin_median": float(np.median(margin)) if len(won) else 0.0,
        "chosen_mean": float(chosen.mean()) if len(won) else 0.0,
        "rejected_mean": float(rejected.mean()) if len(won) else 0.0,
    }
    if subsets is not None:
        names = np.asarray(subsets)
        out["per_subset"] = {
            str(s): {
                "accuracy": float(won[names == s].mean()),
                "n_pairs": int((names == s).sum()),
                "margin_mean": float(margin[names == s].mean()),
            }
            for s in sorted(set(subsets))
        }
    return out


def run_reward(
    classifier: Any,
    task: PreferencePairs,
    *,
    limit: int | None = None,
    output_dir: str | Path | None = None,
    chat_template: str | None = None,
) -> dict[str, Any]:
    """Score ``task``'s pairs with a one-output classifier backend built with ``use_activation=False``.

    Both responses of all pairs go to the backend in one call (distinct conversations computed
    once, cached like any classifier output).

    Returns:
        The results dict (``task``, ``metrics`` from :func:`pairwise_metrics`, ``model``, ``seconds``
        ...), also written to ``output_dir/results.json`` with one line per pair in
        ``samples.jsonl`` (id, prompt, reward_chosen, reward_rejected, margin, correct, subset).

    Raises:
        UsageError: a backend with activation on, a model with more than one output, or no chat template.
    """
    from ..evaluation.results import task_record, write_task_results

    if classifier.use_activation:
        raise UsageError("reward scoring reads the model's raw score: build the backend with use_activation=False")
    if classifier.tokenizer is None:
        raise UsageError("reward scoring renders the chat template here and needs the model's tokenizer")
    n = len(task.prompts) if limit is None else min(limit, len(task.prompts))
    prompts, chosen, rejected = task.prompts[:n], task.chosen[:n], task.rejected[:n]
    tokenizer = classifier.tokenizer.tokenizer
    texts = render_conversations(tokenizer, prompts + prompts, chosen + rejected, chat_template)
    start, before = time.perf_counter(), classifier.counters.copy()
    scores = classifier.classify(texts[:1], show_progress_bar=False)  # a two-label model fails here, cheaply
    if scores.shape[1] != 1:
        raise UsageError(
            f"{classifier.name} gives {scores.shape[1]} scores per text; a reward model gives one "
            "(evaluate a classifier with `vllm-eval classify`)"
        )
    scores = classifier.classify(texts)[:, 0]
    seconds = time.perf_counter() - start
    subsets = task.subsets[:n] if task.subsets else None
    metrics = pairwise_metrics(scores[:n], scores[n:], subsets)
    samples = [
        {
            "id": i,
            "prompt": prompts[i],
            "reward_chosen": float(scores[i]),
            "reward_rejected": float(scores[n + i]),
            "margin": float(scores[i] - scores[n + i]),
            "correct": bool(scores[i] > scores[n + i]),
            **({"subset": subsets[i]} if subsets else {}),
        }
        for i in range(n)
    ]
    config = {"limit": limit, "chat_template": "custom" if chat_template else "model's", "tie": "loss"}
    results = task_record(classifier, task, metrics, before, seconds, config)
    if output_dir:
        write_task_results(output_dir, results, samples)
    results["samples"] = samples
    return results
