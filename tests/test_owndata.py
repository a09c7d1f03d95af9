"""Your own data files: every schema loads, bad rows are named, and the mteb ones run as real mteb tasks."""

from __future__ import annotations

import json

import pytest

from vllm_eval.tasks.owntasks import detect_type, own_mteb_task
from vllm_eval.utils.errors import DataUnavailableError, UsageError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def files(tmp_path):
    """One small file per mteb schema (and a BEIR directory), from real Lee sentences."""
    from vllm_eval.tasks.data import lee_documents
    from vllm_eval.tasks.offline import split_first_sentence

    docs = [split_first_sentence(d) for d in lee_documents()[:12] if split_first_sentence(d)[1]][:8]
    heads, rests = [h for h, _ in docs], [r for _, r in docs]
    out = {
        "sts": _jsonl(
            tmp_path / "sts.jsonl",
            [{"sentence1": h, "sentence2": rests[i], "score": 5.0} for i, h in enumerate(heads[:4])]
            + [{"sentence1": h, "sentence2": rests[-1 - i], "score": 0.5} for i, h in enumerate(heads[:4])],
        ),
        "pairs": tmp_path / "pairs.csv",
        "rerank": _jsonl(
            tmp_path / "rerank.jsonl",
            [{"query": h, "positive": [rests[i]], "negative": rests[:i] + rests[i + 1 :]} for i, h in enumerate(heads)],
        ),
        "classification": _jsonl(
            tmp_path / "cls.jsonl",
            [{"text": t, "label": "head" if i % 2 else "rest"} for i, t in enumerate(heads + rests)],
        ),
    }
    import csv

    with out["pairs"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sentence1", "sentence2", "label"])
        for i, h in enumerate(heads):
            w.writerow([h, rests[i], 1])
            w.writerow([h, rests[(i + 3) % len(rests)], 0])
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    _jsonl(beir / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": r} for i, r in enumerate(rests)])
    _jsonl(beir / "queries.jsonl", [{"_id": f"q{i}", "text": h} for i, h in enumerate(heads)])
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(heads)))
    )
    out["beir"] = beir
    return out


def test_each_schema_becomes_an_mteb_task_of_its_type(files):
    from mteb.abstasks import AbsTaskClassification, AbsTaskPairClassification, AbsTaskRetrieval, AbsTaskSTS

    expected = {
        "sts": ("STS", AbsTaskSTS, "cosine_spearman"),
        "pairs": ("PairClassification", AbsTaskPairClassification, "max_ap"),
        "rerank": ("Reranking", AbsTaskRetrieval, "map_at_1000"),
        "classification": ("Classification", AbsTaskClassification, "accuracy"),
        "beir": ("Retrieval", AbsTaskRetrieval, "ndcg_at_10"),
    }
    for key, (mteb_type, base, main) in expected.items():
        assert detect_type(files[key]) == mteb_type
        task = own_mteb_task(files[key])
        assert isinstance(task, base) and task.metadata.type == mteb_type and task.metadata.main_score == main
    rerank = own_mteb_task(files["rerank"]).dataset["default"]["test"]
    assert len(rerank["top_ranked"]) == 8 and all(len(v) == 8 for v in rerank["top_ranked"].values())
    # The revision follows the file's bytes.
    before = own_mteb_task(files["sts"]).metadata.dataset["revision"]
    files["sts"].write_text(files["sts"].read_text().replace("5.0", "4.0"))
    assert own_mteb_task(files["sts"]).metadata.dataset["revision"] != before


def test_malformed_files_name_file_line_and_field(tmp_path, files):
    bad = _jsonl(tmp_path / "bad.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 1}, {"sentence1": "a"}])
    with pytest.raises(UsageError, match=r"bad\.jsonl:2: field 'sentence2' is missing or empty"):
        own_mteb_task(bad, "STS")
    _jsonl(bad, [{"sentence1": "a", "sentence2": "b", "label": 2}])
    with pytest.raises(UsageError, match=r"bad\.jsonl:1: field 'label' must be 0 or 1, got 2"):
        own_mteb_task(bad, "PairClassification")
    _jsonl(bad, [{"query": "q", "positive": ["a"], "negative": ["b", 3]}])
    with pytest.raises(UsageError, match=r"bad\.jsonl:1: field 'negative' must list non-empty str"):
        own_mteb_task(bad)
    _jsonl(bad, [{"query": "q", "positive": [], "negative": ["b"]}])
    with pytest.raises(UsageError, match=r"bad\.jsonl:1: field 'positive' needs at least 1 items"):
        own_mteb_task(bad)
    _jsonl(bad, [{"foo": "x"}])
    with pytest.raises(UsageError, match="fields foo match no schema"):
        own_mteb_task(bad)
    (files["beir"] / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td99\t1\n")
    with pytest.raises(UsageError, match=r"test\.tsv:2: corpus-id 'd99' is not in corpus\.jsonl"):
        own_mteb_task(files["beir"])
    with pytest.raises(DataUnavailableError, match="no such file or directory"):
        own_mteb_task(tmp_path / "absent.jsonl")


def test_own_tasks_run_through_mteb_with_the_reference_encoder(files, st_encoder):
    from vllm_eval.evaluation.results import evaluate

    tasks = [own_mteb_task(files[k]) for k in ("sts", "pairs", "rerank", "beir", "classification")]
    rows = evaluate(st_encoder, tasks, show_progress_bar=False)
    scores = {r.task: r.main_score for r in rows}
    print(f"\nown data, all-MiniLM-L6-v2 (sentence-transformers): {scores}")
    assert all(r.status == "computed" for r in rows)
    # A first sentence finds the rest of its own article among 8: MiniLM gets these right.
    assert scores["rerank"] > 0.8 and scores["beir"] > 0.8 and scores["sts"] > 0.5


@pytest.mark.slow
def test_run_data_through_the_cli(files, vllm_encoder, cli_in_process, tmp_path):
    code, err = cli_in_process(
        "run", "--data", str(files["pairs"]), "--output-dir", str(tmp_path / "o"), "--no-progress"
    )
    assert code == 0, err
    [row] = json.loads((tmp_path / "o" / "summary.json").read_text())["scores"]
    assert row["task"] == "pairs" and row["task_type"] == "PairClassification" and row["main_score"] > 0.5
    code, err = cli_in_process("run", "--data", str(files["pairs"]), "--tasks", "SimLex999")
    assert code == 2 and "give --data or --tasks, not both" in err


def test_multiple_choice_files_resolve_answers_and_name_bad_rows(tmp_path):
    from vllm_eval.tasks.generative import load_multiple_choice_file

    f = _jsonl(
        tmp_path / "mc.jsonl",
        [
            {"question": "2 + 2?", "options": ["3", "4"], "answer": "4"},
            {"question": "Capital of France?", "options": ["Paris", "Rome", "Oslo"], "answer": "a"},
            {"question": "Third?", "options": ["x", "y", "z"], "answer": "(C)"},
        ],
    )
    task = load_multiple_choice_file(f)
    items = task.load()
    assert [i.target for i in items] == [1, 0, 2] and task.modality == "text" and task.letters
    _jsonl(f, [{"question": "q", "options": ["a", "b", "c"], "answer": 2}])  # an index (one answer form per file)
    assert load_multiple_choice_file(f).load()[0].target == 2
    _jsonl(f, [{"question": "q", "options": ["a", "b"], "answer": "c"}])
    with pytest.raises(UsageError, match=r"mc\.jsonl:1: field 'answer' 'c' is neither an option"):
        load_multiple_choice_file(f)
    _jsonl(f, [{"question": "q", "options": ["a"], "answer": 0}])
    with pytest.raises(UsageError, match=r"mc\.jsonl:1: field 'options' needs at least 2 items"):
        load_multiple_choice_file(f)
    _jsonl(f, [{"question": "q", "options": ["a", "b"], "answer": 0, "image": "nope.png"}])
    with pytest.raises(UsageError, match=r"mc\.jsonl:1: field 'image' 'nope.png': no such file"):
        load_multiple_choice_file(f)

    import numpy as np
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "black.png")
    _jsonl(f, [{"question": "Colour?", "options": ["black", "white"], "answer": "black", "image": "black.png"}])
    task = load_multiple_choice_file(f)
    assert task.modality == "image" and task.load()[0].images[0].size == (8, 8)


@pytest.mark.slow
def test_generate_scores_a_multiple_choice_file(generator, test_models, cli_in_process, tmp_path):
    f = _jsonl(
        tmp_path / "quiz.jsonl",
        [
            {"question": "Is the sky blue?", "options": ["yes", "no"], "answer": "yes"},
            {"question": "Is fire cold?", "options": ["yes", "no"], "answer": "B"},
        ],
    )
    code, err = cli_in_process(
        "generate", "--model", str(test_models["qwen3"]), "--data", str(f), "--scoring", "loglikelihood",
        "--output-dir", str(tmp_path / "o"), "--no-progress", "--no-cache",
    )  # fmt: skip
    assert code == 0, err
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["task"] == "quiz" and res["metrics"]["n_samples"] == 2 and res["metrics"]["missing"] == 0


@pytest.mark.slow
def test_rerank_data_directory_through_two_stages(files, vllm_cross, test_models, cli_in_process, tmp_path):
    code, err = cli_in_process(
        "rerank", "--reranker", str(test_models["cross"]), "--data", str(files["beir"]), "--top-k", "3",
        "--output-dir", str(tmp_path / "o"), "--no-progress", "--no-cache",
    )  # fmt: skip
    assert code == 0, err
    stage2 = json.loads((tmp_path / "o" / "stage2" / "summary.json").read_text())
    assert stage2["top_k"] == 3 and stage2["scores"][0]["task"] == "beir"
    code, err = cli_in_process("rerank", "--reranker", str(test_models["cross"]), "--data", str(files["sts"]))
    assert code == 2 and "needs retrieval tasks; sts is STS" in err


def test_unparsable_files_name_file_line_and_reason(tmp_path):
    """A file the parser refuses is named with its line and the parser's reason, for every format and
    loader, before any engine starts; blank lines do not shift the line numbers."""
    from vllm_eval.tasks.classification import load_classification_file
    from vllm_eval.tasks.generative import load_multiple_choice_file
    from vllm_eval.tasks.ner import load_ner_file
    from vllm_eval.tasks.preference import load_preference_file

    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text('{"text": "good", "label": "pos"}\n{"text": "bad, "label": "neg"}\n')
    with pytest.raises(UsageError, match=r"reviews\.jsonl:2: not valid JSON: expecting ',' delimiter \(column 17\)"):
        load_classification_file(reviews)
    reviews.write_text('{"text": "good", "label": "pos"}\n\n\n["a list"]\n')
    with pytest.raises(UsageError, match=r"reviews\.jsonl:4: not a JSON object but list"):
        load_classification_file(reviews)
    reviews.write_text('{"text": "good", "label": "pos"}\n\n{"text": "fine", "label": "pos"}\n\n{"text": "x"}\n')
    with pytest.raises(UsageError, match=r"reviews\.jsonl:5: field 'label' is missing or empty"):
        load_classification_file(reviews)
    table = tmp_path / "reviews.csv"
    table.write_text('text,label\ngood,pos\n"bad, really",neg,extra\n')
    with pytest.raises(UsageError, match=r"reviews\.csv:3: 3 fields, the header has 2"):
        load_classification_file(table)
    table.write_text("text,label\ngood,pos\n\nbad,\n")
    with pytest.raises(UsageError, match=r"reviews\.csv:4: field 'label' is missing or empty"):
        load_classification_file(table)
    table.write_text("text,label\ngood,1\nbad,0\n")
    assert load_classification_file(table).labels == [1, 0]  # a numeric column reads as numbers
    broken = tmp_path / "pairs.parquet"
    broken.write_text("not parquet")
    with pytest.raises(UsageError, match=r"pairs\.parquet: not a readable Parquet file"):
        load_preference_file(broken)
    mc = tmp_path / "mc.jsonl"
    mc.write_text('{"question": "q", "options": ["a", "b"], "answer": "a"}\n{"question": "q" "options": []}\n')
    with pytest.raises(UsageError, match=r"mc\.jsonl:2: not valid JSON"):
        load_multiple_choice_file(mc)
    ner = tmp_path / "ner.jsonl"
    ner.write_text('{"tokens": ["John"], "tags": ["B-PER"]}\n{"tokens": ["x"]\n')
    with pytest.raises(UsageError, match=r"ner\.jsonl:2: not valid JSON"):
        load_ner_file(ner)
