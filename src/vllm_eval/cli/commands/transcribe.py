"""``vllm-eval transcribe``: a speech-to-text model on recordings with reference texts (the offline suite or yours)."""

from __future__ import annotations

import argparse

from ..base import Command, Context
from ..options import (
    add_backend,
    add_common,
    add_engine_flags,
    add_model,
    add_remote_flags,
    add_scale_flags,
    add_tasks,
    positive_int,
)
from ..tables import sweep_exit


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f} %"


class TranscribeCommand(Command):
    name = "transcribe"
    help = "evaluate a speech-to-text model (Whisper ...) on recordings: WER, CER, RTFx; BLEU/chrF for translation"
    description = (
        "Transcribe recordings (the offline suite AsteriskPrompts.<lang>, unpacked by `make speech-data`, or your own "
        "--data: a .jsonl/.csv/.parquet with audio and text fields, or a folder of audio files with a .txt "
        "transcript each) and report WER and CER on the Open ASR Leaderboard's normalisers (--normalizer; named in "
        "the results), the raw WER, substitutions/deletions/insertions and RTFx. Writes results.json and "
        "samples.jsonl (the Open ASR Leaderboard's manifest fields audio_filepath, duration, text, pred_text)."
    )
    kind = "transcriber"
    backend_options = ("server_decoding", "batch_size", "max_tokens")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_model(parser, many=True)
        add_backend(parser, (self.kind,))
        add_tasks(parser, "offline suite: AsteriskPrompts.en (default), .es, .fr, .it, .ru")
        parser.add_argument(
            "--data",
            default=None,
            help="your recordings: .jsonl/.csv/.parquet with audio, text [language], or a folder",
        )
        parser.add_argument(
            "--task", default="transcribe", choices=("transcribe", "translate"), help="for --data (default transcribe)"
        )
        parser.add_argument("--limit", type=positive_int, default=None, help="first N recordings of each task only")
        parser.add_argument(
            "--server-decoding",
            action="store_true",
            default=None,
            help="vllm backend: decode exactly as vLLM's /v1/audio/transcriptions does (without Whisper's token "
            "suppression; language and task tokens for English-only models too)",
        )
        parser.add_argument(
            "--batch-size", type=positive_int, default=None, help="hf backend: audios per generate call (default 16)"
        )
        parser.add_argument(
            "--max-tokens",
            type=positive_int,
            default=None,
            help="at most N tokens decoded per recording (per 30 s piece; remote: max_completion_tokens); default: the "
            "model's",
        )
        parser.add_argument(
            "--warmup",
            type=positive_int,
            default=0,
            help="transcribe the first N recordings once, untimed, before the timed pass (the Open ASR "
            "Leaderboard's warm-up; RTFx then leaves out first-call costs)",
        )
        parser.add_argument(
            "--normalizer",
            default="leaderboard",
            help="the texts' normalisers before WER/CER: leaderboard (default: the Open ASR Leaderboard's, English "
            "and multilingual), openai (OpenAI's Whisper originals) or basic (OpenAI's basic one for all languages)",
        )
        add_common(parser, "default: results/transcribe/<task>")
        add_remote_flags(parser, "/v1/audio/transcriptions")
        add_scale_flags(parser)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.transcribe import transcribe

        result = self.call(transcribe, args, ctx)
        if (code := sweep_exit(result)) is not None:
            return code
        for res in result.results:
            m = res["metrics"]
            extra = f"  BLEU {m['bleu']:.2f}  chrF {m['chrf']:.2f}" if "bleu" in m else ""
            print(
                f"{res['task']} ({result.model_name}, {result.backend}): WER {_percent(m['wer'])}  "
                f"CER {_percent(m['cer'])}  raw WER {_percent(m['wer_raw'])}{extra}  n {m['n_scored']}/"
                f"{m['n_samples']}  {m['audio_seconds']:.0f} s of audio in {m['transcribe_seconds']:.1f} s "
                f"(RTFx {m['rtfx']})"
            )
            print(f"results: {res['output_dir']}/results.json, {res['output_dir']}/samples.jsonl")
        return 0
