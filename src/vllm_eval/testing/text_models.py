"""Seeded text models for tests: MiniLM cross-encoder, classifiers, ColBERT, tiny Qwen3, reward models."""

from __future__ import annotations

import json
from pathlib import Path

from .shapes import tiny_text_shape, tiny_tokenizer


def build_minilm_cross_encoder(out_dir: str | Path, seed: int = 0) -> Path:
    """Save a one-label ``BertForSequenceClassification`` on the packaged MiniLM encoder.

    The encoder weights are all-MiniLM-L6-v2's; the pooler and classifier head are drawn from
    ``torch.manual_seed(seed)``. sentence-transformers' ``CrossEncoder`` and vLLM both load it.

    Returns:
        The model directory.
    """
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from ..utils.modelinfo import packaged_model_path

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

    from ..tasks.data import pang_lee_polarity
    from ..utils.modelinfo import packaged_model_path

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

    from ..utils.modelinfo import packaged_model_path

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
    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3Config(
        **tiny_text_shape(
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
    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    shape = tiny_text_shape(tokenizer, num_labels=1, id2label={0: "reward"}, label2id={"reward": 0})
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

    from ..utils.modelinfo import packaged_model_path

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
    "qwen3-8b": {  # Qwen3-Embedding-8B's: 7.57 billion parameters
        "arch": "qwen3",
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "pooling": "lasttoken",
    },
}


def build_random_embedding_model(
    out_dir: str | Path, shape: str, tokenizer_dir: str | Path, *, dtype: str = "float32", seed: int = 0
) -> Path:
    """Save a randomly initialised embedding model of a real shape, as a sentence-transformers folder.

    ``shape`` is a key of :data:`RANDOM_SHAPES` (BERT-base, MiniLM-L6, Qwen3-0.6B, Qwen3-4B, Qwen3-8B); the
    tokenizer is copied from ``tokenizer_dir``. The weights are drawn on the GPU when torch sees one (an 8B
    shape is 30 GB in float32 while drawn: minutes on a CPU). sentence-transformers modules (pooling as the
    real model's: mean for BERT, last token for Qwen3-Embedding; then Normalize) are written so both
    sentence-transformers and vLLM pool the same way. For benchmarks: the outputs mean nothing.

    Returns:
        The model directory.
    """

    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, Qwen3Config, Qwen3Model

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    spec = dict(RANDOM_SHAPES[shape])
    arch, pooling = spec.pop("arch"), spec.pop("pooling")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if arch == "bert":
        config = BertConfig(vocab_size=max(len(tokenizer), 30522), max_position_embeddings=512, **spec)
        with device:
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
        with device:
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
