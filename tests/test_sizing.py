"""Engine sizes from the model and the GPU (``engine.sizing``): tokens per pooling step, the memory share beside the
command's own scoring, and the layout a run takes when no layout flag is given. Read from ``config.json`` files of
real shapes (no weights, no engine, no GPU)."""

from __future__ import annotations

import json

import pytest

from vllm_eval.engine import sizing
from vllm_eval.engine.sizing import Layout, default_layout, memory_share, model_shape, pooling_step
from vllm_eval.testing.text_models import RANDOM_SHAPES
from vllm_eval.utils.errors import UsageError

GiB = 1024**3
H100 = 80 * GiB


@pytest.fixture(autouse=True)
def first_reading(monkeypatch):
    """A fresh first reading of the GPU's memory (:func:`sizing.first_gpu_memory`) for each test."""
    monkeypatch.setattr(sizing, "_FIRST_READ", {})


def _folder(tmp_path, name: str, **extra) -> str:
    """A model folder holding only the ``config.json`` of :data:`RANDOM_SHAPES` entry ``name`` (``extra`` over it)."""
    spec = dict(RANDOM_SHAPES[name])
    arch = spec.pop("arch")
    spec.pop("pooling")
    if arch == "bert":
        spec |= {"model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512}
    else:
        spec |= {"model_type": "qwen3", "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**spec, **extra}))
    return str(folder)


def test_the_shape_counts_the_parameters_of_real_models(tmp_path):
    bert = model_shape(_folder(tmp_path, "bert-base"), {"dtype": "float16"})
    assert bert.layer_params == 84_934_656 and bert.params == 108_375_552  # BERT-base: 110 M with its biases
    qwen = model_shape(_folder(tmp_path, "qwen3-8b"))
    assert round(qwen.params / 1e9, 2) == 7.57  # Qwen3-Embedding-8B's 7.57 billion
    assert qwen.weight_bytes == 2 * qwen.params and qwen.max_positions == 40960
    fp8 = model_shape(_folder(tmp_path, "qwen3-8b"), {"quantization": "fp8"})
    assert fp8.weight_bytes == qwen.layer_params + 2 * (qwen.params - qwen.layer_params)  # embeddings stay 16-bit
    assert model_shape(tmp_path / "nowhere") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert model_shape(tmp_path / "broken") is None


def test_a_pooling_step_holds_bert_bases_flops_and_fits_the_gpu(tmp_path):
    bert = model_shape(_folder(tmp_path, "bert-base"), {"dtype": "float16"})
    qwen06 = model_shape(_folder(tmp_path, "qwen3-0.6b"))
    qwen8 = model_shape(_folder(tmp_path, "qwen3-8b"))
    share = memory_share(H100) * H100
    assert pooling_step(bert, None, share) == {"max_num_batched_tokens": 131072, "max_num_seqs": 1024}
    assert pooling_step(qwen06, None, share)["max_num_batched_tokens"] == 32768
    # An 8B step: 32,768 tokens (its gate_up_proj 1.5 GiB), not the 131,072 (6 GiB) that ran out of memory.
    assert pooling_step(qwen8, None, share) == {"max_num_batched_tokens": 32768, "max_num_seqs": 1024}
    assert pooling_step(qwen8, 40960, share)["max_num_batched_tokens"] == 40960  # one whole prompt per step
    # A GPU too small for the step's activations beside the weights: halved until they fit a quarter of the room.
    small = pooling_step(qwen8, None, 20 * GiB)["max_num_batched_tokens"]
    assert small * qwen8.activation_bytes_per_token <= (20 * GiB - qwen8.weight_bytes) // 4 < 2 * small * 122880
    assert pooling_step(None, None, None) == {"max_num_batched_tokens": 131072, "max_num_seqs": 1024}


def test_a_generation_engine_leaves_room_for_a_steps_prompt_logprobs(tmp_path, monkeypatch):
    from vllm_eval.engine.args import _gpu_generate_defaults

    qwen8 = _folder(tmp_path, "qwen3-8b", vocab_size=151936)
    # 8,192 prompt tokens x 151,936 entries x 10 bytes: 12.4 GB that vLLM's profile does not see
    assert sizing.prompt_logprob_reserve(model_shape(qwen8), 8192) == 8192 * 151936 * 10
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (H100, H100))
    got = _gpu_generate_defaults({"runner": "generate"}, qwen8)
    assert got == {"max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.7551}  # 0.9 - 12.4 GB / 80 GiB
    smaller = _gpu_generate_defaults({"runner": "generate", "max_num_batched_tokens": 2048}, qwen8)
    assert smaller == {"gpu_memory_utilization": 0.8637}  # the user's step: a quarter of the room
    assert _gpu_generate_defaults({"runner": "generate", "gpu_memory_utilization": 0.5}, qwen8) == {
        "max_num_batched_tokens": 8192
    }
    assert _gpu_generate_defaults({}, None)["gpu_memory_utilization"] == 0.9  # no config to read: vLLM's share
    whisper = tmp_path / "whisper"
    whisper.mkdir()
    (whisper / "config.json").write_text(json.dumps({"model_type": "whisper", "is_encoder_decoder": True}))
    assert _gpu_generate_defaults({"runner": "generate"}, str(whisper)) == {}  # a transcriber keeps vLLM's own
    # Two replicas on one GPU of which another program holds 20 GiB: what is free, halved, less each one's room
    from vllm_eval.replicas import pool

    monkeypatch.setattr(sizing, "_FIRST_READ", {})
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (60 * GiB, H100))
    two = pool.plan_replicas(1, 2, engine_kwargs={"runner": "generate"}, cpu=False, devices=["0"], model=qwen8)
    assert {p.engine_kwargs["gpu_memory_utilization"] for p in two} == {0.1801}  # ((60 - 8) / 2 - 12.4 GB) / 80


def test_one_rule_sizes_single_engines_and_replicas_of_every_kind(tmp_path, monkeypatch, caplog):
    """A single engine and replicas sharing a GPU take their share from one function (engine_memory_share) of one
    reading (what was free first, other programs' memory said in the log): pooling and generation, one engine or two
    on a GPU; a speech model keeps vLLM's share (split between replicas)."""
    import logging

    from vllm_eval.engine.args import _gpu_generate_defaults, _gpu_pooling_defaults
    from vllm_eval.replicas import pool

    qwen8 = _folder(tmp_path, "qwen3-8b", vocab_size=151936)
    whisper = tmp_path / "whisper"
    whisper.mkdir()
    (whisper / "config.json").write_text(json.dumps({"model_type": "whisper", "is_encoder_decoder": True}))
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (60 * GiB, H100))
    with caplog.at_level(logging.INFO, logger="vllm_eval.engine.sizing"):
        two = {
            runner: pool.plan_replicas(1, 2, engine_kwargs={"runner": runner}, cpu=False, devices=["0"], model=qwen8)
            for runner in ("pooling", "generate")
        }
    assert "20.0 GiB of the GPU's 80.0 GiB held by other programs" in caplog.text
    for runner, replicas in two.items():
        want = sizing.engine_memory_share({"runner": runner}, qwen8, 2)
        assert {p.engine_kwargs["gpu_memory_utilization"] for p in replicas} == {want}, runner
    assert two["pooling"][0].engine_kwargs["gpu_memory_utilization"] == memory_share(H100, 60 * GiB, 2)
    single = _gpu_pooling_defaults({"runner": "pooling"}, qwen8)["gpu_memory_utilization"]
    assert single == sizing.engine_memory_share({"runner": "pooling"}, qwen8) == memory_share(H100, 60 * GiB)
    generate = _gpu_generate_defaults({"runner": "generate"}, qwen8)["gpu_memory_utilization"]
    assert generate == sizing.engine_memory_share({"runner": "generate"}, qwen8)
    gen = {"runner": "generate"}
    speech = pool.plan_replicas(1, 2, engine_kwargs=gen, cpu=False, devices=["0"], model=str(whisper))
    assert {p.engine_kwargs["gpu_memory_utilization"] for p in speech} == {0.45}
    assert sizing.engine_memory_share({"runner": "generate", "kv_cache_memory_bytes": 1 << 30}, qwen8) is None


def test_a_single_engine_takes_its_share_of_what_was_free_first(tmp_path, monkeypatch, caplog):
    """Another program holding 62 GiB of an H200 left a single engine's default at 0.8787 of the card, more than was
    free: vLLM stopped at start. The share now comes from what was free before this process's engines, read once
    (a later reading, after an engine took its part, would give other engine options and so a second engine)."""
    import logging

    from vllm_eval.engine import args

    qwen8 = _folder(tmp_path, "qwen3-8b", vocab_size=151936)
    readings = iter([(77 * GiB, 141 * GiB), (10 * GiB, 141 * GiB)])
    monkeypatch.setattr(args, "on_cpu", lambda: False)
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: next(readings))
    with caplog.at_level(logging.INFO, logger="vllm_eval.engine.sizing"):
        first = args.engine_options_in_force({"runner": "pooling", "dtype": "bfloat16"}, qwen8)
    assert first["gpu_memory_utilization"] == memory_share(141 * GiB, 77 * GiB) < 77 / 141
    assert "64.0 GiB of the GPU's 141.0 GiB held by other programs" in caplog.text
    again = args.engine_options_in_force({"runner": "pooling", "dtype": "bfloat16"}, qwen8)
    assert again == first  # the first reading stands: the same options, so the same engine
    generate = args.engine_options_in_force({"runner": "generate"}, qwen8)["gpu_memory_utilization"]
    assert generate == memory_share(141 * GiB, 77 * GiB, scoring=False, reserve=8192 * 151936 * 10)
    # Weights that do not fit what is free: one line when this process starts the engine, before vLLM loads
    monkeypatch.setattr(sizing, "_FIRST_READ", {})
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (20 * GiB, H100))
    options = args.engine_options_in_force({"runner": "generate"}, qwen8)  # read where no engine starts: no error
    with pytest.raises(
        UsageError,
        match=r"weights take 14\.1 GiB per GPU, more than the 4\.0 GiB an engine can have: "
        r"20\.0 GiB of the GPU's 80\.0 GiB is free \(60\.0 GiB held by other programs\)",
    ):
        sizing.check_engine_fits(qwen8, options)
    sizing.check_engine_fits(qwen8, {**options, "tensor_parallel_size": 8})  # an eighth of the weights a GPU fits
    sizing.check_engine_fits(qwen8, {**options, "kv_cache_memory_bytes": 2**30})  # the user sized it: vLLM says


def test_the_memory_share_leaves_room_for_the_commands_scoring():
    # 0.9 of an H100 less the five scoring processes' 10 GiB (and half the remaining tenth): 0.8237
    assert memory_share(H100) == pytest.approx((80 - 4 - 10) / 80, abs=1e-4)
    assert memory_share(141 * GiB) == 0.879  # an H200: (141 - 7.05 - 10) / 141
    assert memory_share(H100, scoring=False) == 0.9 and memory_share(H100, replicas=4) == 0.2062
    assert memory_share(H100, free=30 * GiB) == 0.275  # another program holds 50 GiB: (30 - 8) / 80
    assert memory_share(4 * GiB) == 0.05  # never nothing: vLLM then says what is missing


@pytest.mark.parametrize(
    "name, gpus, given, layout",
    [
        ("bert-base", 1, {}, (1, 4, 1)),
        ("bert-base", 4, {}, (4, 4, 1)),
        ("qwen3-0.6b", 2, {}, (2, 4, 1)),
        ("qwen3-4b", 1, {}, (1, 2, 1)),
        ("qwen3-8b", 2, {}, (2, 1, 1)),
        ("bert-base", 2, {"data_parallel_size": 1}, (1, 1, 1)),  # the user's flags stand
        ("bert-base", 2, {"replicas_per_gpu": 2}, (2, 2, 1)),
        ("qwen3-8b", 4, {"tensor_parallel_size": 2}, (2, 1, 2)),
    ],
)
def test_the_layout_uses_every_gpu_and_replicas_by_the_models_size(tmp_path, name, gpus, given, layout):
    shape = model_shape(_folder(tmp_path, name))
    got = default_layout(shape, gpus, H100, pooling=True, **given)
    assert (got.data_parallel_size, got.replicas_per_gpu, got.tensor_parallel_size) == layout
    assert got.chosen == ("data_parallel_size" not in given and "replicas_per_gpu" not in given)


def test_tensor_parallelism_only_for_a_model_one_gpu_cannot_hold(tmp_path):
    big = model_shape(_folder(tmp_path, "qwen3-8b", hidden_size=8192, num_hidden_layers=80, intermediate_size=28672))
    assert big.weight_bytes > H100  # a 70B
    assert default_layout(big, 4, H100, pooling=True) == Layout(1, 1, 4, chosen=True)
    assert default_layout(big, 8, H100, pooling=True) == Layout(2, 1, 4, chosen=True)
    generate = default_layout(model_shape(_folder(tmp_path, "bert-base")), 2, H100, pooling=False)
    assert (generate.data_parallel_size, generate.replicas_per_gpu) == (2, 1)  # generation: one engine per GPU
    assert generate.as_json() == {
        "gpus": 2,
        "data_parallel_size": 2,
        "replicas_per_gpu": 1,
        "tensor_parallel_size": 1,
        "chosen": "default",
    }


def test_the_cpu_build_and_ray_keep_the_layout_given(tmp_path, monkeypatch):
    from vllm_eval.replicas import layout as layouts

    model = _folder(tmp_path, "bert-base")
    assert layouts.resolve_layout(model, {"runner": "pooling"}) == Layout(1, 1, 1, chosen=True, on_gpu=False)  # CPU
    monkeypatch.setattr(layouts, "on_cpu", lambda: False)
    monkeypatch.setattr(layouts, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(layouts, "gpu_memory", lambda device=None: (H100, H100))
    chosen = layouts.resolve_layout(model, {"runner": "pooling"})
    assert chosen == Layout(2, 4, 1, chosen=True)
    assert "2 GPUs, 4 replicas per GPU (chosen for the model and the GPUs)" in chosen.describe()
    assert layouts.resolve_layout(model, {"runner": "pooling"}, ray_address="auto") == Layout(1, 1, 1, chosen=True)
    from vllm_eval.replicas.ahead import layout_of

    assert layout_of(["run", "--model", model]) == (2, 4, 1)  # replicas started ahead: the same choice
    assert layout_of(["run", "--model", model, "--data-parallel-size", "1"]) is None  # one engine, in process


def test_pooling_engines_on_a_gpu_schedule_each_prompt_whole(tmp_path, monkeypatch):
    # vLLM 0.26 never finished a chunked pooling prompt of exactly max_model_len tokens (an 8B on an H100 held one at
    # 8,191 of 8,192): where the step holds the longest prompt, chunked prefill is off; a user's choice stands.
    from vllm_eval.engine import args

    folder = _folder(tmp_path, "qwen3-8b")
    (tmp_path / "qwen3-8b" / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8192}))
    monkeypatch.setattr(args, "on_cpu", lambda: False)
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (H100, H100))
    pooling = {"runner": "pooling", "dtype": "bfloat16"}
    forced = args.engine_options_in_force(pooling, folder)
    assert forced["max_num_batched_tokens"] == 32768 and forced["enable_chunked_prefill"] is False
    assert forced["gpu_memory_utilization"] == memory_share(H100) and forced["enforce_eager"] is True
    assert model_shape(folder).max_len == 8192  # sentence-transformers' limit, as vLLM reads it
    small = args.engine_options_in_force({**pooling, "max_num_batched_tokens": 4096}, folder)  # prompts must split
    assert "enable_chunked_prefill" not in small and small["max_num_batched_tokens"] == 4096
    mine = args.engine_options_in_force({**pooling, "enable_chunked_prefill": True, "max_model_len": 40960}, folder)
    assert mine["enable_chunked_prefill"] is True and mine["max_num_batched_tokens"] == 40960
    assert "enable_chunked_prefill" not in args.engine_options_in_force({"runner": "generate"}, folder)


#: Qwen2.5-VL-72B-Instruct's config.json sizes (its hub card's file): 80 layers of 8192, 8 KV heads, a 32-block tower.
QWEN25_VL_72B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "max_position_embeddings": 128000,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3456},
}
H200 = int(139.8 * GiB)


def _vlm_72b(tmp_path) -> str:
    folder = tmp_path / "qwen2.5-vl-72b"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(QWEN25_VL_72B))
    return str(folder)


def test_a_vision_tower_and_the_kv_cache_are_counted(tmp_path):
    shape = model_shape(_vlm_72b(tmp_path))
    assert shape.vision_params == 32 * (4 * 1280**2 + 3 * 1280 * 3456)  # gated (silu) feed-forward blocks
    assert shape.params == shape.layer_params + 152064 * 8192 + shape.vision_params
    assert shape.weight_bytes == 2 * shape.params and 134 * GiB < shape.weight_bytes < 135 * GiB
    assert shape.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # keys and values, bf16: 320 KiB a token
    fp8 = model_shape(_vlm_72b(tmp_path), {"quantization": "fp8"})
    assert fp8.weight_bytes == shape.layer_params + 2 * (shape.params - shape.layer_params)  # the tower stays bf16


@pytest.mark.parametrize(
    "gpu, gpus, quantization, layout",
    [
        ("H200", 2, None, (1, 2)),  # bf16: two H200s hold it
        ("H200", 4, None, (2, 2)),  # and on more, replicas of that group
        ("H200", 8, None, (4, 2)),
        ("H100", 4, None, (1, 4)),  # or four 80 GB cards
        ("H100", 8, None, (2, 4)),
        ("H200", 1, "fp8", (1, 1)),  # fp8 fits one H200
        ("H100", 2, "fp8", (1, 2)),
    ],
)
def test_a_72b_vlm_gets_tensor_parallelism_over_the_fewest_gpus_it_fits(
    tmp_path, monkeypatch, gpu, gpus, quantization, layout
):
    from vllm_eval.replicas import layout as layouts

    total = {"H200": H200, "H100": int(79.6 * GiB)}[gpu]
    monkeypatch.setattr(layouts, "on_cpu", lambda: False)
    monkeypatch.setattr(layouts, "visible_gpus", lambda: [str(i) for i in range(gpus)])
    monkeypatch.setattr(layouts, "gpu_memory", lambda device=None: (total, total))
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (total, total))
    options = {"runner": "generate", "max_model_len": 32768} | ({"quantization": quantization} if quantization else {})
    got = layouts.resolve_layout(_vlm_72b(tmp_path), options)
    assert (got.data_parallel_size, got.tensor_parallel_size, got.replicas_per_gpu) == (*layout, 1)
    assert got.chosen and got.as_json()["gpus"] == gpus
    assert f"tensor parallel {layout[1]}" in got.describe() or layout[1] == 1


@pytest.mark.parametrize(
    "gpu, gpus, quantization, held, message",
    [
        (
            "H200",
            1,
            None,
            0,
            r"weights \(134\.\d GiB\).*fit with --quantization fp8 \(weights 68\.\d GiB\) on 1 GPU or "
            r"on 2 GPUs of this size",
        ),
        ("H100", 2, None, 0, r"does not fit 2 GPUs of 79\.6 GiB.*fp8 .* on 2 GPUs or on 4 GPUs of this size"),
        # another program holds 62 GiB of the H200: what is free decides, and fp8 no longer fits one
        ("H200", 1, "fp8", 62, r"an engine has 52\.2 GiB of each; it would fit on 2 GPUs of this size"),
    ],
)
def test_a_model_no_layout_holds_is_refused_before_any_engine_with_what_would_fit(
    tmp_path, monkeypatch, gpu, gpus, quantization, held, message
):
    from vllm_eval.replicas import layout as layouts

    total = {"H200": H200, "H100": int(79.6 * GiB)}[gpu]
    monkeypatch.setattr(layouts, "on_cpu", lambda: False)
    monkeypatch.setattr(layouts, "visible_gpus", lambda: [str(i) for i in range(gpus)])
    monkeypatch.setattr(layouts, "gpu_memory", lambda device=None: (total - held * GiB, total))
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (total - held * GiB, total))
    options = {"runner": "generate", "max_model_len": 32768} | ({"quantization": quantization} if quantization else {})
    with pytest.raises(UsageError, match=message) as caught:
        layouts.resolve_layout(_vlm_72b(tmp_path), options)
    assert "\n" not in str(caught.value)
    # the user's tensor-parallel size is theirs (vLLM, or check_engine_fits at the engine's start, says the rest)
    if held == 0 and gpu == "H200":
        given = layouts.resolve_layout(_vlm_72b(tmp_path), {**options, "tensor_parallel_size": 1})
        assert given.tensor_parallel_size == 1


def test_a_shorter_sequence_is_offered_where_only_the_kv_cache_is_short(tmp_path, monkeypatch):
    from vllm_eval.replicas import layout as layouts

    monkeypatch.setattr(layouts, "on_cpu", lambda: False)
    monkeypatch.setattr(layouts, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr(layouts, "gpu_memory", lambda device=None: (H200 - 30 * GiB, H200))
    monkeypatch.setattr(sizing, "gpu_memory", lambda device=None: (H200 - 30 * GiB, H200))
    options = {"runner": "generate", "quantization": "fp8"}  # the model's own 128,000 tokens
    with pytest.raises(UsageError, match=r"128,000-token .* or with --max-model-len (\d+)$") as caught:
        layouts.resolve_layout(_vlm_72b(tmp_path), options)
    longest = int(str(caught.value).rsplit(" ", 1)[1])
    assert layouts.resolve_layout(_vlm_72b(tmp_path), {**options, "max_model_len": longest}).tensor_parallel_size == 1
