#!/usr/bin/env bash
# Extra wheels for the weight loaders (fastsafetensors, runai-model-streamer and their deps typer, click,
# shellingham, humanize) go in .devextra/ (git-ignored), made here with `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 -d .devextra <names>`, carried and installed once with
# `python3 -m pip install -q --no-index --no-deps --target /root/site .devextra/*.whl`.
# Time to result on the lent GPU: engine start (compile settings, replicas starting together, weight
# loaders) and throughput, each configuration a fresh `vllm-eval bench` process. After staging vLLM
# (see scripts/gpu_bench.sh), on the device:
#   source .devstage/bin/on-device.sh && bash scripts/gpu_start.sh $OUT PART
# PART: models | bert | qwen | loaders | suite-synthetic | ceiling; RUNS="name ..." runs only those
# Each line of $OUT/<part>.txt: configuration, "ready in" seconds, tokens/s; vLLM's own start-up
# timings (weights, torch.compile, CUDA graphs, engine init) are kept in $OUT/<part>-logs.tgz.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
models=${MODELS_DIR:-/root/models}
logs=$(mktemp -d)
summary="$out/$part.txt"
run() {  # run NAME CMD...: a fresh process (at most $LIMIT s); its start-up and throughput lines to the summary
  local name=$1; shift
  if [ -n "${RUNS:-}" ] && [[ " $RUNS " != *" $name "* ]]; then return 0; fi
  local t0=$(date +%s)
  timeout -k 10 "${LIMIT:-240}" "$@" > "$logs/$name.log" 2>&1; local rc=$?
  local t1=$(date +%s)
  { echo "== $name (exit $rc, $((t1 - t0)) s wall): $*"
    tr '\r' '\n' < "$logs/$name.log" | grep -E "ready in|tok/s  |Loading weights took|Model loading took|torch.compile took|compile takes|Graph capturing finished|init engine|memory profiling|KV cache|rror|seconds|x st|suite\]|│" \
      | grep -v "it/s\]" | sed 's/^/   /' | head -40; } | tee -a "$summary"
}
case $part in
  models)
    python3 - <<PY
import torch
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model("$models/bert-base", "bert-base", ".devtok/bert", dtype="float16")
build_random_embedding_model("$models/qwen3-0.6b", "qwen3-0.6b", ".devtok/qwen", dtype="bfloat16")
with torch.device("cuda"):
    build_random_embedding_model("$models/qwen3-4b", "qwen3-4b", ".devtok/qwen", dtype="bfloat16")
PY
    du -sh $models/* | tee -a "$summary"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$summary" ;;
  bert)
    B="--model $models/bert-base --dtype float16 --backends vllm --lengths fixed:130 mixed:16-500 --batch-sizes 20000 --n-texts 20000"
    rm -rf /root/.cache/vllm/torch_compile_cache
    run bert-1-default-cold python3 -m vllm_eval.cli -v bench --output-dir $logs/b1 $B
    run bert-1-default-warm python3 -m vllm_eval.cli -v bench --output-dir $logs/b2 $B
    run bert-1-eager python3 -m vllm_eval.cli -v bench --output-dir $logs/b3 $B --enforce-eager
    run bert-1-default-inproc env VLLM_ENABLE_V1_MULTIPROCESSING=0 python3 -m vllm_eval.cli -v bench --output-dir $logs/b4 $B
    run bert-4-together-warm python3 -m vllm_eval.cli -v bench --output-dir $logs/b5 $B --replicas-per-gpu 4
    run bert-4-waves-eager python3 -m vllm_eval.cli -v bench --output-dir $logs/b6 $B --replicas-per-gpu 4 --enforce-eager --gpu-memory-utilization 0.225
    run bert-4-together-eager python3 -m vllm_eval.cli -v bench --output-dir $logs/b7 $B --replicas-per-gpu 4 --enforce-eager
    rm -rf /root/.cache/vllm/torch_compile_cache
    run bert-4-together-cold python3 -m vllm_eval.cli -v bench --output-dir $logs/b8 $B --replicas-per-gpu 4 ;;
  qwen)
    Q="--model $models/qwen3-0.6b --backends vllm --lengths fixed:130 --batch-sizes 20000 --n-texts 20000"
    run qwen-1-default python3 -m vllm_eval.cli -v bench --output-dir $logs/q1 $Q --dtype bfloat16
    run qwen-1-eager python3 -m vllm_eval.cli -v bench --output-dir $logs/q2 $Q --dtype bfloat16 --enforce-eager
    run qwen-4-together python3 -m vllm_eval.cli -v bench --output-dir $logs/q3 $Q --dtype bfloat16 --replicas-per-gpu 4
    run qwen-4-together-fp8 python3 -m vllm_eval.cli -v bench --output-dir $logs/q4 $Q --dtype bfloat16 --quantization fp8 --replicas-per-gpu 4 ;;
  loaders)
    for m in qwen3-0.6b qwen3-4b; do
      for f in auto fastsafetensors runai_streamer; do
        sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
        run "load-$m-$f" python3 -m vllm_eval.cli -v bench --output-dir $logs/"l-$m-$f" --model $models/$m --backends vllm --dtype bfloat16 --lengths fixed:130 \
          --batch-sizes 200 --n-texts 200 --enforce-eager --load-format $f
      done
    done ;;
  suite-synthetic)
    run suite-synthetic python3 -m vllm_eval.cli -v bench --suite synthetic --model $models/bert-base --dtype float16 \
      --n-docs ${N_DOCS:-200000} --replicas-per-gpu ${RPG:-4} --output-dir "$logs/suite-synthetic"
    cp "$logs/suite-synthetic/suite.json" "$out/suite-synthetic.json" ;;
  ceiling)
    B="--model $models/bert-base --dtype float16 --backends vllm --lengths mixed:16-500 fixed:130 --batch-sizes 20000 --n-texts 20000"
    nvidia-smi dmon -s u -d 1 > "$logs/dmon-r4.txt" 2>&1 & dm=$!
    run ceiling-r4 python3 -m vllm_eval.cli -v bench --output-dir $logs/c1 $B --replicas-per-gpu 4
    kill $dm
    nvidia-smi dmon -s u -d 1 > "$logs/dmon-r8.txt" 2>&1 & dm=$!
    run ceiling-r8 python3 -m vllm_eval.cli -v bench --output-dir $logs/c2 $B --replicas-per-gpu 8
    kill $dm
    for f in "$logs"/dmon-*.txt; do echo "$(basename $f): sm% while busy:" $(awk '$1 ~ /^[0-9]+$/ && $2 > 0 {print $2}' "$f" | sort -n | tail -40 | tr '\n' ' '); done | tee -a "$summary" ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
tar czf "$out/$part-logs.tgz" -C "$logs" . 2>/dev/null
