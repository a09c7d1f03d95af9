"""The command's own CPU time to tokenize one chunk: BatchTokenizer's direct Rust call against transformers' call.

    python scripts/tokenize_bench.py [TOKENIZER_DIR] [N_TEXTS]
    python scripts/tokenize_bench.py --replicas 2 [N_TEXTS]
    TOKENIZERS_PARALLELISM=false python scripts/tokenize_bench.py --replica REPLICA_DIR [TOKENIZER_DIR]

The parent of the replicas tokenizes every text under its one GIL (on a 4-GPU host it was the busiest thread of a
whole-benchmark run, docs/bench/h100x4-scaling). Time that thread spends is what the replicas wait for, so this
prints the calling thread's CPU time (``time.thread_time``: the Rust work on tokenizers' own threads is not in it) and
the wall time per text, for short (MindSmall-like, ~12 tokens) and long (Touche-like, ~100 tokens) texts, both paths
alternated three times, and checks that both gave the same ids. Default: the packaged all-MiniLM-L6-v2 WordPiece,
8,192 texts (one chunk of 8 replicas).

With ``--replicas R``: the packaged all-MiniLM-L6-v2 on R engine replicas (vLLM), N_TEXTS (default 20,000) texts of
~100 tokens encoded with the replicas tokenizing their shares (the default) and with this process tokenizing (as
before), alternated twice, printing this process's CPU seconds (every thread: ``time.process_time``) and the wall time
of each, and the largest difference between their rows.

With ``--replica DIR`` (a replica of ``vllm_eval.tasks.shaped.build_replica``): every task folder's texts, in chunks of
1,024 as a replica gets them, truncated to 512 tokens by each way BatchTokenizer has had (a long text tokenized whole
and, where over the limit, again; tokenized whole once; cut at a space past ``CUT_CHARS_PER_TOKEN`` x 512 characters,
the default) and by transformers' call: seconds of each (wall; with ``TOKENIZERS_PARALLELISM=false`` one core), the
texts whose whole text was needed after a cut, and a check that all gave the same ids.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np


def replicas(n_replicas: int, n: int) -> None:
    from unittest import mock

    from vllm_eval import VllmEncoder

    rng = np.random.default_rng(0)
    words = "the a cat dog market rain music ship city river data model light stone paper green fast slow".split()
    with VllmEncoder(data_parallel_size=n_replicas, show_progress_bar=False) as enc:
        enc.encode_texts(["warm up"] * 8)
        rows = {}
        for round_ in range(2):
            texts = [f"{round_} {i} " + " ".join(rng.choice(words, size=90)) for i in range(n)]
            for where in ("replicas", "here"):
                here = mock.patch.object(type(enc), "_tokenized_remotely", lambda self: False)
                with here if where == "here" else contextlib.nullcontext():
                    cpu, wall = time.process_time(), time.perf_counter()
                    rows[where] = enc.encode_texts(texts)
                    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                print(f"tokenized {where:8s}: this process's CPU {cpu:6.2f} s, wall {wall:6.2f} s ({n} texts)")
            print(f"largest difference: {float(np.abs(rows['replicas'] - rows['here']).max()):.3g}")


def replica(folder: str, tokenizer_dir: str | None) -> None:
    from pathlib import Path

    from reload_parity_check import texts_of  # this folder's: a replica task's texts, as gpu_r4probe.py reads them
    from transformers import AutoTokenizer

    from vllm_eval.engine import tokenizing
    from vllm_eval.utils.modelinfo import packaged_model_path

    tok = AutoTokenizer.from_pretrained(tokenizer_dir or packaged_model_path())
    tasks = [texts_of([d]) for d in sorted(Path(folder).iterdir()) if d.is_dir()]
    n, chars = sum(map(len, tasks)), sum(len(t) for texts in tasks for t in texts)
    print(f"{len(tasks)} tasks, {n} texts, {chars} characters")
    ways = {"twice": (None, False), "once": ("frame", False), "cut": ("frame", True), "transformers": None}
    seen = {}
    for name, way in ways.items():
        bt = tokenizing.BatchTokenizer(tok, 512)
        if way is None:
            bt._rust = None
        else:
            bt._frame = bt._frame if way[0] else None
            bt._cuts = bt._cuts and way[1]
        wall, ids = time.perf_counter(), []
        for texts in tasks:
            for lo in range(0, len(texts), 1024):
                ids += bt.with_truncated(texts[lo : lo + 1024])[0]
        print(f"{name:12s} {time.perf_counter() - wall:7.2f} s")
        seen[name] = ids
    reach = tokenizing.CUT_CHARS_PER_TOKEN * 512
    cut = [t for texts in tasks for t in texts if len(t) > reach]
    bt = tokenizing.BatchTokenizer(tok, 512)
    parts = [tokenizing._cut_at_space(t, reach) for t in cut]
    whole = sum(1 for ids in bt._encode_rust(parts, 513) if len(ids) <= 512) if bt._cuts else 0
    print(f"texts cut: {sum(p is not t for p, t in zip(parts, cut))}, of which tokenized whole after the cut: {whole}")
    assert all(ids == seen["transformers"] for ids in seen.values()), "the ways gave different ids"


def main() -> None:
    if sys.argv[1:2] == ["--replica"]:
        replica(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
        return
    if sys.argv[1:2] == ["--replicas"]:
        replicas(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 20000)
        return
    from transformers import AutoTokenizer

    from vllm_eval.models.streaming import BatchTokenizer
    from vllm_eval.utils.modelinfo import packaged_model_path

    tok = AutoTokenizer.from_pretrained(sys.argv[1] if len(sys.argv) > 1 else packaged_model_path())
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    words = [w for w in tok.get_vocab() if w.isalpha() and len(w) > 2][:20000]
    rng = np.random.default_rng(0)
    direct = BatchTokenizer(tok, 512)
    via = BatchTokenizer(tok, 512)
    via._rust = None
    for n_words in (10, 95):
        texts = [" ".join(rng.choice(words, size=n_words)) for _ in range(n)]
        seen: dict[str, list[float]] = {"transformers": [], "direct": []}
        for _ in range(3):
            for name, bt in (("transformers", via), ("direct", direct)):
                cpu, wall = time.thread_time(), time.perf_counter()
                ids, _ = bt(texts)
                seen[name].append((time.thread_time() - cpu) / n * 1e6)
                seen[name].append((time.perf_counter() - wall) / n * 1e6)
                seen.setdefault(f"ids {name}", ids)
        assert seen["ids transformers"] == seen["ids direct"], "the two paths gave different ids"
        tokens = sum(map(len, seen["ids direct"])) / n
        for name in ("transformers", "direct"):
            cpu, wall = min(seen[name][0::2]), min(seen[name][1::2])
            print(f"{tokens:5.1f} tokens/text  {name:12s}  calling thread {cpu:6.2f} us/text  wall {wall:6.2f} us/text")


if __name__ == "__main__":
    main()
