"""How long transformers takes to parse a model's config.json on this machine (vLLM parses it several
times per engine start), bare and after ``import vllm``, and where that time goes (cProfile, top 20 by
own time). Usage: python3 scripts/gpu_config_probe.py MODEL_DIR"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time


def timed(label: str, model: str) -> None:
    from transformers import AutoConfig

    t = time.perf_counter()
    AutoConfig.from_pretrained(model)
    print(f"{label}: AutoConfig.from_pretrained {time.perf_counter() - t:.3f} s", flush=True)


def main() -> None:
    model = sys.argv[1]
    import huggingface_hub
    import transformers

    print("transformers", transformers.__version__, "huggingface_hub", huggingface_hub.__version__, flush=True)
    timed("bare, first", model)
    timed("bare, second", model)
    import vllm  # noqa: F401

    timed("after import vllm", model)
    prof = cProfile.Profile()
    prof.enable()
    timed("profiled", model)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
    print(buf.getvalue()[-6000:], flush=True)


if __name__ == "__main__":
    main()
