#!/usr/bin/env bash
# The GPU half of issue #5's measurements, run on the lent machine after vLLM is staged
# (../shared/device/stage-vllm.sh). Random-weight models of real shapes are built there; only
# tokenizers travel (.devtok/). Usage: bash scripts/gpu_bench.sh OUT_DIR [N_TEXTS]
set -euo pipefail
out=${1:?output dir}; n=${2:-20000}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
python3 - <<'PY'
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model("/root/models/bert-base", "bert-base", ".devtok/bert", dtype="float16")
build_random_embedding_model("/root/models/qwen3-0.6b", "qwen3-0.6b", ".devtok/qwen", dtype="bfloat16")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -m vllm_eval.cli bench --model /root/models/bert-base --dtypes float16 --backends vllm st mteb-vllm \
  --lengths fixed:130 mixed:16-500 --batch-sizes 1024 "$n" --n-texts "$n" --output-dir "$out/bert-base" 2>&1 | grep -v "it/s\]" | tail -40
python3 -m vllm_eval.cli bench --model /root/models/qwen3-0.6b --dtypes bfloat16 --backends vllm st \
  --lengths fixed:130 --batch-sizes 1024 "$n" --n-texts "$n" --output-dir "$out/qwen3-0.6b" 2>&1 | grep -v "it/s\]" | tail -20
