"""``vllm-eval reward``: a reward model on preference pairs (RewardBench's pairwise accuracy)."""

from __future__ import annotations

import argparse

from ..base import Command, Context
from ..options import (
    SWEEP_HELP,
    OneOrMany,
    add_backend,
    add_cache_flags,
    add_common,
    add_engine_flags,
    add_scale_flags,
    add_tasks,
    positive_int,
)
from ..tables import report_cache, sweep_exit


class RewardCommand(Command):
    name = "reward"
    help = "evaluate a reward model on preference pairs (prompt, chosen, rejected)"
    description = (
        "Score each pair's chosen and rejected response (rendered as a user and an assistant turn "
        "through the model's chat template) with a reward model: *ForSequenceClassification with one label through "
        "vLLM's classify task, or a per-token reward head (e.g. Qwen2ForRewardModel) through token_classify, read at "
        "the last token. Reports RewardBench's pairwise accuracy (chosen > rejected; ties lose), per subset, and the "
        "reward margins. Writes results.json and samples.jsonl."
    )
    kind = "classifier"
    backend_options = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from ...models.backends import SERVED_BACKENDS

        parser.add_argument(
            "--model", required=True, nargs="+", action=OneOrMany, help="model directory or hub id" + SWEEP_HELP
        )
        # The chat template is rendered here, so a served model cannot take the pairs.
        add_backend(parser, (self.kind,), exclude=tuple(SERVED_BACKENDS))
        add_tasks(parser, "RewardBench (allenai/reward-bench, needs the hub or its cache), unless --data is given")
        parser.add_argument(
            "--data", default=None, help="your own pairs: .jsonl, .csv or .parquet with prompt, chosen, rejected"
        )
        parser.add_argument("--limit", type=positive_int, default=None, help="first N pairs only")
        parser.add_argument("--chat-template", default=None, help="chat template: a file, or the Jinja text itself")
        add_common(parser, "default: results/reward/<task>")
        add_cache_flags(parser)
        add_scale_flags(parser)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.classify import reward

        result = self.call(reward, args, ctx)
        if (code := sweep_exit(result)) is not None:
            return code
        for res in result.results:
            m = res["metrics"]
            print(
                f"{res['task']} ({result.model_name}, {result.backend}): accuracy {m['accuracy']:.4f}  "
                f"margin mean {m['margin_mean']:.4f}  ties {m['ties']}  n {m['n_pairs']}  {res['seconds']:.1f} s"
            )
            for name, sub in (m.get("per_subset") or {}).items():
                print(f"  {name}: accuracy {sub['accuracy']:.4f}  n {sub['n_pairs']}")
            print(f"results: {res['output_dir']}/results.json, {res['output_dir']}/samples.jsonl")
        report_cache(result.cache)
        return 0
