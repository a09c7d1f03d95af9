#!/usr/bin/env bash
# Where the throughput of BERT-base-shaped replicas on one GPU goes (mixed 16-500 tokens), on the lent machine
# after staging (scripts/gpu_bench.sh: models part first; py-spy's wheel copied into .devstage/bin/):
#   source .devstage/bin/on-device.sh && bash scripts/gpu_profile.sh $OUT PART
# PART:
#   sweep    `vllm-eval bench` once per spec of $SPECS (replicas per GPU, options, environment), each in its own
#            process, while `nvidia-smi dmon` samples the GPU each second; $OUT/sweep.txt: tok/s and each second's SM%.
#   best     the fastest spec of this machine's sweeps: "RPG FLAGS" (environment variables first).
#   spy      py-spy (raw stacks of every process, 25 Hz, non-blocking) over one 4-replica bench; $OUT/spy.txt.gz.
#   spy-run  py-spy over `vllm-eval run --data $DATA` (ours alone on a suite's data); $OUT/spy-run.txt.gz.
#   kernels  scripts/gpu_kernel_profile.py: one in-process engine's kernel time against wall time ($CONFIGS).
# $N texts (default 50000), $EXTRA more flags for bench (e.g. --max-num-batched-tokens 32768), $TAG a suffix.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}; tag=${TAG:-}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
models=${MODELS_DIR:-/root/models}; n=${N:-50000}
B=(--model "$models/bert-base" --dtype float16 --backends vllm --lengths mixed:16-500 --batch-sizes "$n" --n-texts "$n")
rates() { tr '\r' '\n' < "$1" | grep -E "tok/s|rror|Traceback" | grep -v "it/s\]" || true; }
mps_on() {  # a private NVIDIA MPS control daemon: processes given its pipe directory share one GPU context
  export CUDA_MPS_PIPE_DIRECTORY=/root/work/mps/pipe CUDA_MPS_LOG_DIRECTORY=/root/work/mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"; nvidia-cuda-mps-control -d; }
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
busy() {  # the SM% of samples from second $2 to $3 (dmon's time column, HH:MM:SS) in $1
  awk -v a="$2" -v b="$3" '$1 !~ /^#/ && $2 >= a && $2 <= b {printf "%s ", $4}' "$1"; echo; }
case $part in
  sweep)  # $SPECS: NAME:RPG:ARGS each, ARGS comma-separated, VAR=value ones set in the environment (e.g.
          # "r4:4: r1a:1:--async-scheduling,true r2m:2:VLLM_ENABLE_V1_MULTIPROCESSING=1"); default: 4, 1, 8 replicas.
          # MPS=1 among a spec's variables: that bench runs under a private MPS daemon (mps_on / mps_off)
    nvidia-smi dmon -s u -d 1 -o DT > "$out/dmon$tag.txt" 2>&1 & dm=$!
    for spec in ${SPECS:-r4:4: r1:1: r8:8:}; do
      name=${spec%%:*}; rest=${spec#*:}; r=${rest%%:*}; args=(); envs=()
      for a in $(echo "${rest#*:}" | tr ',' ' '); do [[ $a =~ ^[A-Z_0-9]+= ]] && envs+=("$a") || args+=("$a"); done
      a=$(date +%T); [[ " ${envs[*]} " == *" MPS=1 "* ]] && mps_on
      timeout -k 10 "${LIMIT:-240}" env "${envs[@]}" python3 -m vllm_eval.cli bench "${B[@]}" --replicas-per-gpu "$r" \
        "${args[@]}" --output-dir "/root/work/sweep$tag-$name" > "$out/sweep$tag-$name.log" 2>&1
      echo "== $name: $r per GPU ${envs[*]} ${args[*]}, exit $? ($a - $(date +%T))" >> "$out/sweep$tag.txt"
      [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && mps_off
      rates "$out/sweep$tag-$name.log" >> "$out/sweep$tag.txt"
      echo "SM% each second: $(busy "$out/dmon$tag.txt" "$a" "$(date +%T)")" >> "$out/sweep$tag.txt"
      gzip -f "$out/sweep$tag-$name.log"
      tar czf "$out/sweep$tag-logs.tgz" -C "$out" $(cd "$out" && ls sweep$tag-*.log.gz dmon$tag.txt)
    done
    kill $dm; cat "$out/sweep$tag.txt" | tee -a /root/work/sweeps.txt; (cd "$out" && rm -f sweep$tag-*.log.gz dmon$tag.txt) ;;
  best)  # the fastest spec of this machine's sweeps so far, as "RPG ENV_AND_FLAGS" (for RPG= and EXTRA=)
    awk '/^== /{sub(/^== /,""); split($0, h, ", exit"); spec=h[1]} /tok\/s/{for(i=1;i<=NF;i++) if($(i+1)=="tok/s" && $i+0>best){best=$i+0; b=spec}}
      END{split(b, p, ": "); split(p[2], q, " per GPU"); print q[1], q[2]}' /root/work/sweeps.txt ;;
  spy)
    spy=$(command -v py-spy || echo /root/spy/bin/py-spy)
    [ -x "$spy" ] || python3 -m pip install -q --no-index --no-deps --target /root/spy .devstage/bin/py_spy-*.whl
    timeout -s INT -k 20 "${LIMIT:-240}" "$spy" record --subprocesses --nonblocking -r 25 -f raw -o "/root/work/spy$tag.txt" -- \
      python3 -m vllm_eval.cli bench "${B[@]}" --replicas-per-gpu "${RPG:-4}" ${EXTRA:-} --output-dir /root/work/spy$tag \
      > "$out/spy$tag.log" 2>&1
    echo "exit $?" >> "$out/spy$tag.log"; rates "$out/spy$tag.log"; tail -3 "$out/spy$tag.log"
    gzip -c "/root/work/spy$tag.txt" > "$out/spy$tag.txt.gz" ;;
  spy-run)  # py-spy over ours alone on the data a suite built ($DATA, default the synthetic suite's), as a user runs it
    spy=$(command -v py-spy || echo /root/spy/bin/py-spy)
    [ -x "$spy" ] || python3 -m pip install -q --no-index --no-deps --target /root/spy .devstage/bin/py_spy-*.whl
    timeout -s INT -k 20 "${LIMIT:-240}" "$spy" record --subprocesses --nonblocking -r 25 -f raw -o "/root/work/spy-run$tag.txt" -- \
      python3 -m vllm_eval.cli run --data "${DATA:-/root/work/synthetic/synthetic-data}" --model "$models/bert-base" \
      --dtype float16 --replicas-per-gpu "${RPG:-4}" --no-cache --no-progress ${EXTRA:-} --output-dir "/root/work/spy-run$tag" \
      > "$out/spy-run$tag.log" 2>&1
    echo "exit $?" >> "$out/spy-run$tag.log"; tail -3 "$out/spy-run$tag.log"
    cp "/root/work/spy-run$tag/summary.json" "$out/spy-run$tag-summary.json" 2>/dev/null
    gzip -c "/root/work/spy-run$tag.txt" > "$out/spy-run$tag.txt.gz" ;;
  kernels)
    timeout -k 10 "${LIMIT:-400}" python3 scripts/gpu_kernel_profile.py --model "$models/bert-base" --dtype float16 \
      --n-texts "${N_KERNEL:-20000}" --out "$out/kernels$tag.json" --configs ${CONFIGS:-'{}'} > "$out/kernels$tag.log" 2>&1
    echo "exit $?" >> "$out/kernels$tag.log"; grep -vE "INFO|it/s\]" "$out/kernels$tag.log" | tail -60 ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
