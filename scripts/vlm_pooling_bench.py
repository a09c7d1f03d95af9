"""A Qwen2-VL-shaped model pooled through vLLM, against transformers: parity of the embedder (texts, images,
image+text, with the VLM2Vec prompts) and of the reranker (image documents, P(yes) from the LM head's "no" and
"yes" rows), and image throughput of the embedder (images/s, end to end through ``encode_texts``) against
transformers run in batches. Random weights (``build_tiny_qwen2_vl``): numbers for speed and agreement only.

    python scripts/vlm_pooling_bench.py --model-dir /root/models/q2vl --shape tiny --steps parity rerank
    python scripts/vlm_pooling_bench.py --model-dir /root/models/q2vl-2b --shape qwen2-vl-2b --steps throughput
    python scripts/vlm_pooling_bench.py --family idefics3 --model-dir /tmp/idefics3 --steps parity rerank  # CPU build

``--family idefics3`` (a tiny Idefics3, which vLLM's CPU build runs) checks the script itself on a CPU; its
reranker is a saved one-label head (``build_tiny_idefics3(score_tokens=...)``), Qwen2-VL's is vLLM's
``classifier_from_token`` recipe.

Each step prints one line and writes ``<out>/<step>.json`` as it ends.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def digits(n: int, side: int) -> list:
    """``n`` distinct RGB digit images of ``side`` px (scikit-learn's digits, repeated with a shifted shade)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    base = load_digits().images
    out = []
    for i in range(n):
        im = np.clip(base[i % len(base)] * 255 / 16 + i // len(base), 0, 255).astype(np.uint8)
        out.append(Image.fromarray(im).convert("RGB").resize((side, side)))
    return out


def hf_last_token(model_dir: str, prompts: list[str], images: list, dtype: str, batch: int = 1) -> np.ndarray:
    """transformers' Qwen2-VL: last hidden state at the last position, L2-normalised; float32 (n, hidden)."""
    import torch

    processor, model = hf_model(model_dir, dtype)
    out = []
    for lo in range(0, len(prompts), batch):
        ims = [im for im in images[lo : lo + batch] if im is not None]
        enc = processor(text=prompts[lo : lo + batch], images=ims or None, return_tensors="pt").to(model.device)
        with torch.no_grad():
            h = model.model(**enc).last_hidden_state[:, -1].float()
        out.append(torch.nn.functional.normalize(h, dim=-1).cpu().numpy())
    return np.concatenate(out)


def hf_model(model_dir: str, dtype: str):
    """transformers' processor and generation model (Qwen2-VL, Idefics3: ``AutoModelForImageTextToText``)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    return AutoProcessor.from_pretrained(model_dir), model.to("cuda" if torch.cuda.is_available() else "cpu")


def parity(args: argparse.Namespace) -> dict:
    from vllm_eval import VllmEncoder
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import row_cosines

    n = args.n_parity
    images, texts = digits(n, 56), [f"a handwritten digit number {i}" for i in range(n)]
    meta = get_tasks(["WordSim353"])[0].metadata
    out = {}
    layouts = [("model-placeholder", {})]
    if args.family == "qwen2-vl":
        layouts.insert(0, ("vlm2vec-prompts", {"preset": "vlm2vec-qwen2vl"}))
    for label, kw in layouts:
        with VllmEncoder(args.model_dir, dtype=args.dtype, show_progress_bar=False, **kw) as enc:
            recipe, mark = enc.image_prompts, enc._placeholder

            def encode(batch, enc=enc):
                return enc.encode([batch], task_metadata=meta, hf_split="test", hf_subset="default")

            got = np.concatenate(
                [encode({"text": texts}), encode({"image": images}), encode({"image": images, "text": texts})]
            )
        prompts = (
            [recipe.format(t, False, mark) for t in texts]
            + [recipe.format(None, True, mark)] * n
            + [recipe.format(t, True, mark) for t in texts]
        )
        ref = hf_last_token(args.model_dir, prompts, [None] * n + images + images, args.dtype)
        cos = row_cosines(got, ref)
        out[label] = {
            "min_cosine": {
                k: float(cos[i * n : (i + 1) * n].min()) for i, k in enumerate(("text", "image", "text_image"))
            },
            "image_prompt": recipe.format(None, True, mark),
        }
        print(f"parity {label}: {out[label]}", flush=True)
    return out


def rerank(args: argparse.Namespace) -> dict:
    import torch

    from vllm_eval import VllmReranker
    from vllm_eval.models.images import ImageInput
    from vllm_eval.models.presets import ScoreTemplate

    n = args.n_parity
    template = ScoreTemplate(
        query_template="<|im_start|>user\nQuery: {query}\n",
        document_template="Document: {document}<|im_end|>\n<|im_start|>assistant\n",
    )
    overrides = {"classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax"}
    model_dir = args.model_dir
    if args.family == "idefics3":  # the recipe reads an empty head there (its LM head is beside the language model)
        from vllm_eval.testing import build_tiny_idefics3

        overrides, model_dir = {}, str(build_tiny_idefics3(args.model_dir + "-scored", score_tokens=("no", "yes")))
    images, queries = digits(n, 56), [f"the digit {i % 10}" for i in range(n)]
    with VllmReranker(
        model_dir, score_template=template, hf_overrides=overrides or None, dtype=args.dtype, show_progress_bar=False
    ) as rr:
        mark = rr.image_placeholder
        got = rr.score_pairs(queries, [ImageInput(im, mark) for im in images])
    head, tail = template.document_parts()
    processor, model = hf_model(model_dir, args.dtype)
    no, yes = processor.tokenizer.convert_tokens_to_ids(["no", "yes"])
    ref = []
    for q, im in zip(queries, images):
        enc = processor(text=template.query(q) + head + mark + tail, images=[im], return_tensors="pt").to(model.device)
        with torch.no_grad():
            logits = model(**enc).logits[0, -1].float()
        ref.append(torch.softmax(logits[[no, yes]], dim=-1)[1].item())
    out = {
        "max_abs_diff": float(np.abs(got - np.asarray(ref)).max()),
        "score_range": [float(got.min()), float(got.max())],
    }
    print(f"rerank: {out}", flush=True)
    return out


def throughput(args: argparse.Namespace) -> dict:
    from vllm_eval import VllmEncoder
    from vllm_eval.models.images import ImageInput

    images = digits(args.n_images, 224)
    out = {"n_images": args.n_images, "side_px": 224}
    t0 = time.perf_counter()
    with VllmEncoder(
        args.model_dir,
        preset="vlm2vec-qwen2vl" if args.family == "qwen2-vl" else None,
        dtype=args.dtype,
        replicas_per_gpu=args.replicas_per_gpu,
        show_progress_bar=False,
    ) as enc:
        out["vllm_ready_s"] = time.perf_counter() - t0
        prompt = enc.image_prompts.format(None, True, enc._placeholder)
        inputs = [ImageInput(im, prompt) for im in images]
        t1 = time.perf_counter()
        got = enc.encode_texts(inputs)
        out["vllm_encode_s"] = time.perf_counter() - t1
    out["vllm_images_per_s"] = args.n_images / out["vllm_encode_s"]
    print(f"vllm: ready {out['vllm_ready_s']:.1f} s, {out['vllm_images_per_s']:.1f} images/s", flush=True)
    if args.hf_batch:
        n_hf = min(args.n_images, args.n_hf)
        t2 = time.perf_counter()
        ref = hf_last_token(args.model_dir, [prompt] * n_hf, images[:n_hf], args.dtype, batch=args.hf_batch)
        hf_s = time.perf_counter() - t2  # model load included: a user's time for this many images
        out.update(hf_images=n_hf, hf_batch=args.hf_batch, hf_s_with_load=hf_s, hf_images_per_s=n_hf / hf_s)
        cos = (got[:n_hf] * ref).sum(1) / np.linalg.norm(got[:n_hf], axis=1)
        out["min_cosine_vs_hf"] = float(cos.min())
        print(
            f"hf: {out['hf_images_per_s']:.1f} images/s (batch {args.hf_batch}, {n_hf} images, load included); "
            f"min cosine {out['min_cosine_vs_hf']:.5f}",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--family", default="qwen2-vl", choices=["qwen2-vl", "idefics3"])
    ap.add_argument("--shape", default="tiny", choices=["tiny", "qwen2-vl-2b"])
    ap.add_argument("--dtype", default=None, help="default: float32 for tiny, bfloat16 for qwen2-vl-2b")
    ap.add_argument("--steps", nargs="+", default=["parity", "rerank"], choices=["parity", "rerank", "throughput"])
    ap.add_argument("--n-parity", type=int, default=8)
    ap.add_argument("--n-images", type=int, default=5000)
    ap.add_argument("--n-hf", type=int, default=2000, help="images transformers embeds in the throughput step")
    ap.add_argument("--hf-batch", type=int, default=32, help="0: no transformers side")
    ap.add_argument("--replicas-per-gpu", type=int, default=1)
    ap.add_argument("--out", default="results/vlm-pooling")
    args = ap.parse_args()
    args.dtype = args.dtype or ("float32" if args.shape == "tiny" else "bfloat16")
    from vllm_eval.testing import build_tiny_idefics3, build_tiny_qwen2_vl

    t = time.perf_counter()
    if args.family == "idefics3":
        build_tiny_idefics3(args.model_dir)
    else:
        build_tiny_qwen2_vl(args.model_dir, shape=args.shape)
    print(f"model {args.shape} ready in {time.perf_counter() - t:.1f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for step in args.steps:
        result = {"parity": parity, "rerank": rerank, "throughput": throughput}[step](args)
        (out / f"{step}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
