"""Seeded text models for tests: MiniLM cross-encoder, classifiers, ColBERT, tiny Qwen3, reward models."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    "qwen3-tiny": {  # the Qwen3 layout at test size (CPU checks of what runs on a GPU at 8B)
        "arch": "qwen3",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,  # vLLM's CPU attention has no kernel for head_dim 16
        "intermediate_size": 256,
        "pooling": "lasttoken",
    },
}


def _random_model(make: Callable[[Any], Any], config: Any, dtype: str, seed: int) -> Any:
    """``make(config)`` (a model class) with weights drawn from ``torch.manual_seed(seed)``, cast to ``dtype``.

    Drawn on the GPU when torch sees one: an 8B shape is 30 GB of float32 while drawn, minutes on a CPU.
    """
    import torch

    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = make(config)
    return model.to(getattr(torch, dtype))


def _qwen3_config(spec: dict, tokenizer: Any, **extra: Any) -> Any:
    """A ``Qwen3Config`` of a :data:`RANDOM_SHAPES` entry (``arch`` and ``pooling`` already taken out) for
    ``tokenizer`` (its EOS and padding ids), 32,768 positions; ``extra`` overrides."""
    from transformers import Qwen3Config

    return Qwen3Config(
        **{
            "max_position_embeddings": 32768,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **spec,
            **extra,
        }
    )


def build_random_embedding_model(
    out_dir: str | Path, shape: str, tokenizer_dir: str | Path, *, dtype: str = "float32", seed: int = 0
) -> Path:
    """Save a randomly initialised embedding model of a real shape, as a sentence-transformers folder.

    ``shape`` is a key of :data:`RANDOM_SHAPES` (BERT-base, MiniLM-L6, Qwen3-0.6B, Qwen3-4B, Qwen3-8B); the
    tokenizer is copied from ``tokenizer_dir``. The weights are drawn on the GPU when torch sees one (an 8B
    shape is 30 GB in float32 while drawn: minutes on a CPU). sentence-transformers modules (pooling as the
    real model's: mean for BERT, last token for Qwen3-Embedding; then Normalize) are written so both
    sentence-transformers and vLLM pool the same way; a Qwen3 shape's ``config.json`` names ``Qwen3ForCausalLM``,
    as Qwen3-Embedding's does. For benchmarks: the outputs mean nothing.

    Returns:
        The model directory.
    """
    from transformers import AutoTokenizer, BertConfig, BertModel, Qwen3Model

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    spec = dict(RANDOM_SHAPES[shape])
    arch, pooling = spec.pop("arch"), spec.pop("pooling")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if arch == "bert":
        config = BertConfig(vocab_size=max(len(tokenizer), 30522), max_position_embeddings=512, **spec)
        model = _random_model(lambda c: BertModel(c, add_pooling_layer=False), config, dtype, seed)
        max_len = 512
    else:
        model = _random_model(Qwen3Model, _qwen3_config(spec, tokenizer, tie_word_embeddings=True), dtype, seed)
        max_len = 8192
    model.save_pretrained(out, safe_serialization=True)
    if arch != "bert":
        # "Qwen3ForCausalLM", as Qwen3-Embedding's config.json says (its weights are Qwen3Model's): vLLM resolves it to
        # its own Qwen3 and converts that to an embedder. With "Qwen3Model" (what save_pretrained writes) vLLM 0.26
        # inspected the model class in a subprocess at every start: ~20 s of an 8B engine's 46 s on an H200
        # (docs/bench/h200-start8b).
        config_json = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config_json, "architectures": ["Qwen3ForCausalLM"]}, indent=2))
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


def _qwen3_spec(shape: str) -> dict[str, Any]:
    """A Qwen3 entry of :data:`RANDOM_SHAPES` without its ``arch`` and ``pooling``.

    Raises:
        ValueError: ``shape`` is not a Qwen3 entry (a causal LM or a reranker needs one).
    """
    spec = dict(RANDOM_SHAPES[shape])
    if spec.pop("arch") != "qwen3":
        raise ValueError(f"a causal LM needs a Qwen3 shape, not {shape!r}")
    del spec["pooling"]
    return spec


def build_random_causal_lm(
    out_dir: str | Path, shape: str, tokenizer_dir: str | Path, *, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """Save a randomly initialised ``Qwen3ForCausalLM`` of a real shape with a real tokenizer, for benchmarks of
    generative tasks (lm-eval's multiple choice, perplexity and generation): the outputs mean nothing.

    ``shape`` is a Qwen3 key of :data:`RANDOM_SHAPES` (``qwen3-0.6b``: Qwen3-0.6B's layers, tied embeddings;
    ``qwen3-8b``: Qwen3-8B's, an untied ``lm_head``). The vocabulary is the tokenizer's (SmolLM2's 49,152 rather than
    Qwen3's 151,936: every id a random model samples must decode), so the logits of one step are a third of the real
    model's. Weights drawn on the GPU when torch sees one. The tokenizer and its chat template are copied from
    ``tokenizer_dir``.

    Returns:
        The model directory.

    Raises:
        ValueError: ``shape`` is not a Qwen3 entry of :data:`RANDOM_SHAPES` (KeyError: no such entry).
    """
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    spec = _qwen3_spec(shape)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    spec["vocab_size"] = len(tokenizer)
    config = _qwen3_config(spec, tokenizer, tie_word_embeddings=shape != "qwen3-8b", torch_dtype=dtype)
    model = _random_model(Qwen3ForCausalLM, config, dtype, seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _prompt_only_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` adding no special tokens around a text, as Qwen's does (returned as is when it adds none).

    A WordPiece tokenizer wraps every text in ``[CLS] ... [SEP]``: a reranker's score would be read at ``[SEP]``
    instead of after the template's tail, and sentence-transformers (which renders the pair through a chat template,
    no special tokens) and vLLM (which tokenizes the prompt with them) would score different ids. transformers
    rebuilds a BERT tokenizer's ``[CLS]``/``[SEP]`` post-processor when it loads one, so the result is a generic
    fast tokenizer (same vocabulary, normaliser and special tokens) without a post-processor. ``tokenizer`` itself is
    left as it was.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if tokenizer("a b")["input_ids"] == tokenizer("a b", add_special_tokens=False)["input_ids"]:
        return tokenizer
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.post_processor = None
    return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer.special_tokens_map)


def build_random_reranker_model(
    out_dir: str | Path,
    shape: str,
    tokenizer_dir: str | Path | None = None,
    *,
    dtype: str = "float32",
    seed: int = 0,
    tie_word_embeddings: bool | None = None,
) -> Path:
    """Save a randomly initialised Qwen3-Reranker-style model of a real shape: a ``Qwen3ForCausalLM`` with its
    ``lm_head``, whose P(yes) at the last position is the score (the ``qwen3-reranker`` preset's recipe).

    ``shape`` is a Qwen3 key of :data:`RANDOM_SHAPES` (``qwen3-8b`` is Qwen3-Reranker-8B's: 7.6 billion
    parameters with the 151,936-row embedding and ``lm_head``; ``qwen3-tiny`` for CPU tests). The tokenizer is
    ``tokenizer_dir``'s (default: the packaged all-MiniLM-L6-v2 WordPiece, 30,522 ids, where ``yes`` and ``no``
    are single tokens), made to add no special tokens (:func:`_prompt_only_tokenizer`); the vocabulary is the
    shape's or the tokenizer's, whichever is larger. ``tie_word_embeddings`` defaults to the real models'
    (tied below hidden size 4096: Qwen3-0.6B/4B; untied at 8B). Weights are drawn on the GPU when torch sees one.
    Name the folder ``*qwen3-reranker*`` for the preset to apply by itself. For benchmarks: the scores mean nothing.

    Returns:
        The model directory.

    Raises:
        ValueError: a shape that is not a Qwen3 one; a tokenizer without single ``yes`` / ``no`` tokens.
    """
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from ..utils.modelinfo import packaged_model_path

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    spec = _qwen3_spec(shape)
    tokenizer = _prompt_only_tokenizer(AutoTokenizer.from_pretrained(tokenizer_dir or packaged_model_path()))
    tokenizer.model_max_length = 32768  # the model's positions: our code cuts documents, not the tokenizer's 512
    ids = tokenizer.convert_tokens_to_ids(["yes", "no"])
    if None in ids or tokenizer.unk_token_id in ids:
        raise ValueError("the tokenizer needs 'yes' and 'no' as single tokens (the reranker reads their logits)")
    spec["vocab_size"] = max(spec.get("vocab_size", 0), len(tokenizer))
    tied = spec["hidden_size"] < 4096 if tie_word_embeddings is None else tie_word_embeddings
    config = _qwen3_config(spec, tokenizer, tie_word_embeddings=tied, architectures=["Qwen3ForCausalLM"])
    model = _random_model(Qwen3ForCausalLM, config, dtype, seed)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
