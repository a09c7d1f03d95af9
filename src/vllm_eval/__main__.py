"""``python -m vllm_eval``: the ``vllm-eval`` command."""

from .cli import run

if __name__ == "__main__":
    run()
