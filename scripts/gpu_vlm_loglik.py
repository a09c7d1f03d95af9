"""Images in log-likelihood scoring, checked on the GPU with a tiny Qwen2-VL (vLLM CUDA):

1. parity with transformers (Qwen2VLForConditionalGeneration + its processor, float32) for one-token
   options (one request per question, ``logprob_token_ids``) and multi-token ones (``prompt_logprobs``),
   one and two images, images before and after the text;
2. the image matters: another image, or two images swapped, changes the scores;

Usage: python3 scripts/gpu_vlm_loglik.py MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import sys

import numpy as np


def reference(model_dir: str, rendered: list[str], conts: list[str], images: list[list], tokenizer) -> np.ndarray:
    """Sum of log P(continuation | context with images) from transformers, float64 nats."""
    import torch
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from vllm_eval.generator.base import to_pil

    proc = AutoProcessor.from_pretrained(model_dir)
    lm = Qwen2VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    out = []
    for text, cont, ims in zip(rendered, conts, images, strict=True):
        pil = [to_pil(im) for im in ims] or None
        enc = proc(text=[text], images=pil, return_tensors="pt")
        k = tokenizer(cont, add_special_tokens=False)["input_ids"]
        ids = torch.cat([enc["input_ids"], torch.tensor([k])], dim=1)
        extra = {n: v.cuda() for n, v in enc.items() if n not in ("input_ids", "attention_mask")}
        with torch.no_grad():
            logits = lm(input_ids=ids.cuda(), attention_mask=torch.ones_like(ids).cuda(), **extra).logits[0]
        logp = torch.log_softmax(logits.double(), -1)
        n = ids.shape[1] - len(k)
        out.append(sum(logp[n + i - 1, t].item() for i, t in enumerate(k)))
    return np.asarray(out)


def main() -> None:
    from vllm_eval.generator.vllm import VllmGenerator
    from vllm_eval.tasks.generative import get_generative_task

    model, out_dir = sys.argv[1], sys.argv[2]
    items = get_generative_task("Digits").load()[:3]
    a, b, c = (it.images[0] for it in items)
    q = "Which digit is shown? Answer with the digit."
    # one-token options of one context (grouped), multi-token options (prompt_logprobs), two images
    contexts = [q] * 4 + [q] * 2 + ["Which digits are shown, in order?"] * 2
    conts = ["3", "7", "3", "7", " three", " seven", "0", "1"]
    shown = [[a], [a], [b], [b], [c], [c], [a, b], [b, a]]
    lines = []
    for position in ("before", "after"):
        with VllmGenerator(
            model,
            dtype="float32",
            enforce_eager=True,
            max_images_per_prompt=2,
            image_position=position,
            sampling={"max_tokens": 8},
            show_progress_bar=False,
        ) as g:
            got = g.loglikelihoods(contexts, conts, shown)
            g.shared_context_scoring = False
            every = g.loglikelihoods(contexts, conts, shown)
            g.shared_context_scoring = True
            text_only = g.loglikelihoods(contexts[:2], conts[:2])
            rendered = [g.render(ctx, ims) for ctx, ims in zip(contexts, shown)]
            ref = reference(model, rendered, conts, shown, g.tokenizer)
            swapped = g.loglikelihoods(contexts[6:8], conts[6:8], [shown[7], shown[6]])
            p = f"position={position}"
            lines += [
                f"{p} scores (nats): {np.round(got, 4).tolist()}",
                f"{p} |shared-context - prompt_logprobs| max = {np.max(np.abs(got - every)):.2e}",
                f"{p} |vLLM - transformers| max = {np.max(np.abs(got - ref)):.2e}",
                f"{p} image a vs b, same options: {got[:2].round(4).tolist()} vs {got[2:4].round(4).tolist()}",
                f"{p} images a+b / b+a: {got[6:8].round(4).tolist()}; swapped: {swapped.round(4).tolist()}",
                f"{p} no image: {text_only.round(4).tolist()} (with image a: {got[:2].round(4).tolist()})",
                f"{p} rendered: {rendered[6]!r:.200}",
            ]

    print("\n".join(lines), flush=True)
    with open(f"{out_dir}/loglik-images.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
