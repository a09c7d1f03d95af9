"""``python -m vllm_eval.cli``: the ``vllm-eval`` command (as ``python -m vllm_eval``)."""

from . import run

if __name__ == "__main__":
    run()
