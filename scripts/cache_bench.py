"""Rows per second the output cache (vllm_eval.models.cache.OutputCache) stores and reads on this machine's disk:
``--rows`` float32 rows of ``--dim`` values, in batches of ``--batch`` (one transaction each), as an encoder's
calls store them.

    python3 scripts/cache_bench.py [--rows 100000] [--dim 768] [--batch 1024] [--dir /tmp/cache-bench]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dir", default="/tmp/cache-bench")
    args = parser.parse_args()

    from vllm_eval.models.cache import OutputCache

    shutil.rmtree(args.dir, ignore_errors=True)
    cache = OutputCache(args.dir)
    values = np.random.default_rng(0).standard_normal((args.rows, args.dim), dtype=np.float32)
    keys = [hashlib.blake2b(str(i).encode(), digest_size=16).digest() for i in range(args.rows)]
    start = time.perf_counter()
    for i in range(0, args.rows, args.batch):
        cache.put_many(zip(keys[i : i + args.batch], values[i : i + args.batch], strict=True))
    put = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(0, args.rows, args.batch):
        cache.get_many(keys[i : i + args.batch])
    get = time.perf_counter() - start
    mb = args.rows * args.dim * 4 / 1e6
    print(f"put {args.rows / put:,.0f} rows/s ({mb / put:,.0f} MB/s)", end="; ")
    print(f"get {args.rows / get:,.0f} rows/s ({mb / get:,.0f} MB/s)")
    cache.close()
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
