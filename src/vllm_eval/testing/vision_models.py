"""Tiny vision-language models for tests (LLaVA, Idefics3, Qwen2-VL, CLIP, SigLIP, ColModernVBERT) and a
Qwen2.5-VL-7B-shaped one for throughput runs, all of random weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .shapes import CHATML_TEMPLATE, tiny_text_shape, tiny_tokenizer, tiny_vision_shape


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
    tokenizer = tiny_tokenizer(("<image>",))
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(**tiny_vision_shape(image_size, projection_dim=64))
    text = Qwen2Config(**tiny_text_shape(tokenizer, tie_word_embeddings=False))
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


def build_tiny_idefics3(
    out_dir: str | Path, seed: int = 0, image_size: int = 56, score_tokens: tuple[str, str] | None = None
) -> Path:
    """Save a tiny randomly initialised ``Idefics3ForConditionalGeneration`` (SmolVLM's architecture)
    with its processor.

    Vision: SigLIP-style, patch 14 on ``image_size`` px (16 patches for 56 px), hidden 64, 2 layers;
    the connector's pixel shuffle (scale 2) leaves 4 image tokens per image. No image splitting: one
    global tile per image. Text: Llama, hidden 128, 4 heads of 32, 2 layers. The ChatML template
    renders an image part as ``<image>``, which the processor (transformers, or vLLM's) expands to
    ``<fake_token_around_image><global-img><image>×4<fake_token_around_image>``. Weights from
    ``torch.manual_seed(seed)``, float32. Idefics3's image processor runs on PIL without torchvision,
    so vLLM's CPU build runs this model. A plumbing model: its answers mean nothing.

    ``score_tokens=("no", "yes")`` also saves a one-label classifier head ``score.weight`` = the LM head's
    "yes" row minus its "no" row (``num_labels=1``): loaded as a sequence classifier (vLLM's ``convert=
    "classify"``), its score sigmoid(h·w) is P(yes) of softmax(logit_no, logit_yes), as the Qwen3 rerankers
    are read. (vLLM's ``classifier_from_token`` recipe builds that head itself for models whose LM head sits
    in their language model, e.g. Qwen2/3-VL; Idefics3's sits beside it, where the recipe reads an empty head.)

    Returns:
        The model directory.
    """
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = tiny_tokenizer(("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"))
    torch.manual_seed(seed)
    scale = 2
    text = tiny_text_shape(tokenizer, model_type="llama", tie_word_embeddings=False)
    vision = tiny_vision_shape(image_size)
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
    if score_tokens is not None:
        _add_score_head(out, model.lm_head.weight, tokenizer.convert_tokens_to_ids(list(score_tokens)))
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


def _add_score_head(out: Path, lm_head: Any, ids: list[int]) -> None:
    """Add ``score.weight`` (1, hidden) = lm_head[ids[1]] - lm_head[ids[0]] to the saved weights; one label."""
    import json

    from safetensors.torch import load_file, save_file

    (weights,) = out.glob("*.safetensors")
    tensors = load_file(weights)
    tensors["score.weight"] = (lm_head[ids[1]] - lm_head[ids[0]]).detach().reshape(1, -1).contiguous()
    save_file(tensors, weights, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (out / "config.json").write_text(json.dumps(config, indent=2))


#: The Qwen2-VL chat template of :func:`build_tiny_qwen2_vl`: :data:`CHATML_TEMPLATE` with an image part
#: as ``<|vision_start|><|image_pad|><|vision_end|>`` (the processor expands the pad to the image's tokens).
QWEN2_VL_TEMPLATE = CHATML_TEMPLATE.replace("{{- '<image>' }}", "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}")


#: build_tiny_qwen2_vl's shapes: text overrides, vision config, dtype, largest image side in pixels.
_QWEN2_VL_SHAPES: dict[str, tuple[dict, dict, str, int]] = {
    "tiny": (
        {},
        dict(depth=2, embed_dim=64, hidden_size=128, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2),
        "float32",
        112,
    ),
    "qwen2-vl-2b": (
        dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            head_dim=128,
            mrope_section=[16, 24, 24],
        ),
        dict(
            depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14, spatial_merge_size=2
        ),
        "bfloat16",
        224,
    ),
}


def build_tiny_qwen2_vl(out_dir: str | Path, seed: int = 0, shape: str = "tiny") -> Path:
    """Save a randomly initialised ``Qwen2VLForConditionalGeneration`` with its processor.

    ``shape="tiny"``: vision tower of 2 blocks (width 64, patch 14, 2x2 merge), text model as
    :func:`build_tiny_qwen3` (hidden 128, 2 layers, multimodal RoPE sections 4/6/6), fp32; images resized to
    at most 112x112 pixels (16 image tokens). ``shape="qwen2-vl-2b"``: Qwen2-VL-2B's towers (vision 32 blocks
    of 1280, text 28 layers of 1536, 12 heads, 2 KV heads, MLP 8960), bfloat16, built on the GPU when there is
    one, images up to 224x224 (64 image tokens): for throughput only. Both: vocab ≈ 1,000 plus the vision
    tokens, weights from ``torch.manual_seed(seed)``. Built where it runs: vLLM's CUDA build loads it with
    the transformers that saved it. A plumbing model: its answers mean nothing.

    Returns:
        The model directory.

    Raises:
        ValueError: an unknown ``shape``.
    """
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    vision_tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    tokenizer = tiny_tokenizer(extra_tokens=vision_tokens)
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in vision_tokens}
    torch.manual_seed(seed)
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    if shape not in _QWEN2_VL_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(_QWEN2_VL_SHAPES)}")
    text_shape, vision, dtype, side = _QWEN2_VL_SHAPES[shape]
    config = Qwen2VLConfig(
        text_config=tiny_text_shape(
            tokenizer,
            max_position_embeddings=4096,
            rope_parameters={**rope, "mrope_section": text_shape.get("mrope_section", [4, 6, 6])},
            rope_scaling={"type": "mrope", "mrope_section": text_shape.get("mrope_section", [4, 6, 6])},
            tie_word_embeddings=False,
            **{k: v for k, v in text_shape.items() if k != "mrope_section"},
        ),
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
    )
    with torch.device("cuda" if shape != "tiny" and torch.cuda.is_available() else "cpu"):
        model = Qwen2VLForConditionalGeneration(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out, safe_serialization=True)
    del model  # built on the GPU: give its memory back before an engine asks for its share
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    # The tokenizer (with the template) and the image processor; AutoProcessor assembles Qwen2VLProcessor
    # from them (building it here would need torchvision for its video processor).
    Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=side * side).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


#: Qwen2.5-VL-7B-Instruct's towers (its config.json): text 28 layers of 3584, 28 heads, 4 KV heads, MLP 18944; vision
#: 32 blocks of 1280 (MLP 3420, SiLU), windowed attention with full attention at blocks 7, 15, 23 and 31.
QWEN25_VL_7B = {
    "text": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=128000,
        rope_theta=1000000.0,
        rms_norm_eps=1e-06,
    ),
    "vision": dict(
        depth=32,
        hidden_size=1280,
        hidden_act="silu",
        intermediate_size=3420,
        num_heads=16,
        in_chans=3,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        tokens_per_second=2,
        window_size=112,
        out_hidden_size=3584,
        fullatt_block_indexes=[7, 15, 23, 31],
    ),
    "mrope_section": [16, 24, 24],
}


def build_random_qwen2_5_vl(out_dir: str | Path, tokenizer_dir: str | Path, seed: int = 0, tiny: bool = False) -> Path:
    """Save a randomly initialised ``Qwen2_5_VLForConditionalGeneration`` of Qwen2.5-VL-7B-Instruct's shape
    (:data:`QWEN25_VL_7B`, bfloat16, about 8.3 B parameters with this vocabulary) with a real tokenizer, for
    throughput runs against eva's and lmms-eval's vLLM paths: its answers mean nothing.

    The tokenizer is ``tokenizer_dir``'s (SmolLM2's: its 49,152 ids, so every id sampled decodes) with Qwen's
    vision tokens added and Qwen's chat-template image placeholder; Qwen2-VL's image processor with its default
    pixel bounds (a 96x96 patch becomes 84x84, 9 image tokens, as for the real model). Weights drawn on the GPU
    when torch sees one. ``tiny``: the same classes at 2 layers of 128 and a 2-block tower, float32 (a check on
    the CPU build that the layout loads).

    Returns:
        The model directory.
    """
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor

    from .text_models import _random_model

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    vision_tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_tokens(list(vision_tokens), special_tokens=True)
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in vision_tokens}
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text, vision, section = dict(QWEN25_VL_7B["text"]), dict(QWEN25_VL_7B["vision"]), QWEN25_VL_7B["mrope_section"]
    if tiny:
        text |= dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
        text |= dict(num_key_value_heads=2, max_position_embeddings=4096)
        vision |= dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128)
        vision |= dict(fullatt_block_indexes=[1])
        section = [4, 6, 6]
    dtype = "float32" if tiny else "bfloat16"
    rope = {"rope_type": "default", "rope_theta": text.pop("rope_theta", 1000000.0), "mrope_section": section}
    config = Qwen2_5_VLConfig(
        text_config={
            **text,
            "vocab_size": len(tokenizer),
            "eos_token_id": eos,
            "pad_token_id": pad,
            "rope_parameters": rope,
            "rope_scaling": {"type": "mrope", "mrope_section": section},
            "tie_word_embeddings": False,
            "torch_dtype": dtype,
        },
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    model = _random_model(Qwen2_5_VLForConditionalGeneration, config, dtype, seed)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out, safe_serialization=True)
    del model  # built on the GPU: give its memory back before an engine asks for its share
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    tokenizer.save_pretrained(out)
    try:  # the whole processor where torchvision imports (its video processor needs it), as the real model ships
        from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor

        processor = Qwen2_5_VLProcessor(Qwen2VLImageProcessor(), tokenizer, Qwen2VLVideoProcessor())
        processor.chat_template = QWEN2_VL_TEMPLATE
        processor.save_pretrained(out)
    except (ImportError, RuntimeError):  # the CPU build's torch has no torchvision beside it
        Qwen2VLImageProcessor().save_pretrained(out)
    return out


def _tower(hidden: int, layers: int, heads: int) -> dict[str, int]:
    return {
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
    }


_TINY_TOWER = {**_tower(64, 2, 2), "intermediate_size": 128}  # CLIP's and SigLIP's tiny text and vision towers

# shape -> (text tower, vision tower, patch size, projection dim)
_CLIP_SHAPES = {
    "tiny": (_TINY_TOWER, _TINY_TOWER, 14, 64),
    "vit-b-32": (_tower(512, 12, 8), _tower(768, 12, 12), 32, 512),
}


def build_tiny_clip(out_dir: str | Path, seed: int = 0, image_size: int = 28, shape: str = "tiny") -> Path:
    """Save a tiny randomly initialised ``CLIPModel`` (text and image towers into one space) with its processor.

    Text: hidden 64, 2 layers, 77 positions, a byte-level BPE of 1,000 tokens trained on gensim's Lee corpus
    with ``<|startoftext|>`` / ``<|endoftext|>`` added after the vocabulary (vLLM's CLIP uses token id 0 as its
    image placeholder, so id 0 must be an ordinary token) and every text framed by them (CLIP pools the
    end-of-text token). Vision: patch 14 on ``image_size`` px, hidden 64, 2 layers. Projection 64. The image
    processor is the PIL one (no torchvision). Weights from ``torch.manual_seed(seed)``, float32: a plumbing
    model, its similarities mean nothing. ``shape="vit-b-32"`` gives the towers of openai/clip-vit-base-patch32
    instead (text 512 wide, 12 layers, 8 heads; vision 768 wide, 12 layers, 12 heads, patch 32 on 224 px;
    projection 512), with the same small vocabulary: for throughput measurements (``scripts/clip_bench.py``).

    Returns:
        The model directory.
    """
    import torch
    from tokenizers import processors
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor, PreTrainedTokenizerFast

    try:
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    except ImportError:  # transformers before the PIL/torchvision split of image processors
        from transformers import CLIPImageProcessor as CLIPImageProcessorPil

    from .shapes import train_bpe_tokenizer

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tok = train_bpe_tokenizer(vocab_size=1000, special_tokens=[])
    tok.add_special_tokens(["<|startoftext|>", "<|endoftext|>"])
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tokenizer.model_max_length = 77
    torch.manual_seed(seed)
    text_tower, vision_tower, patch, proj = _CLIP_SHAPES[shape]
    image_size = 224 if shape == "vit-b-32" else image_size
    text = {**text_tower, "vocab_size": len(tokenizer), "max_position_embeddings": 77, "projection_dim": proj}
    text.update(bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
    vision = {**vision_tower, "image_size": image_size, "patch_size": patch, "projection_dim": proj}
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=proj)).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    crop = {"height": image_size, "width": image_size}
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size}, crop_size=crop)
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_siglip(out_dir: str | Path, seed: int = 0, image_size: int = 28) -> Path:
    """Save a tiny randomly initialised ``SiglipModel`` (text and image towers into one space) with its processor.

    Text: hidden 64, 2 layers, 64 positions (SigLIP's text length: its texts are padded to 64 tokens), a
    byte-level BPE of 1,000 tokens trained on gensim's Lee corpus with ``</s>`` appended to every text and used
    as the padding (as SigLIP's tokenizer); the text tower pools the last position. Vision: patch 14 on
    ``image_size`` px, hidden 64, 2 layers, the attention-pooling head. Image processor: the PIL one. Weights
    from ``torch.manual_seed(seed)``, float32: a plumbing model, its similarities mean nothing.

    Returns:
        The model directory.
    """
    import torch
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast, SiglipConfig, SiglipModel, SiglipProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from .shapes import train_bpe_tokenizer

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tok = train_bpe_tokenizer(vocab_size=1000, special_tokens=[])
    tok.add_special_tokens(["</s>", "<unk>"])
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="</s>",
        pad_token="</s>",
        unk_token="<unk>",
        model_max_length=64,
        model_input_names=["input_ids"],  # as SigLIP's own tokenizer: no attention mask, the model attends to pads
    )
    torch.manual_seed(seed)
    text = {**_TINY_TOWER, "vocab_size": len(tokenizer), "max_position_embeddings": 64, "pad_token_id": eos}
    text.update(bos_token_id=eos, eos_token_id=eos, projection_size=64)
    vision = {**_TINY_TOWER, "image_size": image_size, "patch_size": 14}
    model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    size = {"height": image_size, "width": image_size}
    SiglipProcessor(image_processor=SiglipImageProcessorPil(size=size), tokenizer=tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


#: build_tiny_colmodernvbert's towers, with only the fields vLLM's ``ColModernVBertConfig`` reads (it rebuilds
#: ``ModernBertConfig`` / ``SiglipVisionConfig`` from these keys, every other field at its default).
_COLMODERNVBERT_TEXT = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512
)
_COLMODERNVBERT_VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)


def build_tiny_colmodernvbert(out_dir: str | Path, seed: int = 0, image_size: int = 64) -> Path:
    """Save a tiny randomly initialised ColModernVBERT (late-interaction retriever: SigLIP vision tower, pixel-shuffle
    connector, ModernBERT text encoder, per-token 128-d L2-normalised vectors) in the layout of
    ``ModernVBERT/colmodernvbert-merged``, the one vLLM's ``ColModernVBertForRetrieval`` loads.

    Built with transformers' ``ColModernVBertForRetrieval`` (weights from ``torch.manual_seed(seed)``, float32) and
    saved with ``model_type="modernvbert"``, flat ``text_config`` / ``vision_config`` and the weights renamed
    ``vlm.*`` -> ``model.*``, ``embedding_proj_layer.*`` -> ``model.custom_text_proj.*``;
    :func:`load_tiny_colmodernvbert_reference` loads it back into transformers. Text: ModernBERT, hidden 128,
    4 heads, MLP 256, 2 layers (one global, one local attention). Vision: SigLIP, patch 8 on ``image_size`` px,
    hidden 64, 2 layers; pixel shuffle 2, so ``(image_size // 16) ** 2`` image tokens (16 for 64 px). Tokenizer:
    the tiny BPE plus ``<fake_token_around_image>``, ``<image>``, ``<end_of_utterance>``, ``<global-img>``,
    ``<|begin_of_text|>``. Idefics3's PIL image processor (no splitting: every image resized to ``image_size``
    square) and transformers' ``ColModernVBertProcessor`` (``process_queries`` / ``process_images``).
    vLLM's processor puts an image's ``<image>`` tokens at the start of the prompt. A plumbing model.

    Returns:
        The model directory.
    """
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import ColModernVBertForRetrieval, ColModernVBertProcessor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = tiny_tokenizer(
        ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", "<|begin_of_text|>")
    )
    tokenizer.chat_template = None  # ColModernVBERT's prompts are plain text (its processor drops templates)
    flat = {
        "architectures": ["ColModernVBertForRetrieval"],
        "model_type": "modernvbert",
        "embedding_dim": 128,
        "image_token_id": tokenizer.convert_tokens_to_ids("<image>"),
        "pixel_shuffle_factor": 2,
        "text_config": {**_COLMODERNVBERT_TEXT, "vocab_size": len(tokenizer), "mlp_bias": False},
        "vision_config": {**_COLMODERNVBERT_VISION, "image_size": image_size, "patch_size": 8},
        "torch_dtype": "float32",
    }
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = ColModernVBertForRetrieval(_colmodernvbert_hf_config(flat, tokenizer.pad_token_id)).to(torch.float32)
    tensors = {_colmodernvbert_weight_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size}
    )
    seq_len = (image_size // 8 // 2) ** 2
    processor = ColModernVBertProcessor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=seq_len)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(flat, indent=2))  # last: a directory with it is complete
    return out


def _colmodernvbert_weight_name(name: str) -> str:
    """transformers' weight name -> the merged checkpoint's (transformers 5's ``SiglipVisionModel`` has no inner
    ``vision_model``; the checkpoint, as transformers 4's, has)."""
    if name.startswith("embedding_proj_layer."):
        return "model.custom_text_proj." + name.removeprefix("embedding_proj_layer.")
    if name.startswith("vlm.vision_model.") and not name.startswith("vlm.vision_model.vision_model."):
        return "model.vision_model.vision_model." + name.removeprefix("vlm.vision_model.")
    return "model." + name.removeprefix("vlm.")


def _colmodernvbert_hf_config(flat: dict[str, Any], pad_token_id: int | None):
    from transformers import ColModernVBertConfig, ModernBertConfig, ModernVBertConfig, SiglipVisionConfig

    ids = dict.fromkeys(("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"))  # ModernBERT's are > vocab
    text = ModernBertConfig(**flat["text_config"], **ids, pad_token_id=pad_token_id)
    vlm = ModernVBertConfig(
        text_config=text.to_dict(),
        vision_config=SiglipVisionConfig(**flat["vision_config"]).to_dict(),
        image_token_id=flat["image_token_id"],
        pixel_shuffle_factor=flat["pixel_shuffle_factor"],
    )
    return ColModernVBertConfig(vlm_config=vlm, embedding_dim=flat["embedding_dim"])


def load_tiny_colmodernvbert_reference(model_dir: str | Path):
    """transformers' ``ColModernVBertForRetrieval`` (float32, eval mode) with the weights of a
    :func:`build_tiny_colmodernvbert` directory: the reference for vLLM's per-token vectors."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import ColModernVBertForRetrieval, PreTrainedTokenizerFast

    model_dir = Path(model_dir)
    flat = json.loads((model_dir / "config.json").read_text())
    pad = PreTrainedTokenizerFast.from_pretrained(model_dir).pad_token_id
    model = ColModernVBertForRetrieval(_colmodernvbert_hf_config(flat, pad)).to(torch.float32)
    saved = load_file(model_dir / "model.safetensors")
    names = {_colmodernvbert_weight_name(k): k for k in model.state_dict()}
    model.load_state_dict({names[k]: v for k, v in saved.items()}, strict=True)
    return model.eval()
