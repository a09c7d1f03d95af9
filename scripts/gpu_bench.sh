#!/usr/bin/env bash
# The GPU half of issue #5's measurements, run on the lent machine after vLLM is staged
# (../shared/device/stage-vllm.sh). Random-weight models of real shapes are built there; only
# tokenizers travel (.devtok/, git-ignored), made here with:
#   .venv/bin/python -c "from transformers import AutoTokenizer; from vllm_eval.encoder import packaged_model_path; \
#     AutoTokenizer.from_pretrained(packaged_model_path()).save_pretrained('.devtok/bert'); \
#     from vllm_eval.testing import _tiny_tokenizer; _tiny_tokenizer().save_pretrained('.devtok/qwen')"
# Then, on the device (carry .devstage/bin and .devtok):
#   source .devstage/bin/on-device.sh && bash scripts/gpu_bench.sh $OUT [N_TEXTS]
# Each length mode runs in its own process: with vLLM 0.26 one long-lived engine twice hit a msgspec
# decode error after many requests.
set -euo pipefail
out=${1:?output dir}; n=${2:-20000}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
python3 - <<'PY'
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model("/root/models/bert-base", "bert-base", ".devtok/bert", dtype="float16")
build_random_embedding_model("/root/models/qwen3-0.6b", "qwen3-0.6b", ".devtok/qwen", dtype="bfloat16")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for lengths in fixed:130 mixed:16-500; do
  python3 -m vllm_eval.cli bench --model /root/models/bert-base --dtypes float16 --backends vllm st mteb-vllm \
    --lengths "$lengths" --batch-sizes 1024 "$n" --n-texts "$n" --output-dir "$out/bert-base-${lengths%%:*}" 2>&1 \
    | tr '\r' '\n' | grep -E "tok/s  |x st|rror" | grep -v "it/s\]"
done
python3 -m vllm_eval.cli bench --model /root/models/qwen3-0.6b --dtypes bfloat16 --backends vllm st \
  --lengths fixed:130 --batch-sizes 1024 "$n" --n-texts "$n" --output-dir "$out/qwen3-0.6b" 2>&1 \
  | tr '\r' '\n' | grep -E "tok/s  |x st|rror" | grep -v "it/s\]"
