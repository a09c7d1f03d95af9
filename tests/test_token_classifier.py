"""Token classifiers (NER): vLLM's token_classify against transformers, seqeval metrics, CoNLL and table files."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vllm_eval
from vllm_eval.tasks.ner import load_ner_file, ner_metrics, read_conll
from vllm_eval.utils.errors import UsageError

CONLL = """-DOCSTART- -X- O O

John NNP B-NP B-PER
Smith NNP I-NP I-PER
lives VBZ B-VP O
in IN B-PP O
New NNP B-NP B-LOC
York NNP I-NP I-LOC
. . O O

Mary NNP B-NP B-PER
visited VBD B-VP O
Paris NNP B-NP B-LOC
"""


def test_seqeval_metrics_on_a_hand_checked_example():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "I-LOC", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["I-LOC", "I-LOC", "O"]]
    m = ner_metrics(gold, pred)
    # conlleval: PER right, LOC#1 missed, "I-LOC I-LOC" opens LOC#2 (lenient): 2 of 2 predicted right, 2 of 3 found.
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx(2 / 3) and m["f1"] == pytest.approx(0.8)
    # strict IOB2: an entity must start with B-, so LOC#2 does not count: 1 of 1 predicted, 1 of 3 found.
    assert m["f1_strict_iob2"] == pytest.approx(2 * (1 * (1 / 3)) / (1 + 1 / 3))
    assert m["token_accuracy"] == pytest.approx(5 / 7)
    assert m["per_type"]["PER"]["f1-score"] == 1.0 and m["per_type"]["LOC"]["support"] == 2


def test_conll_and_table_files_load_and_bad_ones_are_named(tmp_path):
    f = tmp_path / "mini.conll"
    f.write_text(CONLL)
    data = read_conll(f)
    assert data.sentences[0] == ["John", "Smith", "lives", "in", "New", "York", "."]
    assert data.tags[1] == ["B-PER", "O", "B-LOC"] and len(data.sentences) == 2
    bad = tmp_path / "bad.conll"
    bad.write_text("John B-PER\nSmith\n")
    with pytest.raises(UsageError, match=r"bad.conll:2: a CoNLL line needs a word and a tag"):
        read_conll(bad)
    rows = tmp_path / "ner.jsonl"
    rows.write_text(json.dumps({"tokens": ["Anna", "runs"], "tags": ["B-PER", "O"]}) + "\n")
    assert load_ner_file(rows).tags == [["B-PER", "O"]]
    rows.write_text(json.dumps({"tokens": ["Anna", "runs"], "tags": ["B-PER"]}) + "\n")
    with pytest.raises(UsageError, match=r"ner.jsonl:1: 2 tokens but 1 tags"):  # a JSON line is named by its line
        load_ner_file(rows)


@pytest.mark.slow
def test_vllm_token_probabilities_match_transformers_and_the_cli_scores_a_file(test_models, cli_in_process, tmp_path):
    from vllm_eval.models.token_classifier.hf import TransformersTokenClassifier
    from vllm_eval.models.token_classifier.vllm import VllmTokenClassifier
    from vllm_eval.tasks.data import lee_documents

    path = str(test_models["token_classifier"])
    sentences = [d.split()[:60] for d in lee_documents()[:20]] + [["Ünïcödé", "words"], ["word"] * 700]
    with (
        VllmTokenClassifier(path, show_progress_bar=False) as v,
        TransformersTokenClassifier(path, show_progress_bar=False) as h,
    ):
        a, b = v.word_probs(sentences), h.word_probs(sentences)
        assert v.labels == h.labels == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
        assert [x.shape for x in a] == [(len(s), 5) for s in sentences]
        delta = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
        print(f"\ntoken_classify vLLM vs transformers: max |delta prob| {delta:.2e} over {len(sentences)} sentences")
        assert delta <= 1e-4
        assert v.counters.truncated == 1 and np.all(a[-1][-1] == [1, 0, 0, 0, 0])  # cut words: "O"
        assert v.tag(sentences[:3]) == h.tag(sentences[:3])

        f = tmp_path / "mini.conll"
        f.write_text(CONLL)
        code, err = cli_in_process(
            "token-classify", "--model", path, "--data", str(f), "--output-dir", str(tmp_path / "o")
        )
        assert code == 0, err
        res = json.loads((tmp_path / "o" / "results.json").read_text())
        assert res["metrics"]["n_sentences"] == 2 and 0.0 <= res["metrics"]["f1"] <= 1.0
        lines = (tmp_path / "o" / "samples.jsonl").read_text().splitlines()
        assert len(lines) == 2 and len(json.loads(lines[0])["predicted"]) == 7
        # The library function behind the command writes the same.
        result = vllm_eval.token_classify(path, f, output_dir=tmp_path / "api", show_progress=False)
        assert result.results[0]["metrics"] == res["metrics"] and result.model_name == v.name
        assert (tmp_path / "api" / "samples.jsonl").read_text().splitlines() == lines
        # compare --kind token_classifier: entity F1 and per-word probabilities against transformers.
        code, err = cli_in_process(
            "compare", "--kind", "token_classifier", "--model", path, "--data", str(f),
            "--output-dir", str(tmp_path / "cmp"), "--no-progress",
        )  # fmt: skip
        assert code == 0, err
        report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
        agree = report["agreement"]["vllm default"]
        print(f"compare token_classifier: {agree}")
        assert report["reference"] == "hf default" and {r["task"] for r in report["rows"]} == {"mini"}
        assert agree["n"] == 10 and agree["max_abs_diff"] <= 1e-4  # the 10 words of the 2 sentences
        f.write_text("John B-PERSON\n")
        code, err = cli_in_process(
            "token-classify", "--model", path, "--data", str(f), "--output-dir", str(tmp_path / "p")
        )
        assert code == 2 and "'B-PERSON' are not among the model's labels" in err
