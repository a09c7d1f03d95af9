#!/usr/bin/env bash
# A VLM end to end on the GPU: a tiny Qwen2-VL built here with the machine's transformers, then
# `vllm-eval generate --tasks Digits` through vLLM CUDA, and in-process checks that images reach the
# model (prompt token counts, outputs per image), with one and two images per prompt, before and after
# the text. After vLLM is staged:  source .devstage/bin/on-device.sh && bash scripts/gpu_vlm.sh $OUT
set -euo pipefail
out=${1:?output dir}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
model=${MODELS_DIR:-/root/models}/tiny-qwen2-vl
python3 -c "from vllm_eval.testing import build_tiny_qwen2_vl; build_tiny_qwen2_vl('$model')" 2>&1 | tail -2
python3 -c "import transformers, vllm; print('transformers', transformers.__version__, 'vllm', vllm.__version__)" | tee "$out/versions.txt"
if [ -z "${SKIP_CLI:-}" ]; then
  python3 -m vllm_eval.cli generate --model "$model" --tasks Digits --limit 40 --max-tokens 8 --dtype float32 \
    --enforce-eager --max-missing 1 --output-dir "$out/digits" --no-progress --no-cache 2>&1 | grep -v "it/s\]\|^$" | tail -4
  python3 -c "import json; s=[json.loads(l) for l in open('$out/digits/samples.jsonl')]; \
print('Digits via the CLI:', len(s), 'samples,', len({x['output'] for x in s}), 'distinct outputs for one question text')" \
    | tee "$out/images.txt"
fi
[ "${SKIP_IMAGES:-}" ] || python3 scripts/gpu_vlm_images.py "$model" 2>&1 | grep "^position=" | tee -a "$out/images.txt"
# Images in log-likelihood scoring through the CLI (parity with transformers: tests/test_vlm.py, CPU build)
python3 -m vllm_eval.cli generate --model "$model" --tasks Digits --limit 40 --scoring loglikelihood --dtype float32 \
  --enforce-eager --output-dir "$out/digits-loglik" --no-progress --no-cache 2>&1 | grep -v "it/s\]\|^$" | tail -4
python3 -c "import json; s=[json.loads(l) for l in open('$out/digits-loglik/samples.jsonl')]; \
print('Digits loglikelihood via the CLI:', len(s), 'samples,', len({tuple(x['output']['loglikelihoods'].values()) for x in s}), \
'distinct score vectors; prompt:', repr(s[0]['prompt'][:120]))" | tee "$out/loglik-cli.txt"
