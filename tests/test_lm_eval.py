"""lm-evaluation-harness's tasks through our engine, against lm-eval's own code on the same requests.

The real SmolLM2-135M-Instruct (float32, the packaged GGUF) on lm-eval's own task configs pointed at real data that
PyPI packages ship (``make lm-data``; :mod:`vllm_eval.testing.lm_data`): an MMLU subject (one-token options, few-shot
from its dev split), HellaSwag and ARC-Easy (options of several tokens), GSM8K (``generate_until``) and wikitext's
config on real text (``loglikelihood_rolling``). Three runs of the same command line options:

* ``vllm-eval generate`` (:class:`~vllm_eval.models.generator.lmeval.VllmLM` on vLLM's CPU build);
* ``--backend hf``: lm-eval's ``HFLM``, the reference;
* ``lm_eval run --model vllm``: lm-eval's own vLLM backend on the same engine settings.

Per request: log-likelihoods within 1e-4 nats of HFLM's, the same ``is_greedy``, generations equal; per task: equal
metrics. A perturbed copy of the weights moves the reference by more than the bound.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

TASKS = ["mmlu_abstract_algebra", "hellaswag", "arc_easy", "gsm8k", "wikitext"]
LIMIT = 2
#: The call's lm-eval options (and the engine's), the same for the three runs.
OPTIONS = {"num_fewshot": 3, "gen_kwargs": "max_gen_toks=32"}
ENGINE = {"dtype": "float32", "max_model_len": 2048}
#: Bound on |Δ| of one request's log-likelihood against HFLM (float32 on both; the CPU build's kernels differ).
TOLERANCE = 1e-4
#: A document's rolling log-likelihood sums every token's; its |Δ| is bounded per this many nats of it (a
#: continuation's log-likelihood is a few to a few tens of nats; a wikitext page's hundreds to thousands).
ROLLING_NATS = 100.0
#: Requests per cache write in the stopped run (HellaSwag's 4 x LIMIT requests: four chunks).
CHUNK = LIMIT


@pytest.fixture(scope="module")
def include(lm_include):
    """lm-eval's task YAMLs pointed at the local copies (tests/conftest.py)."""
    return lm_include


def _generate(model, include, out, tasks=TASKS, **extra):
    import vllm_eval

    return vllm_eval.generate(
        model=model,
        tasks=tasks,
        include_path=include,
        limit=LIMIT,
        output_dir=str(out),
        show_progress=False,
        **OPTIONS,
        **extra,
    )


@pytest.fixture(scope="module")
def runs(smollm2, include, tmp_path_factory):
    """Ours twice with one output cache: the first computes, the second reads; then HellaSwag with another cache,
    stopped in its third chunk of requests, and run again. One engine serves them all (held open here; the calls'
    generators share it), released before the other runs start theirs."""
    from vllm_eval import VllmGenerator
    from vllm_eval.models.generator import lmeval

    base = tmp_path_factory.mktemp("ours")
    with VllmGenerator(smollm2, raw_prompts=True, show_progress_bar=False, use_tqdm_on_load=False, **ENGINE) as held:
        first = _generate(smollm2, include, base / "out", cache_dir=str(base / "cache"), **ENGINE)
        again = _generate(smollm2, include, base / "again", cache_dir=str(base / "cache"), **ENGINE)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lmeval, "chunk_for", lambda n: CHUNK)
            submit, calls = lmeval.VllmLM._submit_score, []

            def stopped_in_the_third_chunk(self, inputs):
                # later chunks are in the engine already (pipelined); the third is stopped as it is collected
                pending = submit(self, inputs)
                calls.append(len(inputs))
                if len(calls) == 3:

                    def killed():
                        raise KeyboardInterrupt  # what a kill leaves: the chunks stored before it

                    pending.result = killed
                return pending

            patch.setattr(lmeval.VllmLM, "_submit_score", stopped_in_the_third_chunk)
            with pytest.raises(KeyboardInterrupt):
                _generate(smollm2, include, base / "stopped", ["hellaswag"], cache_dir=str(base / "c2"), **ENGINE)
            assert len(calls) == 4, calls  # all four chunks were in flight when the third was stopped ...
            assert not held.llm.llm_engine.has_unfinished_requests()  # ... and the fourth's requests were aborted
            patch.setattr(lmeval.VllmLM, "_submit_score", submit)
            resumed = _generate(smollm2, include, base / "resumed", ["hellaswag"], cache_dir=str(base / "c2"), **ENGINE)
        chat = _generate(smollm2, include, base / "chat", CHAT_TASKS, no_cache=True, **CHAT, **ENGINE)
    return first, again, resumed, chat


#: Tasks and options of the chat-template run: a multiple-choice and a generation task, few-shot as turns.
CHAT_TASKS = ["arc_easy", "gsm8k"]
CHAT = {"apply_chat_template": True, "fewshot_as_multiturn": True, "system_instruction": "Answer briefly."}


@pytest.fixture(scope="module")
def ours(runs):
    return runs[0]


@pytest.fixture(scope="module")
def reference(smollm2, include, tmp_path_factory, ours):
    return _generate(smollm2, include, tmp_path_factory.mktemp("hf") / "out", backend="hf", no_cache=True)


@pytest.fixture(scope="module")
def peer(smollm2, include, tmp_path_factory, reference):
    """lm-eval's own command line with its ``vllm`` model on the engine settings ours ran with (the CPU build's
    float32, eager mode and KV-cache reserve), its files read back."""
    from vllm_eval.engine.args import CPU_KV_CACHE_BYTES
    from vllm_eval.testing.lm_eval_peer import lm_eval_command, run_lm_eval_cli

    work = tmp_path_factory.mktemp("peer")
    args = {"pretrained": smollm2, **ENGINE, "enforce_eager": True, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    cmd = lm_eval_command("vllm", args, TASKS, work / "out", include_path=include, limit=LIMIT, **OPTIONS)
    run_lm_eval_cli(cmd, work, timeout=900)
    return _read_files(work / "out")


def _read_files(folder: Path) -> dict:
    """lm-eval's files of one run: ``{"results": its results JSON, "samples": {task: [records]}}``."""
    (results,) = list(folder.glob("*/results_*.json"))
    samples = {}
    for path in folder.glob("*/samples_*.jsonl"):
        task = path.name[len("samples_") :].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return {"results": json.loads(results.read_text()), "samples": samples, "folder": results.parent}


def _files(result) -> dict:
    return _read_files(Path(result.lm_eval["results_path"]).parent.parent)


def _responses(samples: list[dict]) -> list:
    """Every request's answer, in order: (log-likelihood, is_greedy), a log-likelihood (rolling) or a text."""
    out = []
    for record in sorted(samples, key=lambda r: r["doc_id"]):
        for resp in record["resps"]:
            value = resp[0] if isinstance(resp, list) and len(resp) == 1 else resp
            if isinstance(value, list) and len(value) == 2 and str(value[1]) in ("True", "False"):
                out.append((float(value[0]), str(value[1]) == "True"))
            elif record.get("target") is not None and isinstance(value, str) and _number(value) is None:
                out.append(value)
            else:
                out.append(float(value) if _number(value) is not None else value)
    return out


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _agreement(a: list, b: list) -> tuple[float, int, int]:
    """(max |Δ| of log-likelihoods, is_greedy differences, text differences) between two runs' answers. A rolling
    log-likelihood (a whole document's, hundreds of tokens summed) counts its |Δ| per :data:`ROLLING_NATS` nats."""
    assert len(a) == len(b) and a
    delta, greedy, texts = 0.0, 0, 0
    for x, y in zip(a, b, strict=True):
        if isinstance(x, tuple):
            delta, greedy = max(delta, abs(x[0] - y[0])), greedy + (x[1] != y[1])
        elif isinstance(x, float):
            delta = max(delta, abs(x - y) / max(1.0, abs(y) / ROLLING_NATS))
        else:
            texts += x != y
    return delta, greedy, texts


def _check_equal(ours: dict, theirs: dict, who: str, tasks: list[str] = TASKS) -> None:
    """Per request within :data:`TOLERANCE` (the same greedy flags and texts), per task equal metrics."""
    for task in tasks:
        delta, greedy, texts = _agreement(_responses(ours["samples"][task]), _responses(theirs["samples"][task]))
        print(f"{task} against {who}: max |delta| {delta:.2e} nats, is_greedy differs {greedy}, texts differ {texts}")
        assert delta < TOLERANCE and greedy == 0 and texts == 0, task
        for key, value in ours["results"]["results"][task].items():
            other = theirs["results"]["results"][task][key]
            if isinstance(value, float) and "stderr" not in key and not isinstance(other, str):
                assert math.isclose(value, other, rel_tol=1e-6, abs_tol=1e-9), (task, key, value, other)
            elif "stderr" not in key:
                assert value == other, (task, key)


def test_every_request_type_equals_lm_eval_hflm(ours, reference):
    """Our engine against lm-eval's HFLM (the reference) on every output type of lm-eval's real configs."""
    mine, theirs = _files(ours), _files(reference)
    types = {t: mine["results"]["configs"][t]["output_type"] for t in TASKS}
    assert set(types.values()) == {"multiple_choice", "generate_until", "loglikelihood_rolling"}
    _check_equal(mine, theirs, "HFLM")
    # lm-eval's own result format: what its tooling and leaderboards read
    for key in ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config"):
        assert key in mine["results"], key
    assert mine["results"]["n-shot"]["mmlu_abstract_algebra"] == 3
    assert mine["results"]["n-samples"]["gsm8k"]["effective"] == LIMIT
    summary = json.loads((mine["folder"].parent / "summary.json").read_text())
    assert summary["task_framework"] == "lm-eval" and summary["timeline"]
    assert {row["task"] for row in summary["scores"]} >= set(TASKS)


def test_chat_templates_render_and_score_as_lm_evals_hflm(runs, smollm2, include, tmp_path):
    """``apply_chat_template`` with few-shot as turns and a system instruction: the contexts lm-eval renders with the
    model's chat template (SmolLM2's ``<|im_start|>`` turns, BOS as lm-eval's vLLM backend leaves it) score as HFLM
    scores the same requests."""
    chat = _files(runs[3])
    theirs = _files(_generate(smollm2, include, tmp_path / "hf", CHAT_TASKS, backend="hf", no_cache=True, **CHAT))
    for task in CHAT_TASKS:
        context = chat["samples"][task][0]["arguments"]["gen_args_0"]["arg_0"]
        assert context.count("<|im_start|>user") == 4 and "<|im_start|>system\nAnswer briefly." in context, context
        assert context == theirs["samples"][task][0]["arguments"]["gen_args_0"]["arg_0"]
    _check_equal(chat, theirs, "HFLM with the chat template", CHAT_TASKS)


def test_compare_runs_bootstraps_lm_evals_per_document_metrics(ours, reference, tmp_path):
    """``compare --runs`` of ours against the HFLM run: the paired bootstrap over each task's per-document metric
    from lm-eval's samples, for the tasks lm-eval averages over documents (not wikitext's perplexities)."""
    import vllm_eval

    folders = [Path(r.lm_eval["results_path"]).parent.parent for r in (ours, reference)]
    comparison = vllm_eval.compare(runs=folders, output_dir=tmp_path, show_progress=False)
    rows = {r["task"]: r for r in comparison.rows if r["config"] != comparison.reference}
    assert set(rows) >= set(TASKS)
    for task in ("mmlu_abstract_algebra", "hellaswag", "arc_easy", "gsm8k"):
        diff = rows[task]["significance"]
        assert "note" not in diff and diff["delta"] == 0 and not diff["significant"], (task, diff)
    assert "note" in rows["wikitext"].get("significance", {"note": "none"})


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="lm-eval's own command line starts a second engine (about 2 minutes on 2 cores, left out of CI for "
    "time); VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_every_request_type_equals_lm_evals_own_vllm_backend(ours, peer):
    """The same requests through lm-eval's own ``vllm`` model (its command line, the same vLLM build and engine
    settings): the same numbers, though ours scores one-token options of a context in one request."""
    _check_equal(_files(ours), peer, "lm-eval's vllm")


def test_a_perturbed_model_fails_the_check(ours, smollm2, tmp_path):
    """HFLM on a copy with one tensor moved by seeded noise: its log-likelihoods leave the bound ours kept."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from safetensors.numpy import load_file, save_file

    copy = tmp_path / "perturbed"
    copy.mkdir()
    for f in Path(smollm2).iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(copy / "model.safetensors"))
    name = "model.layers.10.mlp.down_proj.weight"
    tensors[name] = tensors[name] + np.random.default_rng(0).normal(0, 1e-2, tensors[name].shape).astype(np.float32)
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    records = sorted(_files(ours)["samples"]["mmlu_abstract_algebra"], key=lambda r: r["doc_id"])
    requests, mine = [], []
    for record in records:
        for args, resp in zip(record["arguments"].values(), record["resps"], strict=True):
            requests.append(Instance("loglikelihood", record["doc"], (args["arg_0"], args["arg_1"]), 0))
            mine.append(float(resp[0][0]))
    moved = HFLM(pretrained=str(copy), dtype="float32", device="cpu", batch_size=8).loglikelihood(requests)
    delta = max(abs(a - b[0]) for a, b in zip(mine, moved, strict=True))
    print(f"perturbed reference: max |delta| {delta:.2e} nats (bound {TOLERANCE})")
    assert delta > 100 * TOLERANCE


def test_a_second_run_reads_every_request_from_the_cache(runs):
    """The same call again with the cache: nothing computed, the same numbers in lm-eval's files."""
    ours, again, *_ = runs
    assert ours.cache.stats.hits == 0 and ours.cache.stats.misses > 0
    assert again.cache.stats.hits == ours.cache.stats.misses and again.cache.stats.misses == 0
    _check_equal(_files(again), _files(ours), "the first run")
    assert again.scores == ours.scores


def test_a_stopped_run_started_again_computes_only_what_no_chunk_stored(runs):
    """Stopped in its third chunk, the run stored two (half of HellaSwag's requests); started again it reads those
    and computes the other half, with the first run's numbers."""
    ours, _, resumed, _ = runs
    assert resumed.cache.stats.hits == 2 * CHUNK and resumed.cache.stats.misses == 4 * LIMIT - 2 * CHUNK
    mine, again = _files(ours), _files(resumed)
    delta, greedy, _ = _agreement(_responses(again["samples"]["hellaswag"]), _responses(mine["samples"]["hellaswag"]))
    print(f"resumed against the first run: max |delta| {delta:.2e} nats")  # other batches: float32 rounding
    assert delta < TOLERANCE and greedy == 0
    for key, value in mine["results"]["results"]["hellaswag"].items():
        if isinstance(value, float) and "stderr" not in key:
            assert math.isclose(value, again["results"]["results"]["hellaswag"][key], rel_tol=1e-6), key


def test_lm_eval_options_reach_lm_eval(ours):
    """What the call recorded: lm-eval's config of the run (limit, gen_kwargs) and our engine's options."""
    config = ours.lm_eval["results"]["config"]
    assert config["limit"] == LIMIT and config["gen_kwargs"] == {"max_gen_toks": 32}
    assert config["model_args"]["pretrained"] == os.fspath(ours.model_name)
    assert ours.lm_eval["truncated"] == {"loglikelihood": 0, "generate_until": 0}
