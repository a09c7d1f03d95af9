"""Whether weights loaded into a running engine embed as a fresh engine of the same checkpoint does, bit for bit: one
engine (its core in this process, as a GPU replica's) of ``--first``, ``--second``'s weights loaded into it
(``reload_engine``, as a sweep does), then a fresh engine of ``--second``; both embed the texts of ``--texts`` (JSONL
files, or folders searched for them: every string field but ids) the same way, in chunks of ``--chunk``. Prints the
rows that differ and the largest difference, each parameter whose values, shape or strides differ between the two
engines, and whether the fresh engine gives the same rows twice. Engine options as a GPU sweep's replicas had them
(the summary's ``engine_options_in_force``) go in ``--engine-kwargs``.

    python scripts/reload_parity_check.py --first DIR --second DIR \
        --texts /root/work/replica-0.05/MTOPDomainClassification --dtype float16 \
        --engine-kwargs '{"enforce_eager": true, "max_num_batched_tokens": 131072, "max_num_seqs": 1024}'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path


def texts_of(paths: list[str | Path], limit: int | None = None) -> list[str]:
    """Every string field but ids of the JSONL files of ``paths`` (files, or folders searched for them), each text once,
    the first ``limit``: a replica task's queries and documents (``scripts/gpu_r4probe.py`` reads them too)."""
    files = [f for p in paths for f in (sorted(Path(p).rglob("*.jsonl")) if Path(p).is_dir() else [Path(p)])]
    out: list[str] = []
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                out += [v for k, v in row.items() if isinstance(v, str) and "id" not in k.lower() and v.strip()]
    return list(dict.fromkeys(out))[:limit]


def _parameters(llm) -> dict[str, tuple]:
    """Each parameter of the in-process model: shape, strides, dtype and a hash of its bytes."""
    import torch

    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    out = {}
    for name, p in model.named_parameters():
        data = p.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()
        out[name] = (tuple(p.shape), tuple(p.stride()), str(p.dtype), hashlib.sha1(data).hexdigest()[:12])
    return out


def main() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine's core in this process, as a replica's
    import numpy as np

    from vllm_eval.engine.build import acquire_engine, release_engine, reload_engine
    from vllm_eval.engine.jobs import embed_job

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", required=True)
    parser.add_argument("--second", required=True)
    parser.add_argument("--texts", nargs="+", required=True)
    parser.add_argument("--limit", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--engine-kwargs", default="{}")
    args = parser.parse_args()
    texts = texts_of(args.texts, args.limit)
    options = {"runner": "pooling", "convert": "embed", "dtype": args.dtype, **json.loads(args.engine_kwargs)}
    print(f"{len(texts)} texts, chunks of {args.chunk}, options {options}", flush=True)

    def embed(llm) -> np.ndarray:
        parts = [embed_job(llm, (texts[i : i + args.chunk], None, None)) for i in range(0, len(texts), args.chunk)]
        return np.concatenate(parts)

    llm = acquire_engine(args.first, **options)
    embed(llm)
    if not reload_engine(llm, args.second):
        raise SystemExit("the engine could not be reloaded")
    reloaded, reloaded_params = embed(llm), _parameters(llm)
    release_engine(llm)
    del llm
    import gc

    gc.collect()
    llm = acquire_engine(args.second, **options)
    fresh, fresh_params = embed(llm), _parameters(llm)
    again = embed(llm)
    release_engine(llm)
    differ = np.flatnonzero((reloaded != fresh).any(axis=1))
    print(f"rows that differ, reloaded against fresh: {len(differ)} of {len(texts)}; largest difference "
          f"{float(np.abs(reloaded - fresh).max()):.3g}", flush=True)  # fmt: skip
    for i in differ[:5]:
        print(f"  {texts[i][:60]!r}: largest {float(np.abs(reloaded[i] - fresh[i]).max()):.3g}")
    print(f"fresh engine, the same texts twice: {int((fresh != again).any(axis=1).sum())} rows differ")
    params = [n for n in fresh_params if fresh_params[n] != reloaded_params.get(n)]
    print(f"parameters that differ: {len(params)} of {len(fresh_params)}")
    for name in params[:10]:
        print(f"  {name}: fresh {fresh_params[name]}, reloaded {reloaded_params.get(name)}")


if __name__ == "__main__":
    main()
