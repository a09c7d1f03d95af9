"""Images reach the model: prompt token counts and outputs of a tiny Qwen2-VL with zero, one and two
images, before and after the text (vLLM CUDA). Usage: python3 scripts/gpu_vlm_images.py MODEL_DIR."""

from __future__ import annotations

import sys


def main() -> None:
    from vllm_eval.models.generator.vllm import VllmGenerator
    from vllm_eval.tasks.generative import get_generative_task

    model = sys.argv[1]
    items = get_generative_task("Digits").load()[:2]
    a, b = items[0].images[0], items[1].images[0]
    q = "Which digits are shown?"
    names = ["no image", "image 0", "image 1", "images 0+1", "images 1+0"]
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
            outs = g.generate([(q, ()), (q, [a]), (q, [b]), (q, [a, b]), (q, [b, a])])
            for name, o in zip(names, outs, strict=True):
                print(f"position={position} {name}: prompt_tokens={o.prompt_tokens} output={o.output!r}", flush=True)
            print(f"position={position} rendered with two images: {outs[3].prompt[:160]!r}", flush=True)


if __name__ == "__main__":
    main()
