"""``python -m vllm_eval``: the ``vllm-eval`` command."""

from vllm_eval.cli import run

if __name__ == "__main__":
    run()
