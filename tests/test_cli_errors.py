"""Bad input, probed the way a careful new user would: each case is one line on stderr and exit code 2
(or 1 for a server that fails while running), found before any engine starts.

The command runs in this process (``cli.main``) with ``vllm.LLM`` replaced by a function that fails
the test, so a case that reached an engine start cannot pass.
"""

from __future__ import annotations

import socket
import time

import pytest

from vllm_eval.testing import JsonStubHandler, stub_server, url_of
from vllm_eval.utils.modelinfo import packaged_model_path

MINILM = packaged_model_path()


class _Liar(JsonStubHandler):
    """A server that lists a model, then answers /v1/embeddings with the malformed reply ``server.mode`` names."""

    def do_GET(self):
        self.send_json(200, {"data": [{"id": "liar/model", "max_model_len": 64}]})

    def do_POST(self):
        body = self.read_json()
        n = len(body.get("input") or body.get("messages") or [])  # messages: asked whether it takes images
        mode = self.server.mode
        if mode == "no-data":
            reply: object = {"object": "list"}
        elif mode == "short":
            reply = {"data": [{"index": i, "embedding": [0.1, 0.2]} for i in range(max(n - 1, 0))]}
        elif mode == "no-embedding":
            reply = {"data": [{"index": i} for i in range(n)]}
        else:
            return self.send_json(200, b"<html>not json</html>")
        self.send_json(200, reply)


@pytest.fixture(scope="module")
def liar():
    with stub_server(_Liar, mode="no-data") as srv:
        yield srv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def run_main(cli_in_process, monkeypatch):
    """``main(argv)`` in this process, with no engine allowed to start."""
    import vllm

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started")

    monkeypatch.setattr(vllm, "LLM", no_engine)
    return cli_in_process


def _paths(tmp_path):
    afile = tmp_path / "a-file.txt"
    afile.write_text("x")
    empty = tmp_path / "not-a-model"
    empty.mkdir(exist_ok=True)
    # Model folders users have: a config.json that is not JSON, one with no weights beside it.
    broken = tmp_path / "broken-config"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text('{"architectures": ["BertModel"],\n "hidden_size": 384,,\n}')
    (broken / "model.safetensors").write_bytes(b"")
    bare = tmp_path / "no-weights"
    bare.mkdir(exist_ok=True)
    (bare / "config.json").write_text('{"architectures": ["BertModel"]}')
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    paths = {"FILE": str(afile), "UNDER_FILE": str(afile / "sub"), "EMPTY_DIR": str(empty), "GGUF": str(gguf)}
    return {**paths, "BROKEN_CONFIG": str(broken), "NO_WEIGHTS": str(bare)}


CASES = [
    # paths
    (["run", "--output-dir", "{FILE}"], "is a file, not a directory"),
    (["run", "--output-dir", "{UNDER_FILE}"], "cannot be created"),
    (["run", "--output-dir", ""], "--output-dir is empty"),
    (["run", "--model", "/no/such/model"], "model path '/no/such/model' does not exist"),
    (["run", "--model", "{FILE}"], "is a file; give the model's directory"),
    (["generate", "--model", "{GGUF}", "--tasks", "PangLeePolarity"], "is a GGUF file; give a model directory"),
    (["run", "--model", "{EMPTY_DIR}"], "has no config.json"),
    (["run", "--model", "{BROKEN_CONFIG}"], "config.json:2: not valid JSON: expecting property name enclosed in"),
    (["run", "--model", "{NO_WEIGHTS}"], "has a config.json but no weights (*.safetensors, *.bin, *.pt ...)"),
    (["generate", "--model", "{NO_WEIGHTS}", "--tasks", "PangLeePolarity"], "has a config.json but no weights"),
    (["run", "--model", "someorg/not-cached-model"], "not in the Hugging Face cache, and the hub is offline"),
    (["rerank", "--reranker", "/no/such/reranker"], "'/no/such/reranker' does not exist"),
    (["rerank", "--reranker", MINILM, "--first-stage", "/no/first"], "'/no/first' does not exist"),
    (
        ["generate", "--model", MINILM, "--tasks", "PangLeePolarity", "--chat-template", "tpl/none.jinja"],
        "neither a file nor a Jinja template",
    ),
    # task names
    (["run", "--tasks", ""], "--tasks names no task"),
    (["run", "--tasks", ",,"], "--tasks names no task"),
    (["run", "--tasks", "LeeDocSimilarty"], "close names: LeeDocSimilarity"),
    (["run", "--tasks", "WordSim353", "wordsim353,WordSim353"], "names WordSim353 more than once"),
    (["run", "--tasks", "STS12"], "task STS12 needs dataset mteb/sts12-sts"),
    (["run", "--tasks", "MTEB(eng, v2)"], "task ArguAna needs dataset mteb/arguana"),  # runs the benchmark
    (["rerank", "--reranker", MINILM, "--tasks", "WordSim353"], "needs retrieval tasks; WordSim353 is STS"),
    (["generate", "--model", MINILM], "--tasks is required"),
    (["generate", "--model", MINILM, "--tasks", "hellaswg"], "unknown task 'hellaswg'"),
    (["generate", "--model", MINILM, "--tasks", "hellaswg"], "(closest: hellaswag"),
    (["generate", "--model", MINILM, "--tasks", "mmlu_anatomy"], "task 'mmlu_anatomy': its data could not be loaded"),
    (["generate", "--model", MINILM, "--tasks", "mmlu_anatomy"], "cais/mmlu"),
    (["generate", "--model", MINILM, "--tasks", "mmlu_anatomy", "--limit", "1.5"], "--limit: must be a count >= 1"),
    (["generate", "--model", MINILM, "--tasks", "Digits", "--num-fewshot", "2"], "lm-eval's options, for lm-eval's"),
    (
        ["generate", "--model", MINILM, "--tasks", "gsm8k", "--backend", "remote"],
        "--backend remote needs at least one --endpoint URL",
    ),
    (["generate", "--tasks", "PangLeePolarity"], "--model is required"),
    # JSON options
    (["run", "--prompts", "{bad"], "--prompts: is not valid JSON"),
    (["run", "--prompts", "[1, 2]"], "--prompts: must be a JSON object"),
    (["run", "--prompts", '{"query": 1}'], "prompts['query'] must map str to str"),
    (["run", "--hf-overrides", "yes"], "--hf-overrides: is not valid JSON"),
    (["run", "--pooler-config", "3"], "--pooler-config: must be a JSON object"),
    # numbers
    (["run", "--max-model-len", "0"], "--max-model-len: must be a positive integer, got '0'"),
    (["run", "--max-model-len", "1e3"], "--max-model-len: must be a positive integer"),
    (["run", "--gpu-memory-utilization", "1.5"], "must be a number in (0, 1]"),
    (["run", "--dimensions", "-3"], "--dimensions: must be a positive integer"),
    (["run", "--stall-timeout", "-1"], "--stall-timeout: must be a number >= 0, got '-1'"),
    (["run", "--progress-timeout", "-5"], "--progress-timeout: must be a number >= 0, got '-5'"),
    (["run", "--backend", "st", "--stall-timeout", "60"], "--backend st does not take vLLM engine options"),
    (["run", "--kv-cache-memory-bytes", "-5"], "--kv-cache-memory-bytes must be a positive integer, got -5"),
    # not an EngineArgs field on any vLLM this runs on (0.26 to 0.33)
    (["run", "--enforce-eager", "--swap-space", "4"], "unknown vLLM engine option(s): 'swap_space'"),
    (["run", "--dtype", "float64"], "--dtype must be one of auto"),
    (["rerank", "--reranker", MINILM, "--top-k", "0"], "--top-k: must be a positive integer"),
    (["generate", "--model", MINILM, "--tasks", "Digits", "--limit", "0"], "--limit: must be a count >= 1"),
    (
        ["generate", "--model", MINILM, "--tasks", "Digits", "--max-missing", "-1"],
        "--max-missing: must be a number >= 0",
    ),
    (["generate", "--model", MINILM, "--tasks", "Digits", "--top-p", "0"], "--top-p: must be a number in (0, 1]"),
    (
        ["generate", "--model", MINILM, "--tasks", "PangLeePolarity", "--chat-template-kwargs", "[1]"],
        "--chat-template-kwargs: must be a JSON object",
    ),
    (
        ["generate", "--model", MINILM, "--tasks", "PangLeePolarity", "--raw-prompts"]
        + ["--chat-template-kwargs", '{"enable_thinking": false}'],
        "chat_template_kwargs are chat template variables; raw prompts use no template",
    ),
    (["bench", "--n-texts", "0"], "--n-texts: must be a positive integer"),
    (["bench", "--lengths", "fixed:2"], "lengths need 3 <= A <= B"),
    (["bench", "--lengths", "long"], "lengths must be 'fixed:N' or 'mixed:A-B'"),
    (["bench", "--dtypes", "float64"], "--dtypes: 'float64' is not one of"),
    (["bench", "--dtypes", "float16", "--dtype", "float32"], "give --dtypes or --dtype, not both"),
    (["bench", "--time-limit", "60"], "--restart and --time-limit go with --suite"),
    # repeated or conflicting flags
    (["run", "--model", MINILM, "--model", "/other"], "--model is given more than once"),
    (["run", "--max-model-len", "128", "--max-model-len=256"], "--max-model-len is given more than once"),
    (["run", "--kv-cache-memory-bytes", "1", "--kv-cache-memory-bytes", "2"], "is given more than once"),
    (["generate", "--task", "Digits", "--tasks", "Digits", "--model", MINILM], "--tasks is given more than once"),
    # options the backend would ignore
    (["run", "--device", "cpu"], "--device is for a reference backend (st, hf: a torch device), not vllm"),
    (["run", "--encoding-format", "base64"], "--encoding-format is for --backend remote"),
    (
        ["run", "--backend", "st", "--max-num-seqs", "4"],
        "--backend st does not take vLLM engine options: --max-num-seqs",
    ),
    (["run", "--backend", "st", "--data-parallel-size", "2"], "need --backend vllm"),
    (["rerank", "--reranker", MINILM, "--api", "rerank"], "--api is for --backend remote"),
    (
        ["rerank", "--reranker", MINILM, "--backend", "st", "--preset", "qwen3-reranker"],
        "the st reranker applies score templates to causal LMs",
    ),
    (["rerank", "--backend", "st", "--reranker", MINILM, "--data-parallel-size", "2"], "need --backend vllm"),
    (
        ["generate", "--backend", "hf", "--model", MINILM, "--tasks", "Digits", "--scoring", "loglikelihood"],
        "--backend hf is text-only; Digits shows images",
    ),
    (
        [
            "generate",
            "--backend",
            "remote",
            "--endpoint",
            "http://127.0.0.1:9",
            "--tasks",
            "PangLeePolarity",
            "--scoring",
            "loglikelihood",
        ],
        "--backend remote cannot give",
    ),
    # options reach a backend by what it accepts: its signature, or a declared capability
    (
        ["classify", "--model", MINILM, "--backend", "hf", "--labels", "a", "b"],
        "--labels is for --backend remote (a served model), not hf",
    ),
    (
        ["generate", "--backend", "remote", "--endpoint", "http://127.0.0.1:9", "--tasks", "PangLeePolarity"]
        + ["--chat-template", "{{ messages }}"],
        "--chat-template needs --backend vllm or hf, not remote",
    ),
    (
        ["generate", "--backend", "hf", "--model", MINILM, "--tasks", "PangLeePolarity", "--image-position", "after"],
        "--image-position needs --backend vllm or remote, not hf",
    ),
    (["reward", "--model", MINILM, "--backend", "hf", "--data-parallel-size", "2"], "need --backend vllm"),
    (["token-classify", "--model", MINILM, "--data", "x.conll", "--tokenizer", "t"], "--tokenizer is for --backend"),
    (["compare", "--kind", "embedding"], "invalid choice: 'embedding'"),
    (["models", "--kind", "language"], "invalid choice: 'language'"),
    # presets
    (["run", "--preset", "qwen3-reranker"], "preset 'qwen3-reranker' is for rerankers, not encoders"),
    (["run", "--preset", "e6"], "unknown model preset 'e6' (did you mean 'e5'?)"),
    # endpoints
    (["run", "--backend", "remote"], "--backend remote needs at least one --endpoint URL"),
    (["run", "--endpoint", "http://127.0.0.1:9"], "--endpoint is for --backend remote"),
    (["run", "--backend", "remote", "--endpoint", "localhost:8000"], "did you mean http://localhost:8000?"),
    (["run", "--backend", "remote", "--endpoint", "ftp://host/x"], "is not an http:// or https:// URL"),
    (["run", "--backend", "remote", "--endpoint", "http://h:80", "--endpoint", "http://h:80/"], "given twice"),
    (["run", "--backend", "remote", "--endpoint", "http://h:99999"], "Port out of range"),
    # odd text and unknown names
    (["run", "--instruction-template", "no placeholder"], "must contain '{instruction}'"),
    (["run", "--max-model-length", "128"], "'max_model_length' (did you mean 'max_model_len'"),
    (["run", "stray"], "unexpected argument 'stray'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["tasks", "--jsn"], "unrecognized arguments: --jsn"),
    (["models", "--kind", "vision"], "invalid choice: 'vision'"),
    (["transcribe", "--model", MINILM, "--normalizer", "whisper"], "--normalizer whisper: that normaliser is now"),
    (["transcribe", "--model", MINILM, "--normalizer", "nfkc"], "--normalizer must be one of leaderboard, openai"),
]


@pytest.fixture(scope="module")
def lm_eval_index():
    """lm-eval's task index, read once per process (~10 s on one core) before the timed cases use it."""
    from vllm_eval.tasks.lmeval import task_manager

    task_manager()


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(run_main, tmp_path, argv, message, lm_eval_index):
    paths = _paths(tmp_path)
    argv = [a.format(**paths) if "{" in a and a.strip("{}") in paths else a for a in argv]
    start = time.perf_counter()
    code, err = run_main(*argv)
    assert code == 2, err
    assert message in err, err
    assert err.startswith("vllm-eval: error: ") and err.count("\n") == 1, err
    assert time.perf_counter() - start < 30  # found early, never after a model load


DATA_CASES = [
    # (command, file name, bytes, message): damaged files of each reader, refused before any engine starts
    (
        "run",
        "s.jsonl",
        b'{"sentence1": "\\ud800", "sentence2": "b", "score": 1}\n',
        "s.jsonl:1: field 'sentence1' holds",
    ),
    ("run", "s.csv", b"sentence1,sentence2,score\na,b,nan\nc,d,1\n", "s.csv:2: field 'score' is nan, not a finite"),
    ("classify", "c.csv", b"text,label\n\xe9t\xe9,pos\n", "c.csv:2: not UTF-8 text (byte 0xe9 at column 1"),
    ("token-classify", "n.conll", b"Jos\xe9 B-PER\n", "n.conll:1: not UTF-8 text"),
    (
        "reward",
        "p.jsonl",
        b'{"prompt": "p", "chosen": "a", "rejected": NaN}\n',
        "p.jsonl:1: field 'rejected' must be str",
    ),
    (
        "generate",
        "q.json",
        b'[{"question": "q", "options": ["a"], "answer": 0}]',
        "q.json row 0: field 'options' needs",
    ),
]


@pytest.mark.parametrize("command, name, raw, message", DATA_CASES, ids=[c[1] for c in DATA_CASES])
def test_damaged_data_files_are_one_line_and_exit_2(run_main, tmp_path, command, name, raw, message):
    (tmp_path / name).write_bytes(raw)
    code, err = run_main(command, "--model", MINILM, "--data", str(tmp_path / name), "--no-progress")
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [["generate", "--model", MINILM, "--tasks", "hellaswg"], ["run", "--tasks", "x"]])
def test_verbose_after_the_command_is_the_flag_not_an_engine_option(run_main, argv, lm_eval_index):
    code, err = run_main(*argv, "--verbose")  # once a TypeError (an engine option `verbose`) from generate
    assert code == 2 and err.splitlines()[-1].startswith("vllm-eval: error: ")
    assert "Traceback" in err and "engine option" not in err  # verbose: the traceback of the one-line error


def test_offline_unavailable_task_fails_in_seconds(run_main):
    start = time.perf_counter()
    code, err = run_main("run", "--tasks", "STS12")
    assert code == 2 and "STS12" in err and "mteb/sts12-sts" in err
    assert time.perf_counter() - start < 10


def test_dead_endpoint_is_one_line_and_exit_1(run_main):
    code, err = run_main(
        "run",
        "--backend",
        "remote",
        "--endpoint",
        f"http://127.0.0.1:{_free_port()}",
        "--tasks",
        "WordSim353",
        "--no-progress",
    )
    assert code == 1 and "every endpoint is unreachable" in err, err
    assert err.strip().splitlines()[-1].startswith("vllm-eval: error: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "mode, message",
    [
        ("no-data", "/v1/embeddings sent a malformed reply: no 'data' list"),
        ("short", "sent a malformed reply: 63 embeddings for 64 inputs"),
        ("no-embedding", "sent a malformed reply: an item without 'embedding' or 'index'"),
        ("not-json", "/v1/embeddings replied with something that is not JSON"),
    ],
)
def test_lying_server_is_named(run_main, liar, tmp_path, mode, message):
    liar.mode = mode
    url = url_of(liar)
    data = tmp_path / "x"
    code, err = run_main(
        "run",
        "--backend",
        "remote",
        "--endpoint",
        url,
        "--tasks",
        "WordSim353",
        "--no-progress",
        "--output-dir",
        str(data),
    )
    assert code == 1, err
    assert f"vllm-eval: error: {url}" in err and message in err, err
    assert "Traceback" not in err
