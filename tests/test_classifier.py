"""Sequence classifiers: vLLM's classify task against transformers, metrics, own data files, the CLI, a server."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vllm_eval
from vllm_eval.tasks.classification import classification_metrics, get_classification_data, label_indices
from vllm_eval.tasks.owndata import read_rows
from vllm_eval.utils.errors import UsageError


@pytest.fixture(scope="module")
def hf_classifier(test_models):
    from vllm_eval.models.classifier.hf import TransformersClassifier

    with TransformersClassifier(str(test_models["classifier"]), show_progress_bar=False) as c:
        yield c


def test_vllm_probabilities_match_transformers(vllm_classifier, hf_classifier):
    task = get_classification_data("PangLeePolarity")
    texts = task.texts + ["", "word " * 700, task.texts[0]]
    a, b = vllm_classifier.classify(texts), hf_classifier.classify(texts)
    assert a.shape == b.shape == (len(texts), 2) and a.dtype == np.float32
    assert vllm_classifier.labels == hf_classifier.labels == ["negative", "positive"]
    np.testing.assert_allclose(a.sum(axis=1), 1.0, atol=1e-5)
    delta = float(np.abs(a - b).max())
    print(f"\nclassify vLLM vs transformers: max |delta prob| {delta:.2e} over {len(texts)} texts")
    assert delta <= 1e-4
    assert vllm_classifier.counters.truncated >= 1  # the 700-word text was cut to the model's limit
    np.testing.assert_array_equal(a[0], a[-1])


def test_metrics_on_a_hand_checked_example():
    gold = np.array([0, 0, 1, 1, 2])
    probs = np.array([[0.8, 0.1, 0.1], [0.3, 0.6, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.1, 0.1, 0.8]])
    m = classification_metrics(gold, probs, ["a", "b", "c"])
    # predicted 0, 1, 1, 2, 2: right on rows 0, 2, 4.
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["per_class"]["a"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}
    assert m["per_class"]["b"]["precision"] == 0.5 and m["per_class"]["b"]["recall"] == 0.5
    assert m["per_class"]["c"]["precision"] == 0.5 and m["per_class"]["c"]["recall"] == 1.0
    assert m["macro_f1"] == pytest.approx((2 / 3 + 0.5 + 2 / 3) / 3)
    expected = -np.mean(np.log([0.8, 0.3, 0.7, 0.2, 0.8]))  # P(true class) per row
    assert m["log_loss"] == pytest.approx(expected)


def test_labels_map_by_name_or_index_and_unknown_ones_are_named():
    np.testing.assert_array_equal(label_indices(["Positive", "negative", 1], ["negative", "positive"]), [1, 0, 1])
    with pytest.raises(UsageError, match=r"'neutral' are not among the model's labels \(negative, positive\)"):
        label_indices(["neutral", "positive"], ["negative", "positive"])


def test_own_data_files_load_and_malformed_rows_are_named(tmp_path):
    rows = [{"text": "good film", "label": "positive"}, {"text": "dull", "label": "negative"}]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["text"] for r in read_rows(jsonl, "classification")] == ["good film", "dull"]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], {"text": "dull", "label": 0}]))
    with pytest.raises(UsageError, match=r"d\.jsonl:2: field 'label' is int 0, but .*d\.jsonl:1 gives str"):
        read_rows(jsonl, "classification")  # a name and an index: one type per column, as CSV and Parquet have
    csv = tmp_path / "d.csv"
    csv.write_text('text,label\n"good, really",positive\ndull,negative\n')
    assert read_rows(csv, "classification")[0] == {"text": "good, really", "label": "positive"}
    import pandas as pd

    pq = tmp_path / "d.parquet"
    pd.DataFrame({"text": ["a", "b"], "label": ["x", "y"]}).to_parquet(pq)
    assert len(read_rows(pq, "classification")) == 2

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine", "label": "positive"}\n{"text": "no label", "label": null}\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2: field 'label' is missing or empty"):
        read_rows(bad, "classification")
    nofield = tmp_path / "nofield.csv"
    nofield.write_text("sentence,label\nhello,positive\n")
    with pytest.raises(UsageError, match=r"no field 'text' \(classification rows need text, label; the file has"):
        read_rows(nofield, "classification")
    typed = tmp_path / "typed.jsonl"
    typed.write_text('{"text": 5, "label": "positive"}\n')
    with pytest.raises(UsageError, match=r"typed.jsonl:1: field 'text' must be str, got int"):
        read_rows(typed, "classification")
    with pytest.raises(UsageError, match="use a .jsonl, .json, .csv, .tsv or .parquet"):
        (tmp_path / "d.txt").write_text("x")
        read_rows(tmp_path / "d.txt", "classification")


@pytest.mark.slow
def test_classify_cli_on_a_packaged_task_and_on_a_file(cli_in_process, test_models, vllm_classifier, tmp_path):
    model = str(test_models["classifier"])
    code, err = cli_in_process("classify", "--model", model, "--output-dir", str(tmp_path / "pl"), "--no-progress")
    assert code == 0, err
    res = json.loads((tmp_path / "pl" / "results.json").read_text())
    m = res["metrics"]
    print(
        f"\nclassify PangLeePolarity (seeded MiniLM head): {m['accuracy']:.3f} accuracy, {m['macro_f1']:.3f} macro-F1"
    )
    assert m["n_samples"] == 200 and m["accuracy"] > 0.6  # the head was fitted on half of these sentences
    assert res["telemetry"]["inputs"] == 200 and res["telemetry"]["tokens"] > 0
    samples = [json.loads(x) for x in (tmp_path / "pl" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 200 and set(samples[0]["probs"]) == {"negative", "positive"}
    assert sum(s["correct"] for s in samples) == round(m["accuracy"] * 200)

    data = tmp_path / "mine.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in [("a wonderful film", "positive")] * 3)
    )
    code, err = cli_in_process("classify", "--model", model, "--data", str(data), "--output-dir", str(tmp_path / "own"))
    assert code == 0, err
    assert json.loads((tmp_path / "own" / "results.json").read_text())["metrics"]["n_samples"] == 3
    # The library function behind the command writes the same.
    result = vllm_eval.classify(model, data=data, output_dir=tmp_path / "api", show_progress=False)
    (res,) = result.results
    assert res["task"] == "mine" and res["output_dir"] == tmp_path / "api"
    assert res["metrics"] == json.loads((tmp_path / "own" / "results.json").read_text())["metrics"]
    assert (tmp_path / "api" / "samples.jsonl").read_text() == (tmp_path / "own" / "samples.jsonl").read_text()

    data.write_text('{"text": "meh", "label": "neutral"}\n')
    code, err = cli_in_process("classify", "--model", model, "--data", str(data), "--output-dir", str(tmp_path / "x"))
    assert code == 2 and "'neutral' are not among the model's labels" in err


def test_a_classify_sweep_reloads_the_engine_matches_single_runs_and_resumes(
    test_models, vllm_classifier, cli_in_process, tmp_path
):
    """`classify --model B A`: B on a fresh engine, A's weights loaded into it; A's results equal a run of its own
    (on the session's engine) bit for bit; the same command again runs no model."""
    from vllm_eval.testing.text_models import build_minilm_classifier

    a = str(test_models["classifier"])
    b = str(build_minilm_classifier(tmp_path / "fit-75", n_fit=75))  # another head on the same encoder
    out = tmp_path / "sweep"
    argv = ("classify", "--model", b, a, "--tasks", "PangLeePolarity", "--output-dir", str(out), "--no-progress")
    code, err = cli_in_process(*argv)
    assert code == 0, err
    assert "sweep: " in cli_in_process.stdout and "PangLeePolarity" in cli_in_process.stdout
    sweep = json.loads((out / "sweep.json").read_text())
    labels = [m["label"] for m in sweep["models"]]
    assert labels == ["fit-75", "minilm-classifier"] and sweep["command"] == "classify"
    assert [m["reloaded"] for m in sweep["models"]] == [False, True]
    alone = vllm_eval.classify(a, "PangLeePolarity", output_dir=tmp_path / "alone", show_progress=False)
    metrics = json.loads((out / labels[1] / "results.json").read_text())["metrics"]
    assert metrics == alone.results[0]["metrics"]
    assert sweep["scores"][labels[1]]["PangLeePolarity"] == metrics["accuracy"]
    other = json.loads((out / labels[0] / "results.json").read_text())["metrics"]
    assert other["log_loss"] != metrics["log_loss"]  # other weights went into the same engine
    diff = sweep["significance"][labels[1]]["PangLeePolarity"]  # from each model's samples.jsonl
    assert (diff["a"], diff["b"], diff["n"]) == (other["accuracy"], metrics["accuracy"], metrics["n_samples"])
    code, err = cli_in_process("compare", "--runs", str(out / labels[0]), str(out / labels[1]), "--output-dir",
                               str(tmp_path / "cmp"))  # fmt: skip
    assert "b - a [95 % interval]" in cli_in_process.stdout, err
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["significance"] for r in saved["rows"] if "significance" in r] == [diff]  # compare --runs: the same
    written = {p: p.stat().st_mtime_ns for p in out.glob("*/results.json")}
    code, err = cli_in_process(*argv)
    assert code == 0, err
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/results.json")} == written
    assert json.loads((out / "sweep.json").read_text())["scores"] == sweep["scores"]
