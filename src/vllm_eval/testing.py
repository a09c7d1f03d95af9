"""Small models built locally for tests and offline demos (no cross-encoder or LLM ships offline).

They are real Hugging Face checkpoints that vLLM, transformers and sentence-transformers load,
with seeded random weights where no trained weights exist: good for plumbing and parity checks,
meaningless for quality. Build them once into a directory and reuse it.

* :func:`build_minilm_cross_encoder` — ``BertForSequenceClassification`` (one label): the packaged
  all-MiniLM-L6-v2 encoder plus a seeded classifier head.
* :func:`build_tiny_qwen3` — a randomly initialised 2-layer ``Qwen3ForCausalLM`` with a byte-level
  BPE tokenizer trained on gensim's Lee background corpus, ``yes``/``no`` as single tokens and a
  Qwen-style chat template (for the Qwen3-Reranker recipe and for generation tests).
* :func:`build_tiny_reward_model` — a tiny reward model: ``Qwen3ForSequenceClassification`` with one
  label, or ``Qwen2ForRewardModel`` (per-token scores, the last token's is the reward).
* :func:`build_minilm_colbert` — ``HF_ColBERT`` (MiniLM plus a seeded projection): per-token vectors
  for late-interaction (MaxSim) retrieval.
* :func:`build_tiny_llava` — a randomly initialised ``LlavaForConditionalGeneration`` (tiny CLIP
  vision tower, 2-layer Qwen2 text model) with a LLaVA processor, for vision-language tests.

:func:`serve_model` runs a real ``vllm serve`` of such a model on loopback (tests, the remote bench).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: ChatML (Qwen2/Qwen3 style) chat template, trimmed to what the tests use: optional system turn,
#: user/assistant turns, generation prompt. Content may be a string or a list of parts, where an
#: image part becomes ``<image>`` (the LLaVA placeholder) and text parts are concatenated.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- '<image>' }}{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_minilm_cross_encoder(out_dir: str | Path, seed: int = 0) -> Path:
    """Save a one-label ``BertForSequenceClassification`` on the packaged MiniLM encoder.

    The encoder weights are all-MiniLM-L6-v2's; the pooler and classifier head are drawn from
    ``torch.manual_seed(seed)``. sentence-transformers' ``CrossEncoder`` and vLLM both load it.

    Returns:
        The model directory.
    """
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from .modelinfo import packaged_model_path

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(packaged_model_path(), num_labels=1)
    with torch.no_grad():
        # from_pretrained leaves the (absent) pooler/classifier at small init; widen the head so
        # scores spread across (0, 1) instead of all sitting near 0.5.
        model.classifier.weight.normal_(0.0, 1.0)
        model.classifier.bias.zero_()
    model.config.id2label = {0: "LABEL_0"}
    model.config.label2id = {"LABEL_0": 0}
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(packaged_model_path()).save_pretrained(out)
    return out


def build_minilm_classifier(out_dir: str | Path, seed: int = 0, n_fit: int = 100) -> Path:
    """Save a two-label (``negative``, ``positive``) ``BertForSequenceClassification`` on the packaged MiniLM.

    The encoder weights are all-MiniLM-L6-v2's; the pooler is drawn from ``torch.manual_seed(seed)``
    and the classifier head is a logistic regression (scikit-learn, seeded) fitted on the pooled
    outputs of ``n_fit`` PangLeePolarity sentences (the even-numbered ones), so predictions are better
    than chance on that data (a plumbing model: fitted on half of what it is then tested on). vLLM's
    ``LLM.classify`` and transformers both load it.

    Returns:
        The model directory.
    """
    import numpy as np
    import torch
    from sklearn.linear_model import LogisticRegression
    from transformers import AutoTokenizer, BertForSequenceClassification

    from .modelinfo import packaged_model_path
    from .tasks.data import pang_lee_polarity

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    labels = ["negative", "positive"]
    model = BertForSequenceClassification.from_pretrained(
        packaged_model_path(),
        num_labels=2,
        id2label=dict(enumerate(labels)),
        label2id={k: i for i, k in enumerate(labels)},
    ).eval()
    tok = AutoTokenizer.from_pretrained(packaged_model_path())
    pairs = list(pang_lee_polarity())[::2][:n_fit]  # the file is sorted by label: every other line
    with torch.no_grad():
        enc = tok([t for t, _ in pairs], padding=True, truncation=True, max_length=256, return_tensors="pt")
        pooled = model.bert(**enc).pooler_output.numpy()
        fit = LogisticRegression(C=10.0, max_iter=2000, random_state=seed).fit(
            pooled, [int(y == "pos") for _, y in pairs]
        )
        # Two logits from one binary fit: softmax([0, w·x + b]) = sigmoid(w·x + b).
        model.classifier.weight.copy_(torch.tensor(np.stack([np.zeros_like(fit.coef_[0]), fit.coef_[0]])))
        model.classifier.bias.copy_(torch.tensor([0.0, float(fit.intercept_[0])]))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


#: The labels of :func:`build_minilm_token_classifier` (IOB2).
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def build_minilm_token_classifier(out_dir: str | Path, seed: int = 0) -> Path:
    """Save a ``BertForTokenClassification`` over :data:`NER_LABELS` on the packaged MiniLM encoder.

    The encoder weights are all-MiniLM-L6-v2's; the classifier head is drawn from
    ``torch.manual_seed(seed)`` (standard deviation 1, so predictions vary by token). A plumbing
    model: its tags are not meaningful. vLLM's ``token_classify`` task and transformers both load it.

    Returns:
        The model directory.
    """
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    from .modelinfo import packaged_model_path

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    model = BertForTokenClassification.from_pretrained(
        packaged_model_path(),
        num_labels=len(NER_LABELS),
        id2label=dict(enumerate(NER_LABELS)),
        label2id={k: i for i, k in enumerate(NER_LABELS)},
    )
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)
        model.classifier.bias.zero_()
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(packaged_model_path()).save_pretrained(out)
    return out


def _train_bpe_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from .tasks.data import lee_background_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lee_background_documents(), trainer=trainer)
    return tok


def _tiny_tokenizer(extra_tokens: tuple[str, ...] = ()):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe_tokenizer(vocab_size=1000),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    tokenizer.add_tokens(["yes", "no"])
    if extra_tokens:
        tokenizer.add_tokens(list(extra_tokens), special_tokens=True)
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.model_max_length = 2048
    return tokenizer


def _tiny_text_shape(tokenizer, **overrides: Any) -> dict[str, Any]:
    """The text-model shape the tiny builders share: vocabulary of ``tokenizer``, hidden 128 (4 heads,
    2 KV heads), MLP 256, 2 layers, 2,048 positions, ``<|im_end|>`` ends and ``<|endoftext|>`` pads,
    no BOS; ``overrides`` replace or add config fields."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "bos_token_id": None,
        **overrides,
    }


def _tiny_vision_shape(image_size: int, **overrides: Any) -> dict[str, Any]:
    """The vision-tower shape the tiny VLM builders share: ViT of 2 layers, width 64 (2 heads), MLP 128,
    patches of 14 px on ``image_size`` px; ``overrides`` replace or add config fields."""
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": image_size,
        "patch_size": 14,
        **overrides,
    }


def build_tiny_llava(out_dir: str | Path, seed: int = 0, image_size: int = 28) -> Path:
    """Save a tiny randomly initialised ``LlavaForConditionalGeneration`` with its processor.

    Vision: CLIP, patch 14 on ``image_size`` px (4 patches for 28 px), hidden 64, 2 layers.
    Text: Qwen2, hidden 128, 4 heads of 32, 2 layers; ``<image>`` is the image placeholder, the
    ChatML template renders image parts as ``<image>``. Weights from ``torch.manual_seed(seed)``.

    Returns:
        The model directory.
    """
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        Qwen2Config,
    )

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = _tiny_tokenizer(("<image>",))
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(**_tiny_vision_shape(image_size, projection_dim=64))
    text = Qwen2Config(**_tiny_text_shape(tokenizer, tie_word_embeddings=False))
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        image_seq_length=(image_size // 14) ** 2,
    )
    model = LlavaForConditionalGeneration(config).to(torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=CHATML_TEMPLATE,
        image_token="<image>",
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_idefics3(out_dir: str | Path, seed: int = 0, image_size: int = 56) -> Path:
    """Save a tiny randomly initialised ``Idefics3ForConditionalGeneration`` (SmolVLM's architecture)
    with its processor.

    Vision: SigLIP-style, patch 14 on ``image_size`` px (16 patches for 56 px), hidden 64, 2 layers;
    the connector's pixel shuffle (scale 2) leaves 4 image tokens per image. No image splitting: one
    global tile per image. Text: Llama, hidden 128, 4 heads of 32, 2 layers. The ChatML template
    renders an image part as ``<image>``, which the processor (transformers, or vLLM's) expands to
    ``<fake_token_around_image><global-img><image>×4<fake_token_around_image>``. Weights from
    ``torch.manual_seed(seed)``, float32. Idefics3's image processor runs on PIL without torchvision,
    so vLLM's CPU build runs this model. A plumbing model: its answers mean nothing.

    Returns:
        The model directory.
    """
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = _tiny_tokenizer(("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"))
    torch.manual_seed(seed)
    scale = 2
    text = _tiny_text_shape(tokenizer, model_type="llama", tie_word_embeddings=False)
    vision = _tiny_vision_shape(image_size)
    config = Idefics3Config(
        vision_config=vision,
        text_config=text,
        scale_factor=scale,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": image_size},
        max_image_size={"longest_edge": image_size},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=(image_size // 14) ** 2 // scale**2,
        chat_template=CHATML_TEMPLATE,
    )
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


#: The Qwen2-VL chat template of :func:`build_tiny_qwen2_vl`: :data:`CHATML_TEMPLATE` with an image part
#: as ``<|vision_start|><|image_pad|><|vision_end|>`` (the processor expands the pad to the image's tokens).
QWEN2_VL_TEMPLATE = CHATML_TEMPLATE.replace("{{- '<image>' }}", "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}")


def build_tiny_qwen2_vl(out_dir: str | Path, seed: int = 0) -> Path:
    """Save a tiny randomly initialised ``Qwen2VLForConditionalGeneration`` with its processor.

    Shapes: vision tower of 2 blocks (width 64, patch 14, 2x2 merge), text model as
    :func:`build_tiny_qwen3` (hidden 128, 2 layers, multimodal RoPE sections 4/6/6), vocab ≈ 1,000
    plus the vision tokens; fp32, weights from ``torch.manual_seed(seed)``. Images are resized to at
    most 112x112 pixels (16 image tokens). Built where it runs: vLLM's CUDA build loads it with the
    transformers that saved it. A plumbing model: its answers mean nothing.

    Returns:
        The model directory.
    """
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    vision_tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    tokenizer = _tiny_tokenizer(extra_tokens=vision_tokens)
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in vision_tokens}
    torch.manual_seed(seed)
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2VLConfig(
        text_config=_tiny_text_shape(
            tokenizer,
            max_position_embeddings=4096,
            rope_parameters=rope,
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=2, embed_dim=64, hidden_size=128, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
    )
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out, safe_serialization=True)
    # The tokenizer (with the template) and the image processor; AutoProcessor assembles Qwen2VLProcessor
    # from them (building it here would need torchvision for its video processor).
    Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=112 * 112).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_qwen3(out_dir: str | Path, seed: int = 0, num_hidden_layers: int = 2) -> Path:
    """Save a tiny randomly initialised ``Qwen3ForCausalLM`` with tokenizer and chat template.

    Shapes: hidden 128, 4 heads of 32 (2 KV heads; vLLM's CPU attention has no kernel for head_dim 16),
    MLP 256, vocab ≈ 1,000, 2 layers, fp32,
    weights from ``torch.manual_seed(seed)``. ``"yes"`` and ``"no"`` are single tokens (the
    Qwen3-Reranker recipe reads their ``lm_head`` rows); ``<|im_end|>`` is EOS.

    Returns:
        The model directory.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = _tiny_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3Config(
        **_tiny_text_shape(
            tokenizer,
            num_hidden_layers=num_hidden_layers,
            head_dim=32,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )
    )
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_reward_model(out_dir: str | Path, seed: int = 0, architecture: str = "sequence-classification") -> Path:
    """Save a tiny randomly initialised reward model (one score per conversation) with a chat template.

    ``architecture``:

    * ``"sequence-classification"``: ``Qwen3ForSequenceClassification`` with ``num_labels=1`` (the
      form of most published reward models, e.g. Skywork-Reward); vLLM runs it through its
      ``classify`` pooling task, transformers through ``AutoModelForSequenceClassification``.
    * ``"qwen2-reward"``: ``Qwen2ForRewardModel`` (Qwen2.5-Math-RM's architecture: a Qwen2 backbone
      and a two-layer score head, Linear-ReLU-Linear, on every token); vLLM runs it through
      ``token_classify`` and the reward is the last token's. transformers has no class for it (the
      hub model ships its own code), so its weights are written here directly.

    Shapes as :func:`build_tiny_qwen3` (hidden 128, 2 layers, vocab ≈ 1,000), weights from
    ``torch.manual_seed(seed)``, fp32. A plumbing model: its rewards mean nothing.

    Returns:
        The model directory.

    Raises:
        ValueError: an unknown ``architecture``.
    """
    import torch
    from transformers import Qwen2Config, Qwen2Model, Qwen3Config, Qwen3ForSequenceClassification

    if architecture not in ("sequence-classification", "qwen2-reward"):
        raise ValueError(f"architecture must be 'sequence-classification' or 'qwen2-reward', got {architecture!r}")
    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = _tiny_tokenizer()
    torch.manual_seed(seed)
    shape = _tiny_text_shape(tokenizer, num_labels=1, id2label={0: "reward"}, label2id={"reward": 0})
    if architecture == "sequence-classification":
        model = Qwen3ForSequenceClassification(Qwen3Config(head_dim=32, torch_dtype="float32", **shape))
        with torch.no_grad():  # spread the rewards (the default init puts them all near 0)
            model.score.weight.normal_(0.0, 1.0)
        model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    else:
        from safetensors.torch import save_file

        config = Qwen2Config(torch_dtype="float32", **shape)
        config.architectures = ["Qwen2ForRewardModel"]
        backbone = Qwen2Model(config).to(torch.float32)
        state = {f"model.{k}": v.contiguous() for k, v in backbone.state_dict().items()}
        hidden = config.hidden_size
        state["score.0.weight"] = torch.randn(hidden, hidden) / hidden**0.5
        state["score.0.bias"] = torch.zeros(hidden)
        state["score.2.weight"] = torch.randn(1, hidden)
        state["score.2.bias"] = torch.zeros(1)
        out.mkdir(parents=True, exist_ok=True)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_minilm_colbert(out_dir: str | Path, seed: int = 0, dim: int = 48) -> Path:
    """Save a ColBERT-style multi-vector model (``HF_ColBERT``) on the packaged MiniLM encoder.

    The layout of ColBERT checkpoints such as ``colbert-ir/colbertv2.0``: a ``BertModel`` (weights
    under ``bert.``) and a bias-free ``linear`` projection (hidden 384 -> ``dim``). vLLM serves it
    through its ``token_embed`` pooling task (one L2-normalised ``dim``-vector per token). The
    encoder weights are all-MiniLM-L6-v2's, the projection is drawn from ``torch.manual_seed(seed)``
    (orthonormal rows), so it retrieves about as well as MiniLM's token vectors do.

    Returns:
        The model directory.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertModel

    from .modelinfo import packaged_model_path

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    bert = BertModel.from_pretrained(packaged_model_path(), add_pooling_layer=False)
    state = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    hidden = bert.config.hidden_size
    # An orthogonal projection keeps the geometry of MiniLM's token space (a random Gaussian would too, noisier).
    q, _ = torch.linalg.qr(torch.randn(hidden, hidden))
    state["linear.weight"] = q[:dim].contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = bert.config
    # No ``dim`` in the config: vLLM reads the width from ``linear.weight`` (a config that names it
    # gets it cleared by VllmTokenEmbedder, see ``_colbert_width_overrides``).
    config.architectures = ["HF_ColBERT"]
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(packaged_model_path()).save_pretrained(out)
    return out


#: Real model shapes for throughput benchmarks (weights random; only the shape matters for speed).
RANDOM_SHAPES: dict[str, dict] = {
    "bert-base": {
        "arch": "bert",
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "pooling": "mean",
    },
    "minilm-l6": {
        "arch": "bert",
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
        "pooling": "mean",
    },
    "qwen3-0.6b": {
        "arch": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "pooling": "lasttoken",
    },
    "qwen3-4b": {
        "arch": "qwen3",
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "vocab_size": 151936,
        "pooling": "lasttoken",
    },
}


def build_random_embedding_model(
    out_dir: str | Path, shape: str, tokenizer_dir: str | Path, *, dtype: str = "float32", seed: int = 0
) -> Path:
    """Save a randomly initialised embedding model of a real shape, as a sentence-transformers folder.

    ``shape`` is a key of :data:`RANDOM_SHAPES` (BERT-base, MiniLM-L6, Qwen3-0.6B, Qwen3-4B); the tokenizer is
    copied from ``tokenizer_dir``. sentence-transformers modules (pooling as the real model's:
    mean for BERT, last token for Qwen3-Embedding; then Normalize) are written so both
    sentence-transformers and vLLM pool the same way. For benchmarks: the outputs mean nothing.

    Returns:
        The model directory.
    """
    import json

    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, Qwen3Config, Qwen3Model

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    spec = dict(RANDOM_SHAPES[shape])
    arch, pooling = spec.pop("arch"), spec.pop("pooling")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    if arch == "bert":
        config = BertConfig(vocab_size=max(len(tokenizer), 30522), max_position_embeddings=512, **spec)
        model = BertModel(config, add_pooling_layer=False)
        max_len = 512
    else:
        config = Qwen3Config(
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **spec,
        )
        model = Qwen3Model(config)
        max_len = 8192
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    dim = spec["hidden_size"]
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": dim,
                f"pooling_mode_{pooling}" if pooling != "mean" else "pooling_mode_mean_tokens": True,
            }
        )
    )
    (out / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_len, "do_lower_case": False}))
    return out


@contextlib.contextmanager
def serve_model(
    model: str | Path,
    *args: str,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
) -> Iterator[str]:
    """Run ``vllm serve`` (vLLM's OpenAI-compatible server) on ``model`` while the block runs.

    Started as ``python -m vllm.entrypoints.openai.api_server`` (the CPU wheel's ``vllm`` console
    script fails with PackageNotFoundError), with CPU-friendly defaults that ``args`` (server
    flags) can override: fp32, eager, 1 GiB KV reserve. Yields the base URL once ``/health``
    answers 200; the server is terminated (then killed) on exit.

    Raises:
        RuntimeError: the server exited, or was not healthy within ``timeout`` seconds (with the
            tail of its log).
    """
    import httpx

    if port is None:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    defaults = {"--dtype": "float32", "--enforce-eager": None, "--kv-cache-memory-bytes": str(1 << 30)}
    flags = [str(a) for a in args]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
    ]
    for name, value in defaults.items():
        if name not in flags:
            cmd += [name] + ([value] if value is not None else [])
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", **(env or {})}
    if "VLLM_CPU_OMP_THREADS_BIND" not in full_env:
        full_env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd + flags, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://{host}:{port}"

    def tail() -> str:
        log.seek(0)
        return log.read()[-3000:]

    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve {model} exited with code {proc.returncode}:\n{tail()}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve {model} not healthy after {timeout:.0f} s:\n{tail()}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class JsonStubHandler(BaseHTTPRequestHandler):
    """Base of the tests' scripted HTTP servers: no request log, JSON in and out."""

    def log_message(self, *args: object) -> None:
        pass

    def read_json(self) -> object:
        """The request body, parsed."""
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def send_json(self, code: int, body: object) -> None:
        """Reply ``body`` (JSON-encoded unless already bytes) with status ``code``."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@contextlib.contextmanager
def stub_server(handler: type[BaseHTTPRequestHandler], **attrs: object) -> Iterator[ThreadingHTTPServer]:
    """A threaded HTTP server on a free loopback port running ``handler``; ``attrs`` are set on the
    server (the handler reads them as ``self.server.<name>``). Its URL is ``url_of(server)``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attrs.items():
        setattr(srv, name, value)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def url_of(srv: ThreadingHTTPServer) -> str:
    """``http://127.0.0.1:<port>`` of a :func:`stub_server`."""
    return f"http://127.0.0.1:{srv.server_address[1]}"


def cli_command(*args: str) -> list[str]:
    """The argv that runs ``vllm-eval ARGS`` with this interpreter (``python -m vllm_eval.cli``).

    Not ``-m vllm_eval``: multiprocessing's spawn does not re-import a package's ``__main__`` in the
    engine processes, so the CLI's early-log silencing would not reach them (the console script and
    ``-m vllm_eval.cli`` are re-imported there).
    """
    return [sys.executable, "-m", "vllm_eval.cli", *args]


def offline_env() -> dict[str, str]:
    """This process's environment with the hub libraries in offline mode (tests never reach the hub)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``vllm-eval ARGS`` in a fresh process, offline; stdout and stderr captured as text."""
    return subprocess.run(cli_command(*args), capture_output=True, text=True, timeout=timeout, env=offline_env())


def text_loader(texts: list, batch_size: int = 2):
    """The shape mteb hands to ``encode()``: a ``DataLoader`` of ``{"text": [...]}`` batches."""
    from torch.utils.data import DataLoader

    return DataLoader(
        [{"text": t} for t in texts], batch_size=batch_size, collate_fn=lambda b: {"text": [x["text"] for x in b]}
    )


def row_cosines(a, b):
    """Cosine similarity of each row of ``a`` with the same row of ``b``: float (n,) for (n, dim) inputs."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def score_deltas(model, reference, task_names: list[str]) -> dict[str, float]:
    """|main score of ``model`` - main score of ``reference``| per task, both run through mteb here."""
    from .results import evaluate
    from .tasks import get_tasks

    got = evaluate(model, get_tasks(task_names), show_progress_bar=False)
    ref = evaluate(reference, get_tasks(task_names), show_progress_bar=False)
    return {g.task: abs(g.main_score - r.main_score) for g, r in zip(got, ref)}
