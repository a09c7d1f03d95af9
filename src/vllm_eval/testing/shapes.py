"""Shared shapes of the tiny test models: the ChatML template, a BPE tokenizer, text and vision configs."""

from __future__ import annotations

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


def train_bpe_tokenizer(vocab_size: int, special_tokens: list[str] | None = None):
    """A byte-level BPE trained on gensim's Lee background corpus; ``special_tokens`` (default the ChatML
    three) take the first ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from ..tasks.data import lee_background_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if special_tokens is None else special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lee_background_documents(), trainer=trainer)
    return tok


def tiny_tokenizer(extra_tokens: tuple[str, ...] = ()):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe_tokenizer(vocab_size=1000),
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


def tiny_text_shape(tokenizer, **overrides: Any) -> dict[str, Any]:
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


def tiny_vision_shape(image_size: int, **overrides: Any) -> dict[str, Any]:
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
