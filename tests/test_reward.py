"""Reward models: RewardBench's pairwise accuracy, preference files, vLLM vs transformers rewards, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vllm_eval
from vllm_eval.tasks.preference import load_preference_file, pairwise_metrics, render_conversations
from vllm_eval.utils.errors import UsageError


def test_pairwise_accuracy_on_three_hand_checked_pairs():
    # won, tie (a loss, as RewardBench counts it), lost
    m = pairwise_metrics(np.array([2.0, 1.0, 0.5]), np.array([1.0, 1.0, 0.7]), ["chat", "chat", "safety"])
    assert m["accuracy"] == pytest.approx(1 / 3)
    assert m["ties"] == 1 and m["n_pairs"] == 3
    assert m["margin_mean"] == pytest.approx((1.0 + 0.0 - 0.2) / 3)
    assert m["margin_median"] == pytest.approx(0.0)
    assert m["per_subset"] == {
        "chat": {"accuracy": 0.5, "n_pairs": 2, "margin_mean": pytest.approx(0.5)},
        "safety": {"accuracy": 0.0, "n_pairs": 1, "margin_mean": pytest.approx(-0.2)},
    }
    assert "per_subset" not in pairwise_metrics(np.array([1.0]), np.array([0.0]))


def test_preference_files_load_and_bad_rows_are_named(tmp_path):
    good = tmp_path / "prefs.jsonl"
    good.write_text(
        json.dumps({"prompt": "p1", "chosen": "yes", "rejected": "no", "subset": "a"})
        + "\n"
        + json.dumps({"prompt": "p2", "chosen": "good", "rejected": "bad"})
        + "\n"
    )
    pairs = load_preference_file(good)
    assert pairs.prompts == ["p1", "p2"] and pairs.chosen == ["yes", "good"] and pairs.subsets == ["a", "default"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text().splitlines()[0] + "\n" + json.dumps({"prompt": "p", "chosen": "c"}) + "\n")
    with pytest.raises(UsageError, match=r"bad\.jsonl:2: field 'rejected' is missing or empty"):
        load_preference_file(bad)
    bad.write_text(json.dumps({"prompt": "p", "chosen": "c", "rejected": "r", "subset": 3}) + "\n")
    with pytest.raises(UsageError, match=r"bad\.jsonl:1: field 'subset' must be str, got int"):
        load_preference_file(bad)
    csv = tmp_path / "prefs.csv"
    csv.write_text("prompt,chosen\nhi,there\n")
    with pytest.raises(UsageError, match=r"prefs\.csv:2: no field 'rejected'"):
        load_preference_file(csv)


def test_a_tokenizer_without_chat_template_is_refused():
    class NoTemplate:
        chat_template = None

    with pytest.raises(UsageError, match="no chat template; pass one with --chat-template"):
        render_conversations(NoTemplate(), ["p"], ["r"])


def _pairs_file(path):
    """Twelve pairs from real sentences: the sentence itself against its words reversed."""
    from vllm_eval.tasks.data import pang_lee_polarity

    rows = []
    for text, label in pang_lee_polarity()[94:106]:  # sorted by label: six of each
        words = text.split()
        rows.append(
            {
                "prompt": "Write one sentence of a movie review.",
                "chosen": text,
                "rejected": " ".join(reversed(words)),
                "subset": label,
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def reward_models(tmp_path_factory):
    from vllm_eval.testing import build_tiny_reward_model

    root = tmp_path_factory.mktemp("reward")
    return {
        "seq": build_tiny_reward_model(root / "seq-cls"),
        "qwen2": build_tiny_reward_model(root / "qwen2-rm", architecture="qwen2-reward"),
    }


@pytest.mark.slow
def test_reward_cli_vllm_matches_transformers(reward_models, cli_in_process, tmp_path):
    data = _pairs_file(tmp_path / "pairs.jsonl")
    model = str(reward_models["seq"])
    samples, metrics = {}, {}
    for backend in ("vllm", "hf"):
        out = tmp_path / backend
        code, err = cli_in_process(
            "reward", "--model", model, "--backend", backend, "--data", str(data), "--output-dir", str(out),
            "--no-progress", "--no-cache",
        )  # fmt: skip
        assert code == 0, err
        samples[backend] = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
        metrics[backend] = json.loads((out / "results.json").read_text())["metrics"]
    v, h = samples["vllm"], samples["hf"]
    assert len(v) == len(h) == 12
    delta = max(
        max(abs(a["reward_chosen"] - b["reward_chosen"]), abs(a["reward_rejected"] - b["reward_rejected"]))
        for a, b in zip(v, h)
    )
    print(f"\nreward (Qwen3ForSequenceClassification, 1 label) vLLM vs transformers: max |delta| {delta:.2e}")
    assert delta <= 1e-4
    assert len({round(s["reward_chosen"], 3) for s in v}) > 6  # raw, spread scores: not a sigmoid at 0 or 1
    won = [s["reward_chosen"] > s["reward_rejected"] for s in v]
    assert metrics["vllm"]["accuracy"] == pytest.approx(sum(won) / 12) == metrics["hf"]["accuracy"]
    assert set(metrics["vllm"]["per_subset"]) == {"neg", "pos"}
    # The library function behind the command writes the same.
    result = vllm_eval.reward(model, data=data, backend="hf", output_dir=tmp_path / "api", no_cache=True)
    assert result.results[0]["metrics"] == metrics["hf"] and result.backend == "hf"
    assert [json.loads(x) for x in (tmp_path / "api" / "samples.jsonl").read_text().splitlines()] == h
    with pytest.raises(vllm_eval.VllmEvalError, match="a served model"):
        vllm_eval.reward(model, data=data, backend="remote", endpoint=["http://127.0.0.1:9"])

    code, err = cli_in_process("reward", "--model", model, "--data", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "missing.jsonl" in err and "no such file" in err


@pytest.mark.slow
def test_per_token_reward_head_is_read_at_the_last_token(reward_models):
    """Qwen2ForRewardModel runs as token_classify in vLLM; its reward is the last token's score,
    checked against the same computation in transformers (Qwen2Model plus the Linear-ReLU-Linear head)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen2Model

    from vllm_eval.models.classifier.vllm import VllmClassifier

    path = str(reward_models["qwen2"])
    tok = AutoTokenizer.from_pretrained(path)
    texts = render_conversations(tok, ["What is 2 + 2?"] * 3, ["4", "It is four.", "5, I think"])
    with VllmClassifier(
        path, use_activation=False, add_special_tokens=False, labels=["reward"], show_progress_bar=False
    ) as rm:
        assert rm.pooling_task == "token_classify"
        got = rm.classify(texts)[:, 0]
    weights = load_file(f"{path}/model.safetensors")
    backbone = Qwen2Model.from_pretrained(path).eval()
    ref = []
    with torch.inference_mode():
        for text in texts:
            ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            h = backbone(input_ids=ids).last_hidden_state[0, -1]
            h = torch.relu(h @ weights["score.0.weight"].T + weights["score.0.bias"])
            ref.append(float(h @ weights["score.2.weight"][0] + weights["score.2.bias"][0]))
    delta = float(np.abs(got - np.asarray(ref)).max())
    print(f"\nreward (Qwen2ForRewardModel, last token) vLLM vs transformers: max |delta| {delta:.2e}")
    assert delta <= 1e-4 and np.ptp(got) > 1e-3
