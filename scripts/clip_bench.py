"""Images/s and texts/s of a CLIP ViT-B/32-shaped encoder: vLLM (one engine, then replicas on one GPU) against
sentence-transformers, side by side in one run, end to end through ``encode_texts`` (images are ImageInputs: the
pixel digest, the processor and the engine all counted).

    python scripts/clip_bench.py [--n-images 20000] [--n-texts 20000] [--dtype float16] [--replicas-per-gpu 2]
                                 [--backends vllm vllm-replicas st] [--out DIR]

The model is random (``vllm_eval.testing.build_tiny_clip(shape="vit-b-32")``): the towers of
openai/clip-vit-base-patch32, a 1,000-token vocabulary. Images: scikit-learn's digits scaled to 224 px, RGB, each
one distinct (a pixel of noise per copy, so no cache or dedup shortcut). Texts: "a photo of the digit N" with a
few words of the Lee corpus, 8-20 tokens. Prints one line per backend and input kind; writes ``clip_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def make_images(n: int, size: int = 224, seed: int = 0) -> list:
    from PIL import Image
    from sklearn.datasets import load_digits

    from vllm_eval.models.images import ImageInput

    digits = load_digits().images  # (1797, 8, 8) in 0..16
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = np.kron(digits[i % len(digits)] * 15.9, np.ones((size // 8, size // 8))).astype(np.uint8)
        a = np.stack([a, a, a], axis=-1)
        a[rng.integers(size), rng.integers(size)] = rng.integers(256, size=3)  # distinct pixels per image
        out.append(ImageInput(Image.fromarray(a, "RGB")))
    return out


def make_texts(n: int, seed: int = 0) -> list[str]:
    from gensim.test.utils import datapath

    words = open(datapath("lee_background.cor"), encoding="utf-8").read().split()
    rng = np.random.default_rng(seed)
    return [
        f"a photo of the digit {i % 10}, "
        + " ".join(words[j] for j in rng.integers(len(words), size=rng.integers(3, 12)))
        for i in range(n)
    ]


def _encoder(backend: str, model: str, dtype: str, replicas_per_gpu: int, engine: dict):
    from vllm_eval import VllmEncoder
    from vllm_eval.models.encoder.st import SentenceTransformerEncoder

    if backend == "st":
        return SentenceTransformerEncoder(model, dtype=dtype, batch_size=256, show_progress_bar=False)
    per_gpu = replicas_per_gpu if backend == "vllm-replicas" else 1
    return VllmEncoder(model, dtype=dtype, replicas_per_gpu=per_gpu, show_progress_bar=False, **engine)


def measure(
    backend: str, model: str, dtype: str, replicas_per_gpu: int, inputs: dict, engine: dict
) -> tuple[list, dict]:
    started = time.perf_counter()
    enc = _encoder(backend, model, dtype, replicas_per_gpu, engine)
    ready = time.perf_counter() - started
    rows, vectors = [], {}
    try:
        for kind, items in inputs.items():
            enc.encode_texts(items[-64:])  # first-call costs out of the timing (inputs not timed below)
            items = items[:-64]
            t = time.perf_counter()
            vectors[kind] = enc.encode_texts(items)
            seconds = time.perf_counter() - t
            rows.append(
                {
                    "backend": backend,
                    "input": kind,
                    "n": len(items),
                    "seconds": seconds,
                    "per_s": len(items) / seconds,
                    "ready_s": ready,
                }
            )
            print(
                f"{backend:14s} {kind:6s} ready {ready:6.1f} s  {len(items):7d} in {seconds:8.2f} s  "
                f"{len(items) / seconds:10,.0f} /s",
                flush=True,
            )
    finally:
        enc.close()
    return rows, vectors


def main() -> None:
    from vllm_eval.testing import build_tiny_clip, row_cosines

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-images", type=int, default=20000)
    parser.add_argument("--n-texts", type=int, default=20000)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--replicas-per-gpu", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=["vllm", "vllm-replicas", "st"])
    parser.add_argument("--model-dir", default="/tmp/clip-vit-b-32-random")
    parser.add_argument("--out", default=".")
    parser.add_argument("--engine-kwargs", default="{}", help="JSON: more vLLM EngineArgs for the vLLM backends")
    args = parser.parse_args()
    model = str(build_tiny_clip(args.model_dir, shape="vit-b-32"))
    inputs = {"image": make_images(args.n_images + 64), "text": make_texts(args.n_texts + 64)}
    rows, first = [], None
    for backend in args.backends:
        got, vectors = measure(
            backend, model, args.dtype, args.replicas_per_gpu, inputs, json.loads(args.engine_kwargs)
        )
        rows += got
        if first is None:
            first = (backend, vectors)
        else:
            for kind in inputs:
                cos = row_cosines(vectors[kind], first[1][kind]).min()
                print(f"{backend} vs {first[0]} {kind}: min cosine {cos:.6f}", flush=True)
        Path(args.out, "clip_bench.json").write_text(json.dumps(rows, indent=1))
    per = {(r["backend"], r["input"]): r["per_s"] for r in rows}
    for b in [b for b in args.backends if b != "st" and "st" in args.backends]:
        for kind in inputs:
            print(f"{b} / st {kind}: {per[(b, kind)] / per[('st', kind)]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
