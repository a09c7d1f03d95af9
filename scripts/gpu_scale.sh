#!/usr/bin/env bash
# Default layouts and engine sizes on 1, 2 or 4 GPUs: `vllm-eval run` on the MTEB(eng, v2) replica as a new user
# types it (no layout flag), timed from command to exit, with the GPUs' memory sampled every second.
# Random-weight models of real shapes are built on the machine; the tokenizer travels (.devtok/bert: see
# scripts/gpu_bench.sh's header for making it and for staging vLLM with ../shared/device/stage-vllm.sh; add py-spy
# to the staged packages for the `spy` samples: $PYSPY, e.g. /root/site/bin/py-spy). On the device (carry .devstage/bin and .devtok):
#   source .devstage/bin/on-device.sh && bash scripts/gpu_scale.sh $OUT PART
# PART:
#   setup    models ($MODELS, default "bert-base qwen3-8b": build_random_embedding_model shapes, bf16 except
#            BERT-base fp16) into $MODELS_DIR (default /root/models), the replica at $FRACTION (default 0.02) into
#            /root/work/replica-$FRACTION; $OUT/setup.txt (GPUs, versions, build seconds).
#   run      `vllm-eval run --data <replica> --model $MODEL` (default qwen3-8b) on the GPUs of $GPUS (default: all,
#            through CUDA_VISIBLE_DEVICES), $DTYPE (default: bfloat16, float16 for bert-base), $EXTRA more flags,
#            $FRACTION, under $LIMIT seconds (default 420); $NAME (default run) names its files: $OUT/NAME.txt (exit,
#            wall, the layout line, the stall line if any, peak GPU memory), NAME-summary.json, NAME.log.gz (the run's
#            vllm-eval.log), NAME-smi.csv (memory and use every second), packed with NAME.txt's copy into NAME.tgz
#            (two files per run come back). With $SPY=N, py-spy dumps of the command's process tree N seconds in
#            (NAME-spy.txt); with $SPYREC=HZ, `py-spy record --subprocesses --threads` of the whole run at HZ samples
#            a second (NAME-rec.txt.gz, raw: summarize it with scripts/spy_summary.py). With $RAY=1 the replicas are
#            Ray actors of a one-node cluster of these GPUs started for the run on 127.0.0.1:6390 and stopped after
#            (`--ray-address`; Ray places actors only where the layout is given: pass it in $EXTRA). With
#            $KILL_AT=S (with RAY=1), the newest replica actor and its children are SIGKILLed S seconds in
#            (named in NAME.txt).
#   sweep    $N_MODELS (default 8) BERT-base checkpoints (setup with SEEDS=8: bert-seed-0.., random seeds) on the
#            replica: one sweep (`run --model <all>`, $EXTRA flags) into $SWEEP_NAME (default sweep), then one `run`
#            per checkpoint $FROM..$TO-1 (default all; WARMUP=1: a warm-up run of seed 0 first), each timed; the
#            times kept on the machine across calls (split the runs over calls of 10 minutes); every sweep's scores
#            compared with the separate runs'; $OUT/sweep.txt, $SWEEP_NAME.json, sweep.tgz. SEPARATE=0 or SWEEP=0
#            skips a half. $SPYREC=HZ records the sweep as `run` does ($OUT/$SWEEP_NAME-rec.txt.gz).
#   bench    `vllm-eval bench` of $MODEL, fixed:512 texts (max_model_len 8192; BERT-base's 512), $N_TEXTS (default
#            2000), one backend per configuration of $CONFIGS (extra flags per configuration, separated by ';'), each
#            its own process on $GPUS; $OUT/bench-NAME.txt.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
models=${MODELS_DIR:-/root/models}
fraction=${FRACTION:-0.02}; replica=/root/work/replica-$fraction
model=${MODEL:-qwen3-8b}; dtype=${DTYPE:-$([ "$model" = bert-base ] && echo float16 || echo bfloat16)}
gpus=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)}
secs() { python3 -c "print(round($(date +%s.%N) - $1, 1))"; }
# spyrec PID FILE: py-spy samples the command started as PID (its Python child, under `timeout`) and its subprocesses
# at $SPYREC a second into FILE, raw (scripts/spy_summary.py reads it), in the background.
spyrec() {
  sleep 2; local py; py=$(pgrep -P "$1" -f vllm_eval.cli | head -1)
  "${PYSPY:-py-spy}" record --pid "${py:-$1}" --subprocesses --threads --nonblocking -r "$SPYREC" --format raw \
    -o "$2" > "$2.log" 2>&1 &
}
case $part in
  setup)
    { nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
      python3 -c "import vllm, mteb, torch; print('vllm', vllm.__version__, 'mteb', mteb.__version__, 'torch', torch.__version__)"
    } 2>/dev/null | tee -a "$out/setup.txt"
    for m in ${MODELS:-bert-base qwen3-8b}; do
      start=$(date +%s.%N); d=$([ "$m" = bert-base ] && echo float16 || echo bfloat16)
      python3 -c "from vllm_eval.testing import build_random_embedding_model as b; b('$models/$m', '$m', '.devtok/bert', dtype='$d')" \
        2>&1 | grep -v "it/s" | tail -2
      echo "model $m ($d) built in $(secs "$start") s" | tee -a "$out/setup.txt"
    done
    for ((i=0; i<${SEEDS:-0}; i++)); do
      python3 -c "from vllm_eval.testing import build_random_embedding_model as b; b('$models/bert-seed-$i', 'bert-base', '.devtok/bert', dtype='float16', seed=$i)" \
        2>&1 | grep -v "it/s" | tail -2
    done
    [ "${SEEDS:-0}" -gt 0 ] && echo "bert-base seeds 0..$((SEEDS-1)) built" | tee -a "$out/setup.txt"
    start=$(date +%s.%N)
    python3 -c "from vllm_eval.tasks.shaped import build_replica as b; b('$replica', 'MTEB(eng, v2)', '.devtok/bert', fraction=$fraction)" \
      2>&1 | tail -2
    echo "replica at $fraction built in $(secs "$start") s ($(du -sh "$replica" | cut -f1))" | tee -a "$out/setup.txt" ;;
  run)
    name=${NAME:-run}; work=/root/work/runs/$name; rm -rf "$work"; mkdir -p "$work"
    nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -l 1 > "$out/$name-smi.csv" &
    smi=$!
    ray_flag=()
    if [ "${RAY:-0}" = 1 ]; then
      CUDA_VISIBLE_DEVICES=$gpus RAY_USAGE_STATS_ENABLED=0 timeout 60 ray start --head --node-ip-address 127.0.0.1 \
        --port 6390 --include-dashboard=false --disable-usage-stats > "$work/ray-start.log" 2>&1
      echo "ray start: exit $?" >> "$work/ray-start.log"; ray_flag=(--ray-address 127.0.0.1:6390)
    fi
    start=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "${LIMIT:-420}" python3 -m vllm_eval.cli run --data "$replica" \
      --model "$models/$model" --dtype "$dtype" --no-cache --no-progress ${EXTRA:-} "${ray_flag[@]}" \
      --output-dir "$work" > "$work/stdout.txt" 2>&1 &
    cmd=$!
    if [ -n "${KILL_AT:-}" ]; then
      ( sleep "$KILL_AT"; victim=$(pgrep -n -f "ray::_ReplicaActor")
        echo "killed at ${KILL_AT} s: pid $victim ($(tr '\0' ' ' < /proc/$victim/cmdline | cut -c1-80)) and its children" \
          > "$work/killed.txt"
        pkill -9 -P "$victim"; kill -9 "$victim" ) &
    fi
    [ -n "${SPYREC:-}" ] && spyrec "$cmd" "$work/rec.txt"
    if [ -n "${SPY:-}" ]; then
      ( sleep "$SPY"; for p in $(pgrep -f "vllm_eval" ); do echo "== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-150)"; \
        timeout 20 "${PYSPY:-py-spy}" dump --pid "$p" 2>&1 | head -60; done > "$out/$name-spy.txt" ) &
    fi
    wait $cmd; rc=$?; wall=$(secs "$start"); kill $smi 2>/dev/null
    [ "${RAY:-0}" = 1 ] && timeout 60 ray stop --force > /dev/null 2>&1
    { echo "run $name: model $model $dtype, GPUs $gpus, fraction $fraction, extra '${EXTRA:-} ${ray_flag[*]}': exit $rc, wall $wall s"
      cat "$work/killed.txt" 2>/dev/null
      grep -E "layout:|error|stalled|answered none|made no progress|Traceback|OutOfMemory" "$work/stdout.txt" | cut -c1-600 | head -8
      python3 - "$out/$name-smi.csv" <<'PY'
import sys, collections
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) >= 3 and parts[2].endswith("MiB"):
        peak[parts[1]] = max(peak[parts[1]], int(parts[2].split()[0]))
print("peak GPU memory (MiB):", dict(peak))
PY
    } | tee "$out/$name.txt"
    tail -3 "$work/stdout.txt" >> "$out/$name.txt"
    sleep 2; [ -f "$work/rec.txt" ] && gzip -c "$work/rec.txt" > "$out/$name-rec.txt.gz"
    pack=$work/pack/$name; mkdir -p "$pack"; cp "$out/$name.txt" "$work/stdout.txt" "$pack/"
    cp "$work/summary.json" "$pack/$name-summary.json" 2>/dev/null
    [ -f "$work/vllm-eval.log" ] && cp "$work/vllm-eval.log" "$pack/$name.log"
    mv "$out/$name-smi.csv" "$out/$name-rec.txt.gz" "$out/$name-spy.txt" "$pack/" 2>/dev/null
    tar czf "$out/$name.tgz" -C "$work/pack" "$name" ;;
  bench)
    name=${NAME:-bench}; IFS=';' read -ra configs <<< "${CONFIGS:-}"; [ ${#configs[@]} = 0 ] && configs=("")
    for i in "${!configs[@]}"; do
      CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "${LIMIT:-240}" python3 -m vllm_eval.cli bench --model "$models/$model" \
        --dtypes "$dtype" --backends vllm --lengths fixed:512 --n-texts "${N_TEXTS:-2000}" --batch-sizes "${N_TEXTS:-2000}" \
        --max-model-len "$([ "$model" = bert-base ] && echo 512 || echo 8192)" ${configs[$i]} --output-dir "/root/work/$name-$i" > "$out/$name-$i.log" 2>&1
      echo "== config $i '${configs[$i]}': exit $?" | tee -a "$out/bench-$name.txt"
      tr '\r' '\n' < "$out/$name-$i.log" | grep -v "it/s\]" | grep -E "│|tok/s|rror|ready" | tee -a "$out/bench-$name.txt"
    done ;;
  sweep)
    # $N_MODELS (default 8) checkpoints bert-seed-0.. on $GPUS: one sweep (`run --model <all>`) into $SWEEP_NAME
    # (default sweep), then one `run` each for seeds $FROM..$TO-1 (default all; with WARMUP=1 a warm-up run of
    # seed 0 first), each timed from command to exit; the times kept in /root/work/sweep/times.txt across calls;
    # then every sweep's scores compared with the separate runs' (bit for bit). SEPARATE=0 or SWEEP=0 skips a half:
    # on a fresh machine run the runs first (SWEEP=0, then SEPARATE=0), since its first vLLM command pays about
    # 25 s of cold caches (docs/bench/h200-sweep-3).
    n=${N_MODELS:-8}; work=/root/work/sweep; mkdir -p "$work"; ckpts=(); sname=${SWEEP_NAME:-sweep}
    for ((i=0; i<n; i++)); do ckpts+=("$models/bert-seed-$i"); done
    # $LIMIT: seconds for each command (default 150 a run, 560 the sweep: 8 models, ~400 s projected on a 16-core host).
    go() { CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "${LIMIT:-$limit}" python3 -m vllm_eval.cli run --data "$replica" \
             --dtype float16 --no-cache --no-progress ${EXTRA:-} --output-dir "$@" ; }
    note() { echo "$1" | tee -a "$out/sweep.txt" >> "$work/times.txt"; }
    if [ "${SWEEP:-1}" = 1 ]; then
      rm -rf "${work:?}/$sname"; start=$(date +%s.%N); limit=560
      go "$work/$sname" --model "${ckpts[@]}" > "$work/$sname.txt" 2>&1 &
      cmd=$!
      [ -n "${SPYREC:-}" ] && spyrec "$cmd" "$work/$sname-rec.txt"
      wait $cmd
      note "sweep $sname of $n, extra '${EXTRA:-}'${SPYREC:+, py-spy at $SPYREC Hz}: exit $?, $(secs "$start") s"
      sleep 2; [ -f "$work/$sname-rec.txt" ] && gzip -c "$work/$sname-rec.txt" > "$out/$sname-rec.txt.gz"
      grep -E "layout|rror" "$work/$sname.txt" | sort | uniq -c | head -5 | tee -a "$out/sweep.txt"
      cp "$work/$sname/sweep.json" "$out/$sname.json" 2>/dev/null
    fi
    if [ "${SEPARATE:-1}" = 1 ]; then
      limit=150
      if [ "${WARMUP:-0}" = 1 ]; then
        start=$(date +%s.%N); go "$work/warmup" --model "${ckpts[0]}" > "$work/warmup.txt" 2>&1
        note "warm-up run (seed 0): exit $?, $(secs "$start") s"
      fi
      for ((i=${FROM:-0}; i<${TO:-$n}; i++)); do
        rm -rf "$work/separate/bert-seed-$i"; start=$(date +%s.%N)
        go "$work/separate/bert-seed-$i" --model "${ckpts[$i]}" > "$work/separate-$i.txt" 2>&1
        note "separate run $i: exit $?, $(secs "$start") s"
      done
    fi
    python3 - "$work" "$n" <<'PY' | tee -a "$out/sweep.txt"
import json, re, sys, pathlib
work, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
times = (work / "times.txt").read_text() if (work / "times.txt").is_file() else ""
alone_s = [float(s) for s in re.findall(r"separate run \d+: exit 0, ([\d.]+) s", times)]
print(f"separate runs so far: {len(alone_s)}, {sum(alone_s):.1f} s in all")
def scores(folder):
    path = folder / "summary.json"
    return {r["task"]: r["main_score"] for r in json.loads(path.read_text())["scores"]} if path.is_file() else None
for sweep in sorted(work.glob("*/sweep.json")):
    data = json.loads(sweep.read_text())
    print(f"{sweep.parent.name}: seconds per model {[m['seconds'] for m in data['models']]}, "
          f"reloaded {[m['reloaded'] for m in data['models']]}")
    same, diff = 0, []
    for label, swept in data["scores"].items():
        alone = scores(work / "separate" / label)
        for task, score in (alone or {}).items():
            same += swept.get(task) == score
            if swept.get(task) != score:
                diff.append((label, task, score, swept.get(task)))
    print(f"  scores equal to the separate runs': {same}, different: {len(diff)}")
    for row in diff[:20]:
        print("  different:", *row)
warm, first = scores(work / "warmup"), scores(work / "separate" / "bert-seed-0")
if warm and first:
    print("seed 0 run twice: tasks that differ:", [t for t in first if warm.get(t) != first[t]])
PY
    tar czf "$out/sweep.tgz" -C "$work" --exclude='*.npz' --exclude='results' . 2>/dev/null ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
