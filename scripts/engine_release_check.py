"""Whether a released engine's memory comes back in the same process: one engine of ``--model`` (its core in this
process, as a big pooling model's or a replica's), a short embed, ``release_engine``, then the process's view at
each step: device memory allocated by PyTorch (CUDA) and whether a weak reference to a model weight is still alive
(both devices). Then a second engine of the same model is started in the same process, after the script's own
``gc.collect()`` with ``--collect``, else after nothing but what ``acquire_engine`` does.

    python scripts/engine_release_check.py --model DIR [--dtype bfloat16] [--engine-kwargs JSON]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import weakref

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _weight(llm):
    """A weak reference to one weight of the in-process model (None where it cannot be reached)."""
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        return weakref.ref(next(runner.model.parameters()))
    except Exception:
        pass
    found = []
    try:
        llm.llm_engine.collective_rpc(lambda w: found.append(next(w.model_runner.model.parameters())))
    except Exception:
        return None
    return weakref.ref(found[0]) if found else None


def main() -> None:
    import torch

    from vllm_eval.engine.build import acquire_engine, release_engine
    from vllm_eval.engine.jobs import embed_job

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--engine-kwargs", default="{}")
    parser.add_argument("--collect", action="store_true", help="gc.collect() and empty_cache() before the second")
    args = parser.parse_args()
    kwargs = json.loads(args.engine_kwargs)
    cuda = torch.cuda.is_available()

    def state(step: str, ref) -> None:
        mem = ""
        if cuda:
            gib = 2**30
            free = torch.cuda.mem_get_info()[0] / gib
            mem = f"allocated {torch.cuda.memory_allocated() / gib:6.1f} GiB, free {free:6.1f} GiB"
        alive = None if ref is None else ref() is not None
        print(f"{step:38s} weight alive: {alive}  {mem}", flush=True)

    t = time.perf_counter()
    llm = acquire_engine(args.model, runner="pooling", convert="embed", dtype=args.dtype, **kwargs)
    print(f"engine ready in {time.perf_counter() - t:.1f} s", flush=True)
    embed_job(llm, (["a short text"] * 8, None, None))
    ref = _weight(llm)
    state("engine running", ref)
    release_engine(llm)
    state("released (caller still holds LLM)", ref)
    del llm
    state("caller dropped LLM", ref)
    if args.collect:
        gc.collect()
        state("gc.collect()", ref)
        if cuda:
            torch.cuda.empty_cache()
            state("empty_cache()", ref)
    t = time.perf_counter()
    try:
        llm = acquire_engine(args.model, runner="pooling", convert="embed", dtype=args.dtype, **kwargs)
        print(f"second engine ready in {time.perf_counter() - t:.1f} s", flush=True)
        state("second engine running", ref)
        embed_job(llm, (["a short text"] * 8, None, None))
        release_engine(llm)
    except Exception as exc:
        print(f"second engine failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


if __name__ == "__main__":
    main()
