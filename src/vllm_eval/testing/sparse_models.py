"""Seeded sparse retrieval models for tests: a tiny SPLADE (BERT MLM head) and a tiny BGE-M3 (XLM-R with its heads).

Both are a few MB, built in seconds, and loaded by the engines and references the tests compare: the SPLADE
by vLLM's ``BertSpladeSparseEmbeddingModel`` and sentence-transformers' ``SparseEncoder``; the BGE-M3 by vLLM's
``BgeM3EmbeddingModel`` and by transformers plus its two head files (the layout FlagEmbedding ships).
"""

from __future__ import annotations

import json
from pathlib import Path


def build_tiny_splade(out_dir: str | Path, seed: int = 0) -> Path:
    """Save a tiny random SPLADE model: ``BertForMaskedLM`` with the packaged MiniLM's WordPiece vocabulary
    (30,522 ids), as ``naver/splade-v3`` is laid out: a sentence-transformers ``SparseEncoder`` folder
    (``MLMTransformer`` then ``SpladePooling``, max pooling, ReLU) whose ``config.json`` names
    ``BertForMaskedLM`` (vLLM runs it as ``BertSpladeSparseEmbeddingModel`` through ``hf_overrides``).

    Shapes: hidden 32, one attention head of 32 (vLLM's CPU attention has no kernel for 16), 2 layers, MLP 64,
    128 positions; the MLM decoder is untied from the word embeddings (vLLM loads ``cls.predictions.decoder``
    by name, and a tied checkpoint omits it). Weights from ``torch.manual_seed(seed)``; the decoder bias is
    shifted down so that a few hundred of the 30,522 dimensions are active per text (real SPLADE vectors are sparse).
    About 8 MB.

    Returns:
        The model directory.
    """
    import torch
    from safetensors.torch import save_file
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from ..utils.modelinfo import packaged_model_path

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(packaged_model_path())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        architectures=["BertForMaskedLM"],
    )
    model = BertForMaskedLM(config).to(torch.float32)
    with torch.no_grad():
        model.cls.predictions.decoder.weight.normal_(0.0, 0.25)
        model.cls.predictions.bias.fill_(-4.5)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 saves the decoder's bias once, as cls.predictions.bias (tied); vLLM reads it under
    # cls.predictions.decoder.bias only (as checkpoints such as naver/splade-v3 carry both): write both.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.model_max_length = 128
    tokenizer.save_pretrained(out)
    st = SparseEncoder(modules=[MLMTransformer(str(out), max_seq_length=128), SpladePooling("max")], device="cpu")
    st.similarity_fn_name = "dot"  # as SPLADE checkpoints declare it (mteb scores SPLADE by dot product)
    st.save(str(out))
    return out


def _m3_tokenizer():
    """A byte-level BPE of 600 ids with XLM-R's special tokens at XLM-R's ids (``<s>`` 0, ``<pad>`` 1,
    ``</s>`` 2, ``<unk>`` 3) and its template: ``<s> text </s>``."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from .shapes import train_bpe_tokenizer

    tok = train_bpe_tokenizer(600, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    tok.post_processor = TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                            special_tokens=[("<s>", 0), ("</s>", 2)])  # fmt: skip
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=128,
    )


def build_tiny_bge_m3(out_dir: str | Path, seed: int = 0) -> Path:
    """Save a tiny random BGE-M3-shaped model, laid out as ``BAAI/bge-m3``: an ``XLMRobertaModel``
    (``model.safetensors``), ``sparse_linear.pt`` (``Linear(hidden, 1)``: one lexical weight per token, after
    ReLU) and ``colbert_linear.pt`` (``Linear(hidden, hidden)``: the multi-vector projection), both
    ``torch.save``'d state dicts as FlagEmbedding writes them, and sentence-transformers modules (CLS pooling,
    Normalize: the dense output). vLLM runs it as ``BgeM3EmbeddingModel`` (``hf_overrides``).

    Shapes: hidden 32, one head, 2 layers, MLP 64, a 600-id byte-level BPE with XLM-R's special ids
    (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3), 130 positions (RoBERTa's offset of 2). Weights from
    ``torch.manual_seed(seed)``; the sparse head's bias is 0, so about half the tokens get a weight. Under 1 MB.

    Returns:
        The model directory.
    """
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = _m3_tokenizer()
    torch.manual_seed(seed)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=1,
        intermediate_size=64,
        max_position_embeddings=130,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        architectures=["XLMRobertaModel"],
    )
    model = XLMRobertaModel(config, add_pooling_layer=False).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    sparse = torch.nn.Linear(32, 1)
    colbert = torch.nn.Linear(32, 32)
    with torch.no_grad():
        sparse.weight.normal_(0.0, 1.0)
        sparse.bias.zero_()
    torch.save(sparse.state_dict(), out / "sparse_linear.pt")
    torch.save(colbert.state_dict(), out / "colbert_linear.pt")
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True})
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
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    return out
