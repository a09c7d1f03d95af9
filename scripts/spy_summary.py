"""Summarize py-spy's raw output (``py-spy record -f raw --subprocesses``): samples per process, and the functions
most often on the stack (inclusive counts) of the samples that pass through ``--focus``.

    python3 scripts/spy_summary.py docs/bench/h100-profile/spy-bench-r4.txt.gz --focus embed_job --top 40
    python3 scripts/spy_summary.py docs/bench/h100x4-scaling/bert-4gpu-rec-parent.txt.gz --process "cli run" --top 30

With ``record --threads``, samples per thread name are printed too (numbered pool threads counted as one name).

A sample is one stack of one running thread (py-spy leaves idle threads out); at ``-r 25`` each is 40 ms.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--focus", default="", help="only samples with a frame containing this; frames below it")
    parser.add_argument("--process", default="", help="only processes whose py-spy label contains this")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()

    per_process: collections.Counter[str] = collections.Counter()
    per_thread: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    focused = 0
    opener = gzip.open if args.path.endswith(".gz") else open
    with opener(args.path, "rt") as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            n = int(count)
            frames = stack.split(";")
            labels = [f for f in frames if f.startswith("process ")]
            process = labels[-1][:70] if labels else "?"
            if args.process and args.process not in process:
                continue
            per_process[process] += n
            thread = next((f for f in frames if f.startswith("thread ")), "")
            if thread:
                per_thread[re.sub(r"_\d+$", "", re.sub(r"^thread \(\d+\): ", "", thread))] += n
            # Line numbers dropped: one function, one row.
            calls = [re.sub(r":\d+\)$", ")", f) for f in frames if not f.startswith(("process ", "thread "))]
            at = next((i for i, f in enumerate(calls) if args.focus in f), None) if args.focus else 0
            if at is None:
                continue
            focused += n
            for name in set(calls[at:]):
                inclusive[name] += n
    print("samples per process:")
    for process, n in per_process.most_common(12):
        print(f"  {n:7d}  {process}")
    if per_thread:
        print("samples per thread name:")
        for thread, n in per_thread.most_common(12):
            print(f"  {n:7d}  {thread[:70]}")
    print(f"functions on the stack ({focused} samples{' through ' + args.focus if args.focus else ''}):")
    for name, n in inclusive.most_common(args.top):
        print(f"  {n:7d}  {name[:150]}")


if __name__ == "__main__":
    main()
