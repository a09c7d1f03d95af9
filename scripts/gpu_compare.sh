#!/usr/bin/env bash
# GPU parity and FP8 measurements with `vllm-eval compare` / `bench`, run on the lent machine after vLLM
# is staged (../shared/device/stage-vllm.sh) and tokenizers are in .devtok/ (see scripts/gpu_bench.sh).
# Random-weight models of real shapes are built there: scores are meaningless, differences between
# configurations of the same weights are what is measured.
#   source .devstage/bin/on-device.sh && bash scripts/gpu_compare.sh $OUT PART
# PART: models | encoder | generator | fp8-bench
set -euo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
export VLLMEVAL_CACHE_DIR=/root/vllm-eval-cache CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
models=${MODELS_DIR:-/root/models}
cli() { python3 -m vllm_eval.cli "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s\]\|^$" || true; }
case $part in
  models)
    python3 - <<PY
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from vllm_eval.testing import build_random_embedding_model, tiny_tokenizer
build_random_embedding_model("$models/bert-base", "bert-base", ".devtok/bert", dtype="float32")
tok = tiny_tokenizer()
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                  tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                  pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None, torch_dtype="bfloat16")
Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained("$models/qwen3-0.6b-lm", safe_serialization=True)
tok.save_pretrained("$models/qwen3-0.6b-lm")
PY
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt" ;;
  encoder)  # fp8 takes 16-bit activations only (vLLM refuses float32 + fp8): two comparisons, one cache
    tasks=(--tasks LeeDocSimilarity WordSim353 SimLex999 PangLeePolarity LeeKnownItemRetrieval)
    cli compare --model "$models/bert-base" --backends vllm st --dtypes float32 float16 --reference st:float32 \
      "${tasks[@]}" --output-dir "$out/encoder" --no-progress | tee "$out/encoder.txt"
    cli compare --model "$models/bert-base" --backends vllm --dtypes float16 --quantization fp8 --reference st:float32 \
      "${tasks[@]}" --output-dir "$out/encoder-fp8" --no-progress | tee "$out/encoder-fp8.txt" ;;
  generator)
    cli compare --kind generator --model "$models/qwen3-0.6b-lm" --backends vllm hf --dtypes float32 bfloat16 \
      --reference hf:float32 --limit 100 --sample 64 --output-dir "$out/generator" --no-progress | tee "$out/generator.txt"
    cli compare --kind generator --model "$models/qwen3-0.6b-lm" --backends vllm --dtypes bfloat16 --quantization fp8 \
      --reference hf:float32 --limit 100 --sample 64 --output-dir "$out/generator-fp8" --no-progress \
      | tee "$out/generator-fp8.txt" ;;
  fp8-bench)
    python3 - <<PY
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model("$models/qwen3-0.6b", "qwen3-0.6b", ".devtok/qwen", dtype="bfloat16")
PY
    for q in none fp8; do
      extra=(); [ "$q" = fp8 ] && extra=(--quantization fp8)
      cli bench --model "$models/qwen3-0.6b" --dtypes bfloat16 --backends vllm --replicas-per-gpu ${RPGS:-1} \
        --lengths fixed:130 --batch-sizes ${N:-20000} --n-texts ${N:-20000} "${extra[@]}" --output-dir "$out/bench-$q" \
        | grep -E "tok/s|rror|Traceback" | tee -a "$out/fp8-bench.txt"
    done ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
