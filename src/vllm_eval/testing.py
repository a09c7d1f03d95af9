"""Small models built locally for tests and offline demos (no cross-encoder or LLM ships offline).

They are real Hugging Face checkpoints that vLLM, transformers and sentence-transformers load,
with seeded random weights where no trained weights exist: good for plumbing and parity checks,
meaningless for quality. Build them once into a directory and reuse it.

* :func:`build_minilm_cross_encoder` — ``BertForSequenceClassification`` (one label): the packaged
  all-MiniLM-L6-v2 encoder plus a seeded classifier head.
* :func:`build_tiny_qwen3` — a randomly initialised 2-layer ``Qwen3ForCausalLM`` with a byte-level
  BPE tokenizer trained on gensim's Lee background corpus, ``yes``/``no`` as single tokens and a
  Qwen-style chat template (for the Qwen3-Reranker recipe and for generation tests).
"""

from __future__ import annotations

from pathlib import Path

#: Qwen2/Qwen3 chat template (ChatML), trimmed to what the tests use: optional system turn,
#: user/assistant turns, generation prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
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

    from .encoder import packaged_model_path

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
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    raw = _train_bpe_tokenizer(vocab_size=1000)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None
    )
    tokenizer.add_tokens(["yes", "no"])
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.model_max_length = 2048
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="float32",
    )
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
