#!/usr/bin/env bash
# Time to result on the lent GPU: whole suites from process start to results written, ours against
# sentence-transformers (and mteb's vLLM wrapper), each backend a fresh process, with each run's timeline.
# After staging vLLM (see scripts/gpu_bench.sh; tokenizers in .devtok/), on the device:
#   source .devstage/bin/on-device.sh && bash scripts/gpu_time_to_result.sh $OUT PART
# PART: models | compile | warm | data | replica | synthetic | run | runs | score. warm: one short run of ours to fill the compile cache. compile: byte-compile the staged packages (pip installed them
# with --no-compile; a user's pip compiles at install). replica: `bench --suite "MTEB(eng, v2)" --fraction
# $FRACTION` (default 0.05); synthetic: `bench --suite synthetic` ($N_DOCS documents, default 200000).
# $RPG replicas per GPU for ours (default 4), $BACKENDS (default "vllm st"), $LIMIT seconds per suite (default
# 540), $DTYPE (default float16), $EXTRA more flags for ours (e.g. --enforce-eager), $TAG a suffix for the output
# names, $SRC another tree's src/ to run (e.g. the previous commit's, for a side-by-side), $MODEL the model folder
# under $MODELS_DIR (default bert-base; qwen3-8b: scripts/gpu_bigmodel.sh model8b).
# Writes $OUT/<part><tag>.txt (the suite's tables) and $OUT/<part><tag>.tgz (its log, suite.json, each backend's
# summary.json).
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
models=${MODELS_DIR:-/root/models}
suite() {  # suite NAME ARGS...: one `bench --suite`, its tables to $OUT/NAME.txt, its JSON files to $OUT/NAME/
  local work=/root/work/$1; local name=$1${TAG:-}; shift
  [ -n "${RESUME:-}" ] || rm -rf "$work/vllm" "$work/st" "$work/mteb-vllm" "$work/suite.json"  # RESUME=1: goes on
  mkdir -p "$out/$name"
  local layout=(--replicas-per-gpu "${RPG:-4}"); [ "${BACKENDS:-vllm st}" = st ] && layout=()
  timeout -k 10 "${LIMIT:-540}" python3 -m vllm_eval.cli bench "$@" --model "$models/${MODEL:-bert-base}" --dtype "${DTYPE:-float16}" \
    --backends ${BACKENDS:-vllm st} "${layout[@]}" ${EXTRA:-} --output-dir "$work" > "$out/$name/bench.log" 2>&1
  echo "exit $?" >> "$out/$name/bench.log"
  tr '\r' '\n' < "$out/$name/bench.log" | grep -v "it/s\]" | grep -E "suite\]|│|┃|━|exit|rror" > "$out/$name.txt"
  cp "$work/suite.json" "$out/$name/" 2>/dev/null
  for b in vllm st mteb-vllm; do [ -f "$work/$b/summary.json" ] && cp "$work/$b/summary.json" "$out/$name/$b-summary.json"; done
  [ -f "$work/vllm/vllm-eval.log" ] && gzip -c "$work/vllm/vllm-eval.log" > "$out/$name/vllm-eval.log.gz"
  for b in vllm st mteb-vllm; do [ -f "$work/$b/log.txt" ] && grep -v "^ '" "$work/$b/log.txt" | tail -40 > "$out/$name/$b-log-tail.txt"; done
  cp "$work/replica-data/replica.json" "$out/$name/" 2>/dev/null
  tar czf "$out/$name.tgz" -C "$out" "$name" && rm -rf "${out:?}/$name"  # the device returns at most 8 files a call
  return 0
}
case $part in
  models)
    python3 - <<PY
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model("$models/bert-base", "bert-base", ".devtok/bert", dtype="float16")
PY
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
    python3 -c "import sentence_transformers, mteb, vllm; print(sentence_transformers.__version__, mteb.__version__, vllm.__version__)" | tee -a "$out/gpu.txt" ;;
  compile)
    # The image's own torch (/opt/torch/.venv) ships without .pyc: every replica compiled its sources (py-spy).
    python3 -m compileall -q -j 16 /root/site src "$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')" > /dev/null 2>&1
    python3 -X importtime -c "import vllm_eval.cli, mteb, vllm" 2> "$out/importtime.txt"; sort -t'|' -k2 -n "$out/importtime.txt" | tail -25 ;;
  warm)  # fill the torch.compile cache of ours' layout (the first run on a fresh machine compiles: ~25 s more)
    timeout -k 10 "${LIMIT:-240}" python3 -m vllm_eval.cli run --model "$models/bert-base" --dtype float16 \
      --replicas-per-gpu "${RPG:-4}" --tasks WordSim353 --no-cache --no-progress > "$out/warm${TAG:-}.log" 2>&1
    echo "exit $?" >> "$out/warm${TAG:-}.log"; grep -E "ready after|exit" "$out/warm${TAG:-}.log" ;;
  data)  # the replica `replica` would build, for `run`/`runs` before any suite ran
    python3 -c "from vllm_eval.tasks.shaped import build_replica; build_replica('/root/work/replica/replica-data', \
'MTEB(eng, v2)', '$models/bert-base', ${FRACTION:-0.05})" ;;
  replica) suite replica --suite "MTEB(eng, v2)" --fraction "${FRACTION:-0.05}" ;;
  synthetic) suite synthetic --suite synthetic --n-docs "${N_DOCS:-200000}" ;;
  run)  # ours alone on the replica the `replica` part wrote, as a user runs it: $NAME, $ENV (e.g.
        # VLLMEVAL_TASK_PROCESSES=0), $EXTRA (e.g. --concurrent-tasks 8); wall seconds in $OUT/run-NAME.txt
    name=${NAME:?name}; work=/root/work/runs/$name; rm -rf "$work"; mkdir -p "$work"
    start=$(date +%s.%N)
    timeout -k 10 "${LIMIT:-300}" env ${ENV:-} python3 -m vllm_eval.cli run --data /root/work/replica/replica-data \
      --model "$models/bert-base" --dtype "${DTYPE:-float16}" --replicas-per-gpu "${RPG:-4}" --no-cache --no-progress ${EXTRA:-} \
      --output-dir "$work" > "$work/stdout.txt" 2>&1
    rc=$?; end=$(date +%s.%N)
    echo "run $name: exit $rc, wall $(python3 -c "print(round($end - $start, 1))") s" | tee "$out/run-$name.txt"
    grep -E "ready after|replica .* start" "$work/stdout.txt" | tail -6 >> "$out/run-$name.txt"
    cp "$work/summary.json" "$out/run-$name-summary.json" 2>/dev/null; tail -5 "$work/stdout.txt" >> "$out/run-$name.txt" ;;
  runs)  # ours alone on the replica, one run per NAME:FLAGS of $RUNS (flags comma-separated, e.g.
         # "eager1:--enforce-eager compiled1: eager2:--enforce-eager"), archived in $OUT/runs$TAG.tgz after each
    mkdir -p "$out/runs${TAG:-}"
    for spec in ${RUNS:?RUNS}; do
      NAME=${spec%%:*} EXTRA=$(echo "${spec#*:}" | tr ',' ' ') OUT_KEEP=1 bash "$0" "$out/runs${TAG:-}" run
      tar czf "$out/runs${TAG:-}.tgz" -C "$out" "runs${TAG:-}"
    done
    cat "$out/runs${TAG:-}"/run-*.txt | grep "^run "; rm -rf "${out:?}/runs${TAG:-}" ;;
  score)  # scoring alone (scripts/scoring_bench.py) on the replica `data` wrote: $PATHS (default fast), $DIM (768),
          # $WORKERS (16) tasks at once, $TASKS (default all), $PROFILE=1 (a cProfile per task, archived);
          # per-task seconds in $OUT/score-<fraction>-<dim><tag>.json
    name=score-${FRACTION:-0.05}-${DIM:-768}${TAG:-}; prof=()
    [ -n "${PROFILE:-}" ] && mkdir -p "$out/$name-prof" && prof=(--profile "$out/$name-prof/prof")
    timeout -k 10 "${LIMIT:-540}" python3 scripts/scoring_bench.py --fraction "${FRACTION:-0.05}" --dim "${DIM:-768}" \
      --replica /root/work/replica/replica-data --tokenizer "$models/bert-base" --paths ${PATHS:-fast} \
      --workers "${WORKERS:-16}" ${TASKS:+--tasks $TASKS} "${prof[@]}" --json "$out/$name.json" > "$out/$name.log" 2>&1
    echo "exit $?" >> "$out/$name.log"; grep -E "^wall|s over|exit|rror" "$out/$name.log"
    [ -n "${PROFILE:-}" ] && tar czf "$out/$name-prof.tgz" -C "$out" "$name-prof" && rm -rf "${out:?}/$name-prof" ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
