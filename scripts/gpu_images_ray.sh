#!/usr/bin/env bash
# Image throughput, Ray overhead and the VLM log-likelihood engine on the lent GPU. After staging vLLM with
#   bash ../shared/device/stage-vllm.sh --with-project-deps sentence-transformers ray==2.60.0 msgpack py-spy click
# on the device:  source .devstage/bin/on-device.sh && bash scripts/gpu_images_ray.sh $OUT PART
# PART: clip | clip-profile | ray | vlm-loglik | vlm-pool | bert-profile | pipeline.
#   clip: scripts/clip_bench.py (CLIP ViT-B/32 shape, random weights): vLLM one engine, $RPG (default 2) replicas
#         on the GPU, sentence-transformers ($BACKENDS picks); $N images and $N texts (default 20000).
#   clip-render: vLLM's image front end alone (scripts/clip_render_bench.py: render_cmpl serially and from 2-8
#         threads, the HF processor on batches of 256), then scripts/clip_bench.py once per spec of $SPECS
#         ("BACKEND:REPLICAS:ENGINE_JSON" separated by ";", e.g. vllm-replicas:4:{"renderer_num_workers":4,
#         "mm_processor_cache_gb":0}), $N images, 1000 texts, each under $STEP_LIMIT s (default 150); with
#         $SPY=1 the last spec runs under py-spy (raw stacks, every process). $OUT/clip-render/.
#   ray: scripts/ray_overhead.py on a one-node Ray cluster of this machine (its GPUs), BERT-base shape (tokenizer
#        in .devtok/bert), $N_TEXTS (default 200000) mixed 16-500 tokens; --per-gpu when the machine has one GPU.
#   vlm-loglik: scripts/gpu_vlm.sh's log-likelihood engine alone (tiny Qwen2-VL) with vLLM's INFO log, and a
#        py-spy dump of every Python process after $DUMP_AFTER s (default 100) if it has not finished.
#   vlm-pool: scripts/vlm_pooling_bench.py: a tiny Qwen2-VL as embedder and reranker against transformers, then
#        `vllm-eval run` on the three digit image tasks with the VLM2Vec prompts (timed), then images/s of a
#        Qwen2-VL-2B-shaped random embedder against transformers ($N_IMAGES, default 5000).
#   bert-profile: py-spy (raw stacks, every process) over one engine of a BERT-base shape embedding $N_TEXTS
#        (default 30000) texts of fixed 130 tokens, where one engine was slower than sentence-transformers.
#   pipeline: one engine of that BERT-base shape, synchronous (VLLMEVAL_PIPELINE=0) against pipelined chunks,
#        alternated, fixed 130 and mixed 16-500 tokens ($N_TEXTS, default 30000), sentence-transformers in the
#        first run; each run's bench.json and log under $OUT/pipeline/.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
models=${MODELS_DIR:-/root/models}
mkdir -p "$out/$part"
case $part in
  clip)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/clip/gpu.txt"
    timeout -k 10 "${LIMIT:-520}" python3 scripts/clip_bench.py --n-images "${N:-20000}" --n-texts "${N:-20000}" \
      --replicas-per-gpu "${RPG:-2}" --backends ${BACKENDS:-vllm vllm-replicas st} --model-dir "$models/clip-vit-b-32" \
      --out "$out/clip" 2>&1 \
      | grep -v "it/s\]" > "$out/clip/log.txt"
    echo "exit ${PIPESTATUS[0]}" >> "$out/clip/log.txt"
    grep -E "^(vllm|st)" "$out/clip/log.txt" > "$out/clip/result.txt" ;;
  clip-render)
    spy=$(command -v py-spy || echo /root/spy/bin/py-spy)
    [ -x "$spy" ] || python3 -m pip install -q --no-index --no-deps --target /root/spy .devextra/py_spy*.whl 2>&1 | grep -vi warning
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/clip-render/gpu.txt"
    python3 -c "from vllm_eval.testing import build_tiny_clip as b; b('$models/clip-vit-b-32', shape='vit-b-32')" > /dev/null 2>&1
    timeout -k 10 "${STEP_LIMIT:-150}" python3 scripts/clip_render_bench.py --n-images "${N_RENDER:-2000}" \
      --model-dir "$models/clip-vit-b-32" --out "$out/clip-render" > "$out/clip-render/render.log" 2>&1
    grep -E "^(image|render|HF)" "$out/clip-render/render.log" | tee "$out/clip-render/result.txt"
    IFS=';' read -ra specs <<< "${SPECS:-st:1:}"; last=$((${#specs[@]} - 1))
    for i in "${!specs[@]}"; do
      IFS=':' read -r b rpg ek <<< "${specs[$i]}"; ek=${ek:-\{\}}; tag="$i-$b-$rpg"
      run=(python3 scripts/clip_bench.py --n-images "${N:-10000}" --n-texts 1000 --backends "$b" --replicas-per-gpu "$rpg"
           --engine-kwargs "$ek" --model-dir "$models/clip-vit-b-32" --out "$out/clip-render")
      rm -f "$out/clip-render/clip_bench.json"
      if [ "${SPY:-0}" = 1 ] && [ "$i" = "$last" ]; then
        run=("$spy" record -r 50 -f raw --subprocesses -o "$out/clip-render/spy-$tag.txt" -- "${run[@]}")
      fi
      timeout -s INT -k 10 "${STEP_LIMIT:-150}" "${run[@]}" > "$out/clip-render/$tag.log" 2>&1
      echo "[$tag engine $ek] exit $?: $(grep -E "^(vllm|st)" "$out/clip-render/$tag.log" | tr -s ' ' | tr '\n' '|')" \
        | tee -a "$out/clip-render/result.txt"
      cp "$out/clip-render/clip_bench.json" "$out/clip-render/$tag.json" 2>/dev/null
    done
    gzip "$out"/clip-render/spy-*.txt 2>/dev/null; true ;;
  clip-profile)  # where the vLLM image path spends its time: py-spy (raw stacks, every process) over clip_bench
    spy=$(command -v py-spy || echo /root/site/bin/py-spy)
    for b in vllm vllm-replicas; do
      timeout -k 10 "${LIMIT:-240}" "$spy" record -r 100 -f raw --subprocesses -o "$out/clip-profile/$b.txt" -- \
        python3 scripts/clip_bench.py --n-images "${N:-5000}" --n-texts 500 --backends $b --replicas-per-gpu "${RPG:-2}" \
        --model-dir "$models/clip-vit-b-32" --out "$out/clip-profile" > "$out/clip-profile/$b.log" 2>&1
      grep -E "^(vllm|st)" "$out/clip-profile/$b.log"
    done
    gzip "$out"/clip-profile/*.txt ;;
  ray)
    python3 -c "
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model('$models/bert-base', 'bert-base', '.devtok/bert', dtype='float16')" > /dev/null 2>&1
    gpus=$(nvidia-smi -L | wc -l); perg=(); [ "$gpus" = 1 ] && perg=(--per-gpu)
    ray_cli() { python3 -c "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()" "$@"; }
    ray_cli start --head --node-ip-address 127.0.0.1 --port 6390 --num-gpus "$gpus" --include-dashboard=false \
      --disable-usage-stats > "$out/ray/ray-start.txt" 2>&1
    timeout -k 10 "${LIMIT:-480}" python3 scripts/ray_overhead.py --address 127.0.0.1:6390 --replicas "${REPLICAS:-2}" \
      "${perg[@]}" --model "$models/bert-base" --dtype float16 --n-texts "${N_TEXTS:-200000}" --lengths mixed:16-500 \
      --rounds "${ROUNDS:-1}" 2>&1 | grep -v "it/s\]" > "$out/ray/log.txt"
    echo "exit ${PIPESTATUS[0]}" >> "$out/ray/log.txt"
    ray_cli stop --force > /dev/null 2>&1
    grep -E "^(local|Ray)" "$out/ray/log.txt" > "$out/ray/result.txt" ;;
  vlm-loglik)
    model=$models/tiny-qwen2-vl
    python3 -c "from vllm_eval.testing import build_tiny_qwen2_vl; build_tiny_qwen2_vl('$model')" > /dev/null 2>&1
    (sleep "${DUMP_AFTER:-100}"; for p in $(pgrep -f "python3"); do
       echo "== $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-150)"; "$(command -v py-spy || echo /root/site/bin/py-spy)" dump --pid "$p" 2>&1 | head -60
     done > "$out/vlm-loglik/py-spy.txt") &
    dumper=$!
    VLLM_LOGGING_LEVEL=INFO timeout -k 10 "${LIMIT:-240}" python3 -m vllm_eval.cli generate --model "$model" \
      --tasks Digits --limit 40 --scoring loglikelihood --dtype float32 --enforce-eager \
      --output-dir "$out/vlm-loglik/digits" --no-progress --no-cache > "$out/vlm-loglik/log.txt" 2>&1
    echo "exit $?" >> "$out/vlm-loglik/log.txt"
    kill "$dumper" 2>/dev/null ;;
  vlm-pool)
    o=$out/vlm-pool
    timeout -k 10 "${LIMIT:-200}" python3 scripts/vlm_pooling_bench.py --model-dir "$models/q2vl" --shape tiny \
      --steps parity rerank --out "$o" > "$o/parity.log" 2>&1; echo "exit $?" >> "$o/parity.log"
    start=$(date +%s%N)
    timeout -k 10 "${LIMIT:-200}" python3 -m vllm_eval.cli run --model "$models/q2vl" --preset vlm2vec-qwen2vl \
      --tasks DigitsZeroShot DigitsImageClassification DigitsTextToImageRetrieval --dtype float32 \
      --output-dir "$o/run" --no-progress --no-cache > "$o/run.log" 2>&1; rc=$?
    echo "exit $rc wall $(( ($(date +%s%N) - start) / 1000000 )) ms" >> "$o/run.log"
    timeout -k 10 "${LIMIT2:-300}" python3 scripts/vlm_pooling_bench.py --model-dir "$models/q2vl-2b" \
      --shape qwen2-vl-2b --steps throughput --n-images "${N_IMAGES:-5000}" --out "$o" > "$o/throughput.log" 2>&1
    echo "exit $?" >> "$o/throughput.log"
    grep -hE "^(parity|rerank|vllm|hf|model)|exit" "$o"/*.log ;;
  bert-profile)
    python3 -c "
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model('$models/bert-base', 'bert-base', '.devtok/bert', dtype='float16')" > /dev/null 2>&1
    spy=$(command -v py-spy || echo /root/site/bin/py-spy)
    # SIGINT at the limit: py-spy writes what it sampled (killed, it writes nothing).
    timeout -s INT -k 30 "${LIMIT:-240}" "$spy" record -r 50 -f raw --subprocesses -o "$out/bert-profile/one-engine.txt" -- \
      python3 -m vllm_eval.cli bench --model "$models/bert-base" --backends vllm --dtype float16 \
      --n-texts "${N_TEXTS:-30000}" --lengths fixed:130 --batch-sizes 1024 > "$out/bert-profile/log.txt" 2>&1
    echo "exit $?" >> "$out/bert-profile/log.txt"
    gzip "$out/bert-profile/one-engine.txt"
    grep -E "tok/s|exit" "$out/bert-profile/log.txt" ;;
  pipeline)
    python3 -c "
from vllm_eval.testing import build_random_embedding_model
build_random_embedding_model('$models/bert-base', 'bert-base', '.devtok/bert', dtype='float16')" > /dev/null 2>&1
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/pipeline/gpu.txt"
    i=0
    for mode in "1 st" 0 1 0 1; do
      set -- $mode; i=$((i+1)); run="$out/pipeline/run$i-pipeline$1"
      VLLMEVAL_PIPELINE=$1 timeout -k 10 "${LIMIT:-150}" python3 -m vllm_eval.cli bench --model "$models/bert-base" \
        --backends vllm ${2:-} --dtype float16 --n-texts "${N_TEXTS:-30000}" --lengths fixed:130 mixed:16-500 \
        --batch-sizes 1024 --output-dir "$run" > "$run.log" 2>&1
      echo "run$i VLLMEVAL_PIPELINE=$1 exit $?" | tee -a "$out/pipeline/summary.txt"
      grep -E "tok/s" "$run.log" | tee -a "$out/pipeline/summary.txt"
    done ;;
esac
