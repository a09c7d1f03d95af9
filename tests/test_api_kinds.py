"""The library API of the other model kinds: ``vllm_eval.rerank`` and ``vllm_eval.generate`` return what
``vllm-eval rerank`` and ``vllm-eval generate`` write, and refuse bad input with the commands' one-line errors
before anything loads.

Each pair runs the command in this process, then the function on the same model with the command's output cache:
every output the function asks for is a cache hit, so it sent the same inputs under the same settings, and what
it returns must be what the command wrote. The session's engines are shared with the other tests.
"""

from __future__ import annotations

import json

import pytest

import vllm_eval
from vllm_eval.utils.errors import VllmEvalError
from vllm_eval.utils.modelinfo import packaged_model_path

MINILM = packaged_model_path()


def _stage_scores(summary_path) -> list[tuple]:
    rows = json.loads(summary_path.read_text())["scores"]
    return [(r["task"], r["stage"], r["main_score_name"], r["main_score"]) for r in rows]


def _beir(folder):
    """A BEIR directory of eight documents and eight queries: both stages in about a second."""
    docs = ["cats purr when content", "stock markets fell sharply", "rain is forecast for tomorrow", "a dog barks"]
    docs += ["the senate passed the bill", "the team won the final", "bread rises in a warm oven", "ice melts"]
    queries = ["why do cats purr", "markets fell", "will it rain", "dogs barking", "senate vote", "who won"]
    queries += ["baking bread", "melting ice"]
    (folder / "qrels").mkdir(parents=True)
    lines = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(docs)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    lines = [{"_id": f"q{i}", "text": t} for i, t in enumerate(queries)]
    (folder / "queries.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    qrels = "".join(f"q{i}\td{i}\t1\n" for i in range(len(queries)))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return folder


def test_rerank_returns_what_the_cli_wrote(cli_in_process, test_models, vllm_cross, tmp_path):
    cross, cache, data = str(test_models["cross"]), tmp_path / "cache", _beir(tmp_path / "tiny")
    code, err = cli_in_process(
        "rerank",
        "--reranker",
        cross,
        "--top-k",
        "3",
        "--data",
        str(data),
        "--output-dir",
        str(tmp_path / "cli"),
        "--cache-dir",
        str(cache),
        "--no-progress",
    )
    assert code == 0, err[-3000:]
    result = vllm_eval.rerank(
        cross, data=data, top_k=3, output_dir=tmp_path / "api", cache_dir=cache, show_progress=False
    )
    cli = _stage_scores(tmp_path / "cli" / "stage1" / "summary.json")
    cli += _stage_scores(tmp_path / "cli" / "stage2" / "summary.json")
    assert [(r.task, r.stage, r.main_score_name, r.main_score) for r in result.rows] == cli  # equal, not close
    assert result.first_stage_scores == {"tiny": cli[0][3]} and result.scores == {"tiny": cli[1][3]}
    assert result.cache.stats.misses == 0 and result.cache.stats.hits > 0  # the command's inputs and settings
    assert result.stage_dirs == (tmp_path / "api" / "stage1", tmp_path / "api" / "stage2")
    assert result.summary_path == tmp_path / "api" / "stage2" / "summary.json"
    assert _stage_scores(result.summary_path) == cli[1:]
    assert (result.results_dir / "tiny.json").is_file()
    assert (result.backend, result.first_stage, result.top_k) == ("vllm", "bm25s", 3)
    assert f"-> top 3 -> {result.model_name} (vllm)" in cli_in_process.stdout


def test_generate_returns_what_the_cli_wrote(cli_in_process, test_models, generator, tmp_path):
    model, cache, out = str(test_models["qwen3"]), tmp_path / "cache", tmp_path / "cli"
    code, err = cli_in_process(
        "generate",
        "--model",
        model,
        "--task",
        "PangLeePolarity",
        "--limit",
        "8",
        "--max-tokens",
        "8",
        "--answer-format",
        "xml",
        "--max-missing",
        "1",
        "--output-dir",
        str(out),
        "--cache-dir",
        str(cache),
        "--no-progress",
    )
    assert code == 0, err[-3000:]
    call = dict(limit=8, max_tokens=8, answer_format="xml", cache_dir=cache, show_progress=False)
    result = vllm_eval.generate(model, "PangLeePolarity", max_missing=1, output_dir=tmp_path / "api", **call)
    written = json.loads((out / "results.json").read_text())
    got = result.results["PangLeePolarity"]
    assert got["metrics"] == written["metrics"] and got["config"] == written["config"]
    assert got["samples"] == [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert result.scores == {"PangLeePolarity": written["metrics"]["accuracy"]} and not result.failed
    assert result.cache.stats.misses == 0 and result.cache.stats.hits > 0
    assert result.output_dirs == {"PangLeePolarity": tmp_path / "api"}
    assert (result.model_name, result.backend) == (written["model"], "vllm")
    # Over the budget of unparsable answers: no exception; the task is in errors, its results read back.
    strict = vllm_eval.generate(model, "PangLeePolarity", max_missing=0, output_dir=tmp_path / "strict", **call)
    assert strict.failed == ["PangLeePolarity"] and "budget of 0" in strict.errors["PangLeePolarity"]
    assert strict.results["PangLeePolarity"]["metrics"] == got["metrics"] and strict.scores == {}


CASES = [
    (["rerank", "--reranker", MINILM, "--tasks", "WordSim353"], "rerank", dict(model=MINILM, tasks="WordSim353")),
    (
        ["rerank", "--reranker", MINILM, "--backend", "st", "--api", "rerank"],
        "rerank",
        dict(model=MINILM, backend="st", api="rerank"),
    ),
    (
        ["rerank", "--reranker", MINILM, "--first-stage", "/no/first"],
        "rerank",
        dict(model=MINILM, first_stage="/no/first"),
    ),
    (["generate", "--model", MINILM], "generate", dict(model=MINILM)),
    (["generate", "--tasks", "PangLeePolarity"], "generate", dict(tasks="PangLeePolarity")),
    (
        ["generate", "--backend", "hf", "--model", MINILM, "--tasks", "Digits", "--scoring", "loglikelihood"],
        "generate",
        dict(model=MINILM, tasks="Digits", backend="hf", scoring="loglikelihood"),
    ),
    (
        ["generate", "--model", MINILM, "--tasks", "PangLeePolarity", "--chat-template", "none.jinja"],
        "generate",
        dict(model=MINILM, tasks="PangLeePolarity", chat_template="none.jinja"),
    ),
    (
        ["generate", "--model", MINILM, "--tasks", "PangLeePolarity", "--max-model-length", "128"],
        "generate",
        dict(model=MINILM, tasks="PangLeePolarity", max_model_length=128),
    ),
]


@pytest.mark.parametrize(
    "argv, function, call", CASES, ids=[" ".join(a).replace(MINILM, "MINILM") for a, _, _ in CASES]
)
def test_bad_input_is_the_commands_error_before_loading(cli_in_process, monkeypatch, argv, function, call):
    import vllm_eval.engine.build as build
    import vllm_eval.models.backends as backends

    monkeypatch.setattr(build, "acquire_engine", lambda *a, **k: pytest.fail("an engine started"))
    monkeypatch.setattr(backends, "load_backend", lambda *a, **k: pytest.fail("a backend loaded"))
    code, err = cli_in_process(*argv)
    assert code == 2, err
    with pytest.raises(VllmEvalError) as caught:
        getattr(vllm_eval, function)(**call, no_cache=True, show_progress=False)
    assert "\n" not in str(caught.value)
    assert err == f"vllm-eval: error: {caught.value}\n"
