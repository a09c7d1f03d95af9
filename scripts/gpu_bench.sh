#!/usr/bin/env bash
# The GPU measurements of issues #5 and #6, run on the lent machine after vLLM is staged
# (../shared/device/stage-vllm.sh). Random-weight models of real shapes are built there; only
# tokenizers travel (.devtok/, git-ignored), made here with:
#   .venv/bin/python -c "from transformers import AutoTokenizer; from vllm_eval.utils.modelinfo import packaged_model_path; \
#     AutoTokenizer.from_pretrained(packaged_model_path()).save_pretrained('.devtok/bert'); \
#     from vllm_eval.testing import tiny_tokenizer; tiny_tokenizer().save_pretrained('.devtok/qwen')"
# The staging script's 60 MiB parts plus this repo's tracked files (12 MB) exceed one call's 64 MiB: re-split them
#   cat .devstage/p*/part* > /tmp/all.tar && rm -rf .devstage/p* && split -b 48000000 -d -a 1 /tmp/all.tar /tmp/part \
#     && for i in $(seq 0 9); do [ -f /tmp/part$i ] && mkdir -p .devstage/p$i && mv /tmp/part$i .devstage/p$i/; done
# and carry .devstage/p0 ... p9 one call each (mkdir -p /root/parts && mv .devstage/pN/part* /root/parts/).
# Then, on the device (carry .devstage/bin and .devtok):
#   source .devstage/bin/on-device.sh && bash scripts/gpu_bench.sh $OUT PART [N_TEXTS]
# PART: models | bert-fixed | bert-mixed | qwen3 | dp (the last needs 2 GPUs). Each part is its own
# process: with vLLM 0.26 one long-lived engine twice hit a msgspec decode error after many requests.
set -euo pipefail
out=${1:?output dir}; part=${2:?part}; n=${3:-20000}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
models=${MODELS_DIR:-/root/models}
show() { tr '\r' '\n' | grep -E "tok/s  |x st|x mteb|rror|Traceback" | grep -v "it/s\]" || true; }
bench() { python3 -m vllm_eval.cli bench "$@" 2>&1 | show; }
case $part in
  models)
    python3 - <<PY
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model("$models/bert-base", "bert-base", ".devtok/bert", dtype="float16")
build_random_embedding_model("$models/qwen3-0.6b", "qwen3-0.6b", ".devtok/qwen", dtype="bfloat16")
PY
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt" ;;
  bert-fixed|bert-mixed)
    lengths=$([ "$part" = bert-fixed ] && echo fixed:130 || echo mixed:16-500)
    CUDA_VISIBLE_DEVICES=0 bench --model "$models/bert-base" --dtypes float16 --backends ${BACKENDS:-vllm st mteb-vllm} \
      --replicas-per-gpu ${RPGS:-1 2 4} --lengths "$lengths" --batch-sizes 2048 "$n" --n-texts "$n" \
      --output-dir "$out/$part" ;;
  qwen3)
    CUDA_VISIBLE_DEVICES=0 bench --model "$models/qwen3-0.6b" --dtypes bfloat16 --backends vllm st \
      --replicas-per-gpu ${RPGS:-1 2 4} --lengths fixed:130 --batch-sizes 2048 "$n" --n-texts "$n" \
      --output-dir "$out/$part" ;;
  dp)
    bench --model "$models/bert-base" --dtypes float16 --backends vllm --data-parallel-size 1 2 \
      --replicas-per-gpu ${RPG:-1} --lengths mixed:16-500 --batch-sizes "$n" --n-texts "$n" --output-dir "$out/$part" ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
