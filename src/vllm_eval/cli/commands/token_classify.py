"""``vllm-eval token-classify``: a token classifier (e.g. NER) on tagged sentences."""

from __future__ import annotations

import argparse

from ..base import Command, Context
from ..options import (
    add_backend,
    add_cache_flags,
    add_common,
    add_engine_flags,
    add_model,
    add_remote_flags,
    add_scale_flags,
    positive_int,
)
from ..tables import report_cache, sweep_exit


class TokenClassifyCommand(Command):
    name = "token-classify"
    help = "evaluate a token classifier (*ForTokenClassification, e.g. NER) on tagged sentences"
    description = (
        "Tag the words of your sentences (--data FILE: CoNLL, or .jsonl/.csv/.parquet with tokens and tags) "
        "with vLLM's token_classify task (each word takes its first sub-token's label) and report seqeval's "
        "entity-level precision/recall/F1 (conlleval and strict IOB2) and token accuracy. Writes results.json and "
        "samples.jsonl."
    )
    kind = "token_classifier"
    backend_options = ("tokenizer",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_model(parser, many=True)
        add_backend(parser, (self.kind,))
        parser.add_argument(
            "--tokenizer",
            default=None,
            help="served models: directory or hub id with the model's tokenizer and labels (default: the served name)",
        )
        parser.add_argument(
            "--data", required=True, help="CoNLL file (.conll/.txt) or .jsonl/.csv/.parquet with tokens, tags"
        )
        parser.add_argument("--limit", type=positive_int, default=None, help="first N sentences only")
        add_common(parser, "default: results/token-classify/<data file name>")
        add_cache_flags(parser)
        add_remote_flags(parser, "/pooling")
        add_scale_flags(parser)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.classify import token_classify

        result = self.call(token_classify, args, ctx)
        if (code := sweep_exit(result)) is not None:
            return code
        [res] = result.results
        m = res["metrics"]
        print(
            f"{res['task']} ({result.model_name}, {result.backend}): entity F1 {m['f1']:.4f} "
            f"(strict IOB2 {m['f1_strict_iob2']:.4f})  "
            f"precision {m['precision']:.4f}  recall {m['recall']:.4f}  token accuracy {m['token_accuracy']:.4f}  "
            f"n {m['n_sentences']}  {res['seconds']:.1f} s"
        )
        print(f"results: {res['output_dir']}/results.json, {res['output_dir']}/samples.jsonl")
        report_cache(result.cache)
        return 0
