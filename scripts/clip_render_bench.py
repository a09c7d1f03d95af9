"""Images/s of vLLM's multimodal front end alone: the renderer's ``render_cmpl`` (the model's HF image processor,
vLLM's prompt processing) for a CLIP ViT-B/32-shaped model, one image per call as ``LLM.encode`` renders them,
serially and from N threads (what vLLM's ``renderer_num_workers`` gives ``LLM.encode``). No model runs: the engine
is built only for its renderer.

    python scripts/clip_render_bench.py [--n-images 2000] [--threads 1 2 4 8] [--model-dir DIR]

Prints the image processor's class, then images/s per thread count and the ratio to the first count given (one
thread by default), then the same HF processor on batches of 256 (what sentence-transformers' ``encode`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    from clip_bench import make_images
    from vllm import LLM
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    from vllm_eval.testing import build_tiny_clip

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-images", type=int, default=2000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--model-dir", default="/tmp/clip-vit-b-32-random")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    model = str(build_tiny_clip(args.model_dir, shape="vit-b-32"))
    llm = LLM(model, runner="pooling", max_model_len=77, mm_processor_cache_gb=0, enforce_eager=True)
    renderer, tok = llm.renderer, llm.renderer.default_cmpl_tok_params
    proc = type(renderer.mm_processor.info.get_hf_processor().image_processor).__name__
    prompts = [x.engine_prompt() for x in make_images(args.n_images + 8)]

    def one(p):
        return renderer.render_cmpl([parse_model_prompt(llm.model_config, p)], tok)[0]

    for p in prompts[:8]:
        one(p)
    prompts = prompts[8:]
    rows = []
    for n in args.threads:
        with ThreadPoolExecutor(n) as ex:
            t = time.perf_counter()
            list(ex.map(one, prompts))
            s = time.perf_counter() - t
        rows.append({"threads": n, "images": len(prompts), "seconds": s, "per_s": len(prompts) / s})
    base = rows[0]["per_s"]
    print(f"image processor: {proc}; torch threads {__import__('torch').get_num_threads()}", flush=True)
    for r in rows:
        print(f"render_cmpl, {r['threads']} thread(s): {r['per_s']:8,.0f} images/s ({r['per_s'] / base:.2f}x)")
    from transformers import AutoProcessor

    hf = AutoProcessor.from_pretrained(model)
    images = [p["multi_modal_data"]["image"] for p in prompts]
    t = time.perf_counter()
    for i in range(0, len(images), 256):
        hf(images=images[i : i + 256], return_tensors="pt")
    s = time.perf_counter() - t
    print(f"HF processor alone, batches of 256 ({type(hf.image_processor).__name__}): {len(images) / s:8,.0f} images/s")
    rows.append({"hf_batch_256_per_s": len(images) / s, "processor": proc})
    Path(args.out, "clip_render_bench.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
