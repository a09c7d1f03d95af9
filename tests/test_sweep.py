"""Sweeps (several models in one job) and the paired bootstrap between runs, on real vLLM (CPU) and real mteb."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import vllm_eval
from vllm_eval.api.sweep import sweep_models
from vllm_eval.utils.errors import UsageError

TASKS = ["WordSim353", "PangLeePolarity"]


def _copy(source: str, dest, noise: float = 0.0, seed: int = 0) -> str:
    """A copy of the packaged MiniLM at ``dest``, with seeded noise of sd ``noise`` on every float tensor."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, dest)
    if noise:
        tensors = load_file(str(dest / "model.safetensors"))
        rng = np.random.default_rng(seed)
        for name, value in tensors.items():
            if value.dtype == np.float32:
                tensors[name] = (value + rng.normal(0, noise, value.shape)).astype(np.float32)
        save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return str(dest)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A training folder: checkpoint-100 (MiniLM, lightly perturbed) and checkpoint-300 (noise 5e-2 on every weight:
    a model that must score worse)."""
    from vllm_eval.utils.modelinfo import packaged_model_path

    root = tmp_path_factory.mktemp("training")
    _copy(packaged_model_path(), root / "checkpoint-100", noise=1e-3, seed=1)
    _copy(packaged_model_path(), root / "checkpoint-300", noise=5e-2, seed=2)
    (root / "runs").mkdir()  # a training folder's other contents are not models
    return root


def test_a_sweep_equals_separate_runs_shares_one_engine_and_marks_real_differences(checkpoints, tmp_path, capsys):
    # One job over a training folder: the second checkpoint's weights go into the first one's engine and the tasks'
    # data loaded for the first is used again; every score equals a separate run of the same checkpoint bit for bit,
    # heavy noise is found significantly worse, and a model against its own separate run differs by exactly nothing.
    from vllm_eval.measure.significance import compare_runs

    out = tmp_path / "sweep"
    result = vllm_eval.evaluate(model=str(checkpoints), tasks=TASKS, output_dir=out, no_cache=True, show_progress=False)
    labels = [m.label for m in result.models]
    assert labels == ["checkpoint-100", "checkpoint-300"] and [m.step for m in result.models] == [100, 300]
    assert result.reloaded == [False, True]
    alone = vllm_eval.evaluate(
        model=checkpoints / "checkpoint-300", tasks=TASKS, output_dir=tmp_path / "alone", no_cache=True,
        show_progress=False,
    )  # fmt: skip
    assert result.scores["checkpoint-300"] == alone.scores  # equal, not close
    for label in labels:  # each model's folder is what a run writes
        summary = json.loads((out / label / "summary.json").read_text())
        assert [s["task"] for s in summary["scores"]] == TASKS
        assert sorted(p.stem for p in (out / label / "units").glob("*.npz")) == sorted(TASKS)
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["scores"] == result.scores and sweep["pending"] == []
    worse = sweep["significance"]["checkpoint-300"]
    assert worse["WordSim353"]["delta"] < 0 and worse["WordSim353"]["significant"], worse["WordSim353"]
    itself = compare_runs(out / "checkpoint-300", tmp_path / "alone")
    for task in TASKS:
        assert itself[task]["delta"] == 0 and itself[task]["low"] <= 0 <= itself[task]["high"]
        assert not itself[task]["significant"]
    print(f"\nsweep seconds per model {result.seconds}; noise 5e-2 on WordSim353: {worse['WordSim353']}")
    from vllm_eval.cli.tables import print_sweep

    capsys.readouterr()
    print_sweep(result)
    table = capsys.readouterr().out
    assert "(step 300)" in table and " *" in table

    # compare --runs: the same bootstrap beside the score differences, printed and in compare.json.
    from vllm_eval.measure.compare import print_comparison

    comparison = vllm_eval.compare(runs=[out / labels[0], out / labels[1]], output_dir=tmp_path / "cmp")
    rows = {r["task"]: r for r in comparison.rows if "checkpoint-300" in r["config"]}
    assert rows["WordSim353"]["significance"]["significant"]
    assert "significance" in json.loads(comparison.path.read_text())["rows"][-1]
    print_comparison(comparison)
    assert f"{rows['WordSim353']['significance']['delta']:+.4f} [" in capsys.readouterr().out

    # report: the sweep's table and each task's score per step.
    from vllm_eval.measure.report import write_report

    page = write_report([out], tmp_path / "report.html").read_text()
    assert "main score per checkpoint" in page and "checkpoint-300" in page

    # Resumed: every model's results are there, so none is loaded again.
    again = vllm_eval.evaluate(model=str(checkpoints), tasks=TASKS, output_dir=out, no_cache=True, show_progress=False)
    assert again.scores == result.scores
    assert {r.status for res in again.results for r in res.rows} == {"reused"}


def test_a_kept_task_scores_as_a_fresh_one_and_a_reused_one_does_not():
    # mteb's clustering draws its subsamples from the task's own generator: the same task object evaluated twice
    # scores otherwise the second time; the fresh copy a sweep gives each later model (its state from before its
    # data was loaded, the data shared) scores as a new task does. Hashed vectors, no engine.
    import mteb

    from vllm_eval.evaluation.prefetch import TaskStore
    from vllm_eval.measure.significance import compare_runs
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing.instant import InstantEncoder

    encoder, cls = InstantEncoder(), type(get_tasks(["TwentyNewsgroupsMini"])[0])

    def score(task):
        result = mteb.evaluate(encoder, [task], cache=None, co2_tracker=False, show_progress_bar=False)
        return result.task_results[0].get_score()

    reference = score(cls())
    store, task = TaskStore(), cls()
    store.load(task)
    assert task.data_loaded and score(task) == reference
    assert score(task) != reference  # the task's generator moved on
    fresh = store.fresh([task])[0]
    assert fresh is not task and fresh.dataset is task.dataset and score(fresh) == reference
    # A task without per-unit scores (a v-measure) is named, not guessed, in a comparison.
    table = compare_runs("/nonexistent-a", "/nonexistent-b", tasks={"TwentyNewsgroupsMini": "v_measure"})
    assert "no per-unit scores" in table["TwentyNewsgroupsMini"]["note"]


def test_sweep_models_reads_globs_training_folders_and_steps(tmp_path):
    for name in ("checkpoint-20", "checkpoint-3", "best"):
        (tmp_path / "run" / name).mkdir(parents=True)
        (tmp_path / "run" / name / "config.json").write_text("{}")
    (tmp_path / "run" / "best" / "trainer_state.json").write_text('{"global_step": 25}')
    found = sweep_models(str(tmp_path / "run"))
    assert [(m.label, m.step) for m in found] == [("checkpoint-3", 3), ("checkpoint-20", 20)]
    found = sweep_models(str(tmp_path / "run" / "*"))
    assert [(m.label, m.step) for m in found] == [("checkpoint-3", 3), ("checkpoint-20", 20), ("best", 25)]
    assert sweep_models(str(tmp_path / "run" / "best")) is None  # one model
    with pytest.raises(UsageError, match="matches no file or folder"):
        sweep_models(str(tmp_path / "nothing-*"))
    (tmp_path / "other" / "best").mkdir(parents=True)
    with pytest.raises(UsageError, match="would both write into best/"):
        sweep_models([str(tmp_path / "run" / "best"), str(tmp_path / "other" / "best")])
    with pytest.raises(UsageError, match="a sweep takes several"):
        vllm_eval.evaluate(model=[str(tmp_path / "run" / "best")] * 1 + ["x"], log_samples=True, output_dir=tmp_path)
