"""Engine replicas (data parallelism): placement, and a real 2-replica pool on the CPU build."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

import numpy as np
import pytest

from vllm_eval.engine.build import EngineError
from vllm_eval.replicas.pool import ReplicaError, plan_replicas
from vllm_eval.testing import row_cosines, score_deltas


def _reading(monkeypatch, free: int, total: int) -> None:
    """The GPU's memory as this process first reads it (:func:`vllm_eval.engine.sizing.first_gpu_memory`), faked."""
    from vllm_eval.engine import sizing

    monkeypatch.setattr(sizing, "_FIRST_READ", {})
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (free, total))


def test_gpu_placement_groups_waves_and_memory_share(monkeypatch):

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    _reading(monkeypatch, 80 * 1024**3, 80 * 1024**3)
    ps = plan_replicas(2, 2, tensor_parallel_size=2, cpu=False, devices=list("0123"))
    share = str(max(1, len(os.sched_getaffinity(0)) // 4))
    assert {p.env["OMP_NUM_THREADS"] for p in ps} == {share}  # image preprocessing: no pool over every core
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in ps] == ["0,1", "0,1", "2,3", "2,3"]
    assert [p.env["VLLM_PORT"] for p in ps] == ["38000", "38100", "38200", "38300"]  # no shared port search
    assert [p.wave for p in ps] == [0, 1, 0, 1]  # replicas sharing a GPU start one after another
    assert {p.engine_kwargs["gpu_memory_utilization"] for p in ps} == {0.45}  # a model of unknown vocabulary
    own = plan_replicas(1, 2, engine_kwargs={"gpu_memory_utilization": 0.3}, cpu=False, devices=["0"])
    assert all("gpu_memory_utilization" not in p.engine_kwargs for p in own)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plan_replicas(2, cpu=False, devices=["4", "6"])] == ["4", "6"]


def test_an_engine_of_this_process_renders_on_several_cores_and_replicas_keep_their_share(monkeypatch):
    from vllm_eval.engine import procenv

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(procenv, "ENV_SET_HERE", set())
    procenv.set_rendering_threads()  # what a GPU engine of this process sets before it starts
    assert os.environ["OMP_NUM_THREADS"] == str(min(procenv.RENDERING_THREADS, len(os.sched_getaffinity(0))))
    share = str(max(1, len(os.sched_getaffinity(0)) // 4))
    assert {p.env["OMP_NUM_THREADS"] for p in plan_replicas(2, 2, cpu=False, devices=list("01"))} == {share}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's, which stands everywhere
    procenv.ENV_SET_HERE.discard("OMP_NUM_THREADS")
    procenv.set_rendering_threads()
    assert os.environ["OMP_NUM_THREADS"] == "3"
    assert all("OMP_NUM_THREADS" not in p.env for p in plan_replicas(2, 2, cpu=False, devices=list("01")))


def test_gpu_replicas_run_their_engine_core_in_process_unless_told(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    ps = plan_replicas(2, cpu=False, devices=["0", "1"])
    assert {p.env["VLLM_ENABLE_V1_MULTIPROCESSING"] for p in ps} == {"0"}
    spanning = plan_replicas(2, tensor_parallel_size=2, cpu=False, devices=list("0123"))
    assert all("VLLM_ENABLE_V1_MULTIPROCESSING" not in p.env for p in spanning)  # not measured: vLLM's default
    from vllm_eval.engine import procenv

    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    monkeypatch.setenv(name, "1")  # set by an engine of this process (a small model's): not the replicas' choice
    monkeypatch.setattr(procenv, "ENV_SET_HERE", procenv.ENV_SET_HERE | {name})
    assert {p.env[name] for p in plan_replicas(2, cpu=False, devices=["0", "1"])} == {"0"}
    monkeypatch.setattr(procenv, "ENV_SET_HERE", procenv.ENV_SET_HERE - {name})  # the user's choice stands
    assert all(name not in p.env for p in plan_replicas(2, cpu=False, devices=["0", "1"]))


def test_pooling_replicas_sharing_a_gpu_start_together_with_a_kv_budget(monkeypatch):
    from vllm_eval.utils.modelinfo import packaged_model_path

    _reading(monkeypatch, 79 * 1024**3, 80 * 1024**3)
    model = packaged_model_path()  # MiniLM-L6: 6 layers, 12 heads of 32
    pooling = {"runner": "pooling", "dtype": "float16"}
    ps = plan_replicas(1, 4, engine_kwargs=pooling, cpu=False, devices=["0"], model=model)
    assert [p.wave for p in ps] == [0, 0, 0, 0]
    # one step's tokens (131072 + 16 per sequence for 1024 sequences) x 2 (K, V) x 6 x 12 x 32 x 2 bytes
    assert {p.engine_kwargs["kv_cache_memory_bytes"] for p in ps} == {(131072 + 16 * 1024) * 2 * 6 * 12 * 32 * 2}
    # 0.9 of the GPU, less the room for the command's scoring (5 processes x 2 GiB, and half the rest), in 4 parts
    assert {p.engine_kwargs["gpu_memory_utilization"] for p in ps} == {0.2062}  # (80 - 4 - 10) / 80 / 4
    _reading(monkeypatch, 40 * 1024**3, 80 * 1024**3)  # another program holds half
    busy = plan_replicas(1, 4, engine_kwargs=pooling, cpu=False, devices=["0"], model=model)
    assert {p.engine_kwargs["gpu_memory_utilization"] for p in busy} == {0.1} and busy[0].wave == 0  # (40 - 8) / 80 / 4
    _reading(monkeypatch, 80 * 1024**3, 80 * 1024**3)
    fp8 = plan_replicas(
        1,
        2,
        engine_kwargs={**pooling, "kv_cache_dtype": "fp8", "max_num_batched_tokens": 4096, "max_num_seqs": 8},
        cpu=False,
        devices=["0"],
        model=model,
    )
    assert {p.engine_kwargs["kv_cache_memory_bytes"] for p in fp8} == {(4096 + 16 * 8) * 2 * 6 * 12 * 32}
    # the cap: half the replica's share of the GPU
    _reading(monkeypatch, 1024**3, 1024**3)
    capped = plan_replicas(1, 2, engine_kwargs=pooling, cpu=False, devices=["0"], model=model)
    # a GPU of 1 GiB: the least share (0.05), and a step shrunk until its activations fit (1,024 tokens, 64 sequences)
    assert {p.engine_kwargs["gpu_memory_utilization"] for p in capped} == {0.05}
    assert {p.engine_kwargs["kv_cache_memory_bytes"] for p in capped} == {(1024 + 16 * 64) * 2 * 6 * 12 * 32 * 2}
    # the user's own memory settings, a generation runner or an unreadable config: one after another
    for kwargs, m in (
        ({**pooling, "gpu_memory_utilization": 0.2}, model),
        ({"runner": "generate"}, model),
        (pooling, "/nonexistent/model"),
    ):
        ps = plan_replicas(1, 2, engine_kwargs=kwargs, cpu=False, devices=["0"], model=m)
        assert [p.wave for p in ps] == [0, 1] and all("kv_cache_memory_bytes" not in p.engine_kwargs for p in ps)
    own = plan_replicas(1, 3, engine_kwargs={"kv_cache_memory_bytes": 1 << 30}, cpu=False, devices=["0"])
    assert [p.wave for p in own] == [0, 0, 0]


def test_cpu_placement_splits_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    ps = plan_replicas(2, cpu=True, devices=["0", "1", "2", "3", "4"])
    assert [p.env["VLLM_CPU_OMP_THREADS_BIND"] for p in ps] == ["0,1", "2,3"]
    assert [p.env["OMP_NUM_THREADS"] for p in ps] == ["2", "2"]  # no OpenMP pool spans the other's cores
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert all("OMP_NUM_THREADS" not in p.env for p in plan_replicas(2, cpu=True, devices=["0", "1"]))
    assert all(p.engine_kwargs == {"kv_cache_memory_bytes": 1 << 30} for p in ps)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"data_parallel_size": 3, "cpu": False, "devices": ["0", "1"]}, "needs 3 GPUs; 2 visible"),
        ({"data_parallel_size": 1, "tensor_parallel_size": 2, "cpu": False, "devices": ["0"]}, "needs 2 GPUs"),
        ({"data_parallel_size": 3, "cpu": True, "devices": ["0", "1"]}, "at least 3 CPU cores"),
        ({"data_parallel_size": 0, "cpu": True}, "data_parallel_size must be a positive int"),
        ({"data_parallel_size": 2, "replicas_per_gpu": -1, "cpu": False, "devices": ["0"]}, "replicas_per_gpu"),
    ],
)
def test_bad_placements_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_replicas(**kwargs)


@pytest.fixture(scope="module")
def dp_encoder():
    from vllm_eval import VllmEncoder

    # Small chunks so both replicas get several jobs from this short text list.
    enc = VllmEncoder(data_parallel_size=2, chunk_size=40, show_progress_bar=False)
    yield enc
    enc.close()


def _texts() -> list[str]:
    from vllm_eval.tasks.data import lee_documents, word_pairs

    words = [w for a, b, _ in word_pairs("simlex999.txt")[:150] for w in (a, b)]
    texts = list(lee_documents()) + words + list(lee_documents()[:10])  # repeats: dedup must map rows back
    rng = np.random.default_rng(0)
    return [texts[i] for i in rng.permutation(len(texts))]


def test_two_replicas_match_one_engine_in_order(dp_encoder, vllm_encoder):
    texts = _texts()
    got = dp_encoder.encode_texts(texts)
    ref = vllm_encoder.encode_texts(texts)
    cos = row_cosines(got, ref)
    print(
        f"\n2 replicas vs 1 engine: min cosine {cos.min():.8f} over {len(texts)} texts; "
        f"jobs {dp_encoder.pool.jobs_done}"
    )
    assert got.shape == ref.shape and cos.min() >= 0.9999
    assert all(n > 0 for n in dp_encoder.pool.jobs_done.values())  # both replicas worked
    ready = dp_encoder.pool.ready_seconds  # CPU replicas start together: both within the pool's start
    assert sorted(ready) == [0, 1] and 0 < max(ready.values()) <= dp_encoder.pool.start_seconds
    assert dp_encoder.counters.engine_start_seconds == dp_encoder.pool.start_seconds
    # On the timeline: one engine lane per replica, from the start call to that replica's ready.
    from vllm_eval.utils.timeline import current

    lanes = {p.detail: p for p in current().phases if p.name == "engine" and str(p.detail).startswith("replica")}
    pool = dp_encoder.pool
    for i in (0, 1):
        lane = lanes[f"replica {i}"]
        assert lane.start <= pool.started_at and lane.end == pytest.approx(pool.started_at + ready[i], abs=1e-6)


def test_replicas_tokenize_their_share_counted_and_cached_as_one_engine(dp_encoder, vllm_encoder, tmp_path):
    from unittest import mock

    from vllm_eval.models.cache import OutputCache

    long = ["many words " * 400, "stocks fell " * 300]  # over the 256-token limit: cut, counted, warned once each
    texts = [*_texts()[:120], *long]
    for enc in (dp_encoder, vllm_encoder):
        enc.counters.tokens = enc.counters.truncated = 0
    # The parent's own tokenizer is never called: each replica tokenizes its part of a chunk.
    with mock.patch.object(dp_encoder.tokenizer, "with_truncated", side_effect=AssertionError("parent tokenized")):
        with pytest.warns(UserWarning, match="2 of .* exceeded 256 tokens"):
            got = dp_encoder.encode_texts(texts)
    with pytest.warns(UserWarning, match="2 of .* exceeded 256 tokens"):
        ref = vllm_encoder.encode_texts(texts)
    assert row_cosines(got, ref).min() >= 0.9999
    assert dp_encoder.counters.tokens == vllm_encoder.counters.tokens > 0
    assert dp_encoder.counters.truncated == vllm_encoder.counters.truncated == 2
    # One cache serves both: the replicas fill it, the single engine computes nothing.
    assert dp_encoder.identity() == vllm_encoder.identity()
    cache = OutputCache(tmp_path / "outputs.sqlite")
    try:
        dp_encoder.use_cache(cache)
        vllm_encoder.use_cache(cache)
        dp_encoder.encode_texts(texts)
        hits = vllm_encoder.counters.cache_hits
        again = vllm_encoder.encode_texts(texts)
        assert vllm_encoder.counters.cache_hits - hits == len(set(texts))
        assert np.array_equal(again, dp_encoder.encode_texts(texts))
    finally:
        dp_encoder.use_cache(None)
        vllm_encoder.use_cache(None)
        cache.close()


def test_calls_from_two_threads_overlap_on_replicas_with_their_own_rows_and_counts(dp_encoder):
    import threading
    from unittest import mock

    from vllm_eval.utils.telemetry import task_counters

    texts = _texts()
    halves = [texts[: len(texts) // 2], texts[len(texts) // 2 :] + ["a text of the second call only"]]
    alone, counted = [], []
    for half in halves:
        with task_counters() as own:
            alone.append(dp_encoder.encode_texts(half))
        counted.append(own.tokens)
    active, got, own_counts = [], [None, None], [None, None]
    original = dp_encoder.submit_split

    def recorded(*args, **kwargs):  # calls in progress when a chunk is handed over
        active.append(dp_encoder._active)
        return original(*args, **kwargs)

    go = threading.Barrier(2)

    def call(i: int) -> None:
        go.wait()
        with task_counters() as own:
            got[i] = dp_encoder.encode_texts(halves[i])
        own_counts[i] = own.tokens

    with mock.patch.object(dp_encoder, "submit_split", recorded):
        threads = [threading.Thread(target=call, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert dp_encoder._overlaps_calls() and max(active) == 2  # the replicas tokenize: the two calls overlapped
    for i in (0, 1):  # each call its own rows, bit for bit, and its own tokens
        assert np.array_equal(got[i], alone[i])
        assert own_counts[i] == counted[i] > 0


def test_replicas_count_the_devices_their_mfu_divides_by(dp_encoder, vllm_encoder):
    assert dp_encoder.accelerators == 2 and vllm_encoder.accelerators == 1


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="16 s of CI's 30 minutes: the two replicas' vectors equal one engine's, in order, in CI"
    " (test_two_replicas_match_one_engine_in_order); VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_two_replicas_give_the_same_task_scores(dp_encoder, vllm_encoder):
    deltas = score_deltas(dp_encoder, vllm_encoder, ["LeeDocSimilarity", "WordSim353", "PangLeePolarity"])
    print("\n2 replicas vs 1 engine |delta main score|:", deltas)
    assert max(deltas.values()) <= 1e-4


@contextmanager
def _replica_1_killed_after_two_jobs(pool, timeout: float = 120.0):
    """Runs the block while replica 1 of ``pool`` is SIGKILLed once two more jobs are done (its exit warned of);
    yields the jobs done before."""
    import threading
    import time

    done_before = sum(pool.jobs_done.values())

    def kill_after_first_jobs() -> None:
        deadline = time.monotonic() + timeout
        while sum(pool.jobs_done.values()) < done_before + 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(pool._replicas[1].proc.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_after_first_jobs, daemon=True)
    killer.start()
    with pytest.warns(RuntimeWarning, match=r"replica 1 \(cores .*\) exited with code -9"):
        yield done_before
    killer.join(10)


def test_a_dead_replica_costs_time_not_results(dp_encoder, vllm_encoder):
    # Next to last test using the fixture: it kills one of its replicas, mid-run (the next one ends the other).
    pool = dp_encoder.pool
    texts = [f"text number {i}" for i in range(400)]
    with _replica_1_killed_after_two_jobs(pool) as done_before:
        got = dp_encoder.encode_texts(texts)
    assert list(pool.state().lost) == [1] and sum(pool.jobs_done.values()) > done_before + 2
    np.testing.assert_allclose(got, vllm_encoder.encode_texts(texts), atol=1e-5)


def test_a_replica_whose_engine_stalls_exits_3_and_is_lost(dp_encoder):
    # Last test using the fixture (it leaves no replica): after the test above (replica 1 killed), replica 0 gets
    # the job, and its "stalled engine" ends its process with the watchdog's exit code; nothing is left to run the
    # job again. Alone (-k), both replicas take the job in turn and both exit 3.
    from vllm_eval.testing.harness import stalled_job

    pool = dp_encoder.pool
    with pytest.warns(RuntimeWarning, match=r"replica 0 \(cores .*\) exited with code 3"):
        future = pool.submit(stalled_job, "tiny")
        with pytest.raises(ReplicaError, match="every replica has been lost"):
            future.result(timeout=60)
    assert sorted(pool.state().lost) == [0, 1]


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="30 s of CI's 30 minutes: a failing replica is named and lost in CI (the dead and stalled replica"
    " tests above); VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_replica_that_cannot_start_is_named():
    from vllm_eval import VllmEncoder

    with pytest.raises(ReplicaError, match=r"(?s)replica \d \(cores .*\) failed to start: .*max_model_len"):
        VllmEncoder(data_parallel_size=2, max_model_len=100000, show_progress_bar=False)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["run", "--backend", "st", "--data-parallel-size", "2"], "need --backend vllm"),
        (
            ["generate", "--backend", "hf", "--model", "x", "--tasks", "Digits", "--data-parallel-size", "2"],
            "need --backend vllm",
        ),
        (["run", "--endpoint", "http://127.0.0.1:1"], "--endpoint is for --backend remote"),
    ],
)
def test_cli_refuses_replicas_where_they_do_not_apply(argv, match, cli_in_process):
    code, err = cli_in_process(*argv)
    assert code == 2 and match in err and "Traceback" not in err, err[-1500:]


@pytest.mark.slow
def test_two_generator_replicas_match_one_engine(generator, test_models, lm_include):
    from vllm_eval.models.generator import VllmGenerator
    from vllm_eval.utils.errors import UsageError

    # chunk_size 2 per replica: ten samples make three steps of two jobs each.
    with VllmGenerator(
        str(test_models["qwen3"]),
        data_parallel_size=2,
        sampling={"max_tokens": 12},
        chunk_size=2,
        show_progress_bar=False,
    ) as dp:
        assert dp.llm is None and len(dp.pool) == 2 and dp.chunk_size == 4
        assert dp.identity() == generator.identity()  # same outputs, so one cache serves both
        samples = [(f"Question {i}: what is {i} times {i + 1}?", ()) for i in range(10)]
        got, ref = dp.generate(samples), generator.generate(samples)
        assert [(g.prompt, g.output, g.prompt_tokens, g.output_tokens) for g in got] == [
            (g.prompt, g.output, g.prompt_tokens, g.output_tokens) for g in ref
        ]
        assert len({g.output for g in got}) > 1 and all(n > 0 for n in dp.pool.jobs_done.values())
        # Both log-likelihood paths: one-token options of one context together, the others via prompt_logprobs.
        contexts, conts = ["Is 2 > 1?", "Is 2 > 1?", "Which is it?", "Say it."], ["yes", "no", " positive", "x y"]
        np.testing.assert_allclose(
            dp.loglikelihoods(contexts, conts), generator.loglikelihoods(contexts, conts), atol=1e-5
        )
        # vLLM's refusal inside a replica is the same one-line error as in-process.
        with pytest.raises(UsageError, match="vLLM refused a prompt"):
            dp.generate([("word " * 5000, ())])
        with pytest.raises(UsageError, match="vLLM refused a prompt"):
            generator.generate([("word " * 5000, ())])
        _lm_eval_survives_a_lost_replica(dp, generator, lm_include)


def _lm_eval_survives_a_lost_replica(dp, generator, include):
    """lm-eval's requests (HellaSwag's multi-token log-likelihoods, in chunks of 8, each split over the replicas)
    with replica 1 killed after its first jobs: the other runs the rest, and the metrics are one engine's."""

    import lm_eval
    from lm_eval.tasks import TaskManager

    from vllm_eval import VllmLM
    from vllm_eval.tasks.lmeval_index import build_manager

    def hellaswag(g):
        lm = VllmLM(generator=g, chunk_size=8, show_progress_bar=False)
        # TaskManager(include_path=include) without its 8 s walk of lm-eval's task folders (test_lm_eval_index.py)
        manager = build_manager(TaskManager, [include])
        out = lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"], limit=16, task_manager=manager, verbosity="ERROR")
        return {k: v for k, v in out["results"]["hellaswag"].items() if isinstance(v, float)}

    pool, one = dp.pool, hellaswag(generator)
    with _replica_1_killed_after_two_jobs(pool):
        two = hellaswag(dp)
    assert list(pool.state().lost) == [1] and pool.jobs_done[0] > 0
    assert two.keys() == one.keys() and all(two[k] == pytest.approx(one[k], abs=1e-9) for k in one), (two, one)


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="22 s of CI's 30 minutes: the replica pool runs in CI for the encoder and generator (this module) and the"
    " classifier, reward model and token kinds (tests/test_replicas_kinds.py); VLLMEVAL_FULL_TESTS=1 runs it",
)
@pytest.mark.slow
def test_two_reranker_replicas_match_one_engine(vllm_cross):
    from vllm_eval.models.reranker import VllmReranker
    from vllm_eval.tasks.data import lee_documents

    docs = list(lee_documents()[:30])
    queries = [f"query {i % 7}: " + docs[(i * 3) % 30][:40] for i in range(30)]
    with VllmReranker(str(vllm_cross.model), data_parallel_size=2, chunk_size=4, show_progress_bar=False) as dp:
        assert dp.llm is None and len(dp.pool) == 2 and dp.chunk_size == 8
        assert dp.identity() == vllm_cross.identity() and dp.mode == vllm_cross.mode == "cross-encoder"
        got = dp.score_pairs(queries, docs)
        np.testing.assert_allclose(got, vllm_cross.score_pairs(queries, docs), atol=1e-5)
        assert len(set(np.round(got, 4))) > 10 and all(n > 0 for n in dp.pool.jobs_done.values())


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="63 s of CI's 30 minutes, and its 3 s bound on when task processes begin loading failed once under a busy"
    " CI (loads 6 s after the replicas were ready); VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_a_parent_of_replicas_imports_no_vllm_and_keeps_each_start_by_step(tmp_path):
    """The parent has no engine: neither the replicas' tokenizer (vLLM's wrapper pickles as a call into vLLM) nor
    the summary's engine options may import vLLM there; each replica's start is kept by step. Tasks at once are
    scored in processes that load their data while the replicas start."""
    import json
    import subprocess
    import sys

    code = (
        "import sys, json\n"
        "from vllm_eval.cli import main\n"
        f"rc = main(['run', '--tasks', 'WordSim353,SimLex999', '--data-parallel-size', '2', '--no-progress',"
        f" '--no-cache', '--dtype', 'float32', '--concurrent-tasks', '2', '--output-dir', {str(tmp_path)!r}])\n"
        "print(json.dumps({'rc': rc, 'vllm': 'vllm' in sys.modules, 'mteb': 'mteb' in sys.modules,"
        " 'sentence_transformers': 'sentence_transformers' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # The two tasks were scored in processes of their own (which import sentence-transformers for mteb), each
    # loading its data while the replicas started.
    assert seen == {"rc": 0, "vllm": False, "mteb": True, "sentence_transformers": False}, out.stderr[-2000:]
    assert "leaked semaphore" not in out.stderr  # replicas and task processes leave no tqdm lock registered
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["task"]: r["status"] for r in summary["scores"]} == {"WordSim353": "computed", "SimLex999": "computed"}
    ready = max(p["end"] for p in summary["timeline"]["phases"] if p["phase"] == "engine")
    # Each process was started with the replicas, so its load began about when they were ready or before (under a
    # busy CI its imports took as long as the replicas' start: loads began 0.35 and 0.69 s after). Started only
    # once the replicas were ready, a task process could not begin its load within 3 s: importing mteb and
    # sentence-transformers alone takes 7.6 s on this project's idle 2-core machine.
    loads = {p["task"]: p["start"] for p in summary["timeline"]["phases"] if p["phase"] == "load"}
    assert set(loads) == {"WordSim353", "SimLex999"} and max(loads.values()) < ready + 3.0, (loads, ready)
    # What each replica's engine was built with: the replicas' own KV-cache reserve, not one engine's 2 GiB.
    assert summary["engine_options_in_force"]["kv_cache_memory_bytes"] == 1 << 30
    replicas = summary["replicas"]
    for steps in replicas["start_breakdown"].values():
        assert set(steps) == {"process", "interpreter", "imports", "waiting", "engine", "setup"}
        assert steps["engine"] > 0 and steps["interpreter"] < steps["imports"] + steps["engine"]
    assert len(replicas["start_breakdown"]) == 2
    # Started with the command (replicas_ahead.start_ahead): launched before the command's own imports ended.
    launched = min(p["start"] for p in summary["timeline"]["phases"] if p["phase"] == "engine")
    imported = max(p["end"] for p in summary["timeline"]["phases"] if p["phase"] == "imports")
    assert launched < imported, summary["timeline"]["phases"][:6]


@pytest.mark.parametrize(
    "argv, layout",
    [
        (["run", "--data-parallel-size", "2"], (2, 1, 1)),
        (["-v", "generate", "--replicas-per-gpu=4", "--model", "m"], (1, 4, 1)),
        (["classify", "--data-parallel-size", "2", "--tensor-parallel-size", "2"], (2, 1, 2)),
        (["run"], None),  # one engine, in the command's process
        (["run", "--data-parallel-size", "2", "--backend", "st"], None),
        (["run", "--data-parallel-size", "2", "--ray-address", "auto"], None),  # Ray places them
        (["run", "--data-parallel-size", "2", "--endpoint", "http://h:8000"], None),
        (["bench", "--data-parallel-size", "2"], None),  # each backend runs in a process of its own
        (["run", "--data-parallel-size", "x"], None),  # the command's parser says what is wrong
        (["run", "--data-parallel-size", "2", "--help"], None),
    ],
)
def test_the_replicas_to_start_ahead_are_read_from_the_command_line(argv, layout, monkeypatch):
    from vllm_eval.replicas.ahead import layout_of

    assert layout_of(argv) == layout
    monkeypatch.setenv("VLLMEVAL_START_AHEAD", "0")
    assert layout_of(["run", "--data-parallel-size", "2"]) is None


def test_replicas_started_ahead_are_stopped_when_the_command_fails_or_plans_otherwise(monkeypatch, cli_in_process):
    """A command that stops at a bad option leaves none running; a pool planned elsewhere stops them and starts
    its own."""
    import multiprocessing
    import time

    from vllm_eval.replicas import ahead as replicas_ahead

    before = set(multiprocessing.active_children())  # the session's replicas (dp_encoder) stay

    def replicas():
        return [
            p for p in multiprocessing.active_children() if p.name.startswith("vllm-eval-replica-") and p not in before
        ]

    spawned = []
    spawn = replicas_ahead.spawn
    monkeypatch.setattr(replicas_ahead, "spawn", lambda *a: spawned.append(a[3]) or spawn(*a))
    started = time.monotonic()
    code, err = cli_in_process("run", "--data-parallel-size", "2", "--tasks", "NoSuchTask", "--no-progress")
    assert code == 2 and "NoSuchTask" in err
    assert spawned == [0, 1] and replicas() == [] and time.monotonic() - started < 60
    replicas_ahead.start_ahead(["run", "--data-parallel-size", "2"])
    assert len(replicas()) == 2
    placements = plan_replicas(1, 1, cpu=True, devices=["0"])  # one replica on core 0: not what was started
    assert replicas_ahead.take_ahead(placements) is None and replicas() == []


def _engine_alone(core_process: str, with_worker: bool) -> bool:
    """In a fresh process: :func:`engine_in_this_process` with ``VLLM_ENABLE_V1_MULTIPROCESSING=core_process`` and,
    if asked, a child process alive (as an engine's worker would be)."""
    import multiprocessing
    import time

    from vllm_eval.replicas.process import engine_in_this_process

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = core_process
    worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,)) if with_worker else None
    if worker is not None:
        worker.start()
    try:
        return engine_in_this_process()
    finally:
        if worker is not None:
            worker.kill()
            worker.join()


def test_a_replica_skips_vllms_shutdown_only_when_its_engine_is_all_in_its_process():
    """Told to stop, a replica whose engine core runs in its process and started no worker exits without vLLM's
    shutdown (its exit frees the engine); an engine core or a worker in another process is shut down by vLLM."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        alone = [pool.submit(_engine_alone, core, worker).result(timeout=120) for core, worker in
                 (("0", False), ("1", False), ("0", True))]  # fmt: skip
    assert alone == [True, False, False]


def test_replicas_start_after_what_released_in_process_engines_left_is_collected(monkeypatch):
    """An in-process GPU engine released before replicas start: its leftovers (vLLM 0.26 keeps an 8B's weights in
    cycles) are collected before the replicas are placed, or they count against the replicas' GPU (seen on two H100s:
    replica 0 refused for 62.77 of 79.18 GiB free)."""
    from vllm_eval.engine import build
    from vllm_eval.models.vllm_backend import VllmBackend

    collected = []
    monkeypatch.setattr(build, "_RELEASED_ON_GPU", [True])
    monkeypatch.setattr(build, "_collect", lambda refreeze: collected.append(refreeze))
    backend = VllmBackend.__new__(VllmBackend)
    backend.engine_kwargs = {}
    with pytest.raises(
        ValueError, match="at least 64 CPU cores"
    ):  # planning fails on this machine after the collection
        backend.start(type("Ref", (), {"path": "m"})(), setup=None, data_parallel_size=64)
    assert collected == [False] and build._RELEASED_ON_GPU == [False]


@pytest.mark.parametrize(
    ("failures", "error", "tried", "outcome"),
    [
        (2, "The server socket has failed to listen ... code: -98, name: EADDRINUSE", 3, "engine"),
        (9, "EADDRINUSE", 3, "could not start an engine for 'm': EADDRINUSE"),  # PORT_RETRIES + 1 tries, then named
        (9, "no such architecture", 1, "no such architecture"),  # another failure: at once
    ],
)
def test_an_engine_start_that_lost_its_port_is_tried_again_on_the_next_ports(
    monkeypatch, failures, error, tried, outcome
):
    """torch.distributed's store found the port vLLM had checked taken (EADDRINUSE, seen with 16 Ray actors on one
    node): the start is tried again PORT_RETRIES times with VLLM_PORT moved, then named; other failures at once."""
    import vllm

    from vllm_eval.engine import build

    ports = []

    def start(model, **kwargs):
        ports.append(os.environ["VLLM_PORT"])
        if len(ports) <= failures:
            raise RuntimeError(error)
        return "engine"

    monkeypatch.setenv("VLLM_PORT", "38400")
    monkeypatch.setattr(vllm, "LLM", start)
    if outcome == "engine":
        assert build._start_llm("m", {}, []) == "engine"
    else:
        with pytest.raises(EngineError, match=outcome):
            build._start_llm("m", {}, [])
    assert ports == [str(38400 + build.PORT_STEP * i) for i in range(tried)]
    assert tried <= build.PORT_RETRIES + 1
