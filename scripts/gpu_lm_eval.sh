#!/usr/bin/env bash
# lm-eval's tasks on a GPU: `vllm-eval generate` against `lm_eval --model vllm` (scripts/lm_eval_bench.py --gpu) on
# random-weight causal LMs of real shapes with SmolLM2's tokenizer (vllm_eval.testing.build_random_causal_lm), on the
# packaged real data; and whether the prefix cache serves prompt log-probabilities (scripts/prompt_logprob_cache.py).
# Staging (on this machine, before the first call):
#   VLLM_VERSION=0.33.0 bash ../shared/device/stage-vllm.sh --with-project-deps soundfile cffi pycparser soxr jiwer \
#     click rapidfuzz whisper-normalizer indic-numtowords more-itertools text2num sacrebleu colorama lxml portalocker \
#     tabulate lm-eval==0.4.13 evaluate pytablewriter DataProperty mbstrdecoder pathvalidate tabledata tcolorpy \
#     typepy chardet rouge-score nltk
# its parts re-split under 52 MB (the working tree travels with each carry, 64 MiB in all; join them in numeric order,
# `cat .devstage/p{0..26}/part*`, not the shell's p0 p1 p10 ..., and split the whole into q00, q01 ...; on the device
# each goes to /root/parts/partNN), and
# `bash scripts/gpu_lm_eval.sh - stage` (needs `make lm-data`): .devlm holds lm-data, SmolLM2's tokenizer and wheels
# of sqlitedict and word2number (no wheel on the index); carry it once: mv .devlm /root/lm.
# On the device, each later call carries .devstage/bin:
#   source .devstage/bin/on-device.sh && bash scripts/gpu_lm_eval.sh $OUT PART
# PART:
#   stage  (here, not on the device) .devlm, as above.
#   setup  installs the two wheels, links lm-data, builds $SHAPE (default qwen3-8b; also qwen3-0.6b) in
#          /root/models/$SHAPE, bfloat16; $OUT/setup-$SHAPE.txt.
#   probe  prompt_logprob_cache.py --gpu on /root/models/$SHAPE with $ARGS; $OUT/prompt-logprob-cache-$SHAPE.json.
#   bench  (LIMIT: a minute over --timeout, so the driver can stop a run and write its report)
#          lm_eval_bench.py --gpu --model /root/models/$SHAPE --work /root/work $ARGS (e.g. --runs ours,vllm --set
#          mmlu:0.05:5 --timeout 500); its report (seconds to exit, to results, of the evaluation; tokens generated
#          and their rate) in $OUT/bench-$NAME/, logs (ours' vllm-eval.log too) and results files in its files.tar.gz.
#   hold   as bench, while another process holds $HOLD_GIB GiB of the GPU (default: what a 79.6 GiB H100 lacks), with
#          --engine gpu_memory_utilization= the bytes our default takes on an H100, as a share of this GPU.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
shape=${SHAPE:-qwen3-8b}; model=/root/models/$shape; name=${NAME:-$part}
py=python3; [ -x .venv/bin/python ] && [ "$part" = stage ] && py=.venv/bin/python
case "$part" in
  stage)
    rm -rf .devlm && mkdir -p .devlm/wheels
    cp -r "${VLLMEVAL_LM_DATA:-$HOME/.cache/vllm-eval/lm-data}" .devlm/lm-data
    $py -c "from vllm_eval.testing.packaged import build_smollm2; build_smollm2('.devlm/smollm2-full')"
    mkdir -p .devlm/smollm2 && find .devlm/smollm2-full -maxdepth 1 -type f ! -name "*.safetensors" \
      ! -name config.json ! -name generation_config.json -exec cp {} .devlm/smollm2/ \;
    rm -rf .devlm/smollm2-full
    $py -m pip wheel -q --no-deps -w .devlm/wheels sqlitedict word2number
    gd=$(git rev-parse --git-dir); grep -qx '/.devlm/' "$gd/info/exclude" 2>/dev/null || echo '/.devlm/' >> "$gd/info/exclude"
    du -sh .devlm ;;
  setup)
    python3 -m pip install -q --no-index --no-deps --target /root/site /root/lm/wheels/*.whl 2>&1 | grep -vi warning
    mkdir -p /root/.cache/vllm-eval && ln -sfn /root/lm/lm-data /root/.cache/vllm-eval/lm-data
    start=$(date +%s)
    timeout 300 python3 -c "from vllm_eval.testing import build_random_causal_lm as b; b('$model', '$shape', '/root/lm/smollm2')"
    echo "rc $? built $shape in $(( $(date +%s) - start )) s" | tee "$out/setup-$shape.txt"
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >> "$out/setup-$shape.txt" ;;
  probe)
    timeout ${LIMIT:-300} python3 scripts/prompt_logprob_cache.py --gpu --model "$model" ${ARGS:-} \
      --out "$out/prompt-logprob-cache-$shape.json" 2>&1 | grep -v "^INFO\|^(EngineCore" | tail -20 ;;
  bench|hold)
    holder=
    if [ "$part" = hold ]; then
      python3 - "${HOLD_GIB:-}" <<'EOF' &
import sys, time, torch
free, total = torch.cuda.mem_get_info()
gib = float(sys.argv[1]) if sys.argv[1] else (total - 79.6 * 1024**3) / 1024**3
block = torch.empty(int(gib * 1024**3), dtype=torch.uint8, device="cuda")
print(f"holding {gib:.1f} GiB of {total / 1024**3:.1f}", flush=True)
time.sleep(3600)
EOF
      holder=$!; sleep 20
      # the share our default gives on an H100 (81,559 MiB), as a share of this GPU: the same bytes
      share=$(python3 -c "
import math; from vllm_eval.engine import sizing as s
h100, total = 81559 * 2**20, s.gpu_memory()[1]
r = s.prompt_logprob_reserve(s.model_shape('$model'), s.GPU_GENERATE_MAX_NUM_BATCHED_TOKENS)
print(math.floor(s.memory_share(h100, scoring=False, reserve=r) * h100 / total * 1e4) / 1e4)")
      echo "gpu_memory_utilization $share (an H100's default bytes)" | tee "$out/hold-share.txt"
      ARGS="${ARGS:-} --engine gpu_memory_utilization=$share"
    fi
    mkdir -p "$out/bench-$name" /root/work
    timeout ${LIMIT:-560} python3 scripts/lm_eval_bench.py --gpu --model "$model" --work /root/work ${ARGS:-} 2>&1 \
      | grep -v "^INFO\|^(EngineCore\|it/s\]$" | tail -40
    # at most 8 files come back from a call: the report, and the logs and results files in one archive
    cp /root/work/lm_eval_bench.json "$out/bench-$name/" 2>/dev/null
    mkdir -p /root/files
    for f in /root/work/*-*/*/results_*.json; do [ -f "$f" ] && cp "$f" "/root/files/$(basename "$(dirname "$(dirname "$f")")")-results.json"; done
    for f in /root/work/*-*/summary.json; do [ -f "$f" ] && cp "$f" "/root/files/$(basename "$(dirname "$f")")-summary.json"; done
    # our run's own log: vLLM's timed INFO lines (engine start, compile, KV cache) go there, not to stdout
    for f in /root/work/*-*/vllm-eval.log; do [ -f "$f" ] && cp "$f" "/root/files/$(basename "$(dirname "$f")")-vllm-eval.log"; done
    cp /root/work/*.log /root/files/ 2>/dev/null; tar czf "$out/bench-$name/files.tar.gz" -C /root/files .
    [ -n "$holder" ] && kill "$holder"
    nvidia-smi --query-gpu=memory.used --format=csv >> "$out/bench-$name/memory.txt" ;;
  *) echo "part: stage, setup, probe, bench or hold" >&2; exit 2 ;;
esac
