#!/usr/bin/env bash
# Big models on the lent GPU: a random-weight model of Qwen3-Embedding-8B's shape (7.57 B parameters, bf16, drawn
# on the GPU) with the packaged MiniLM WordPiece tokenizer (realistic token counts; .devtok/bert), measured by
# `vllm-eval bench` on fixed 512-token and mixed 16-2000-token texts. After staging vLLM (scripts/gpu_bench.sh):
#   source .devstage/bin/on-device.sh && bash scripts/gpu_bigmodel.sh $OUT PART
# PART: model8b | bench8b | reranker8b | rerank8b | rerank2s8b | load8b | start8b | vlm2b | profile8b | release8b.
# bench8b: $BACKENDS (default vllm), $LENGTHS (default "fixed:512 mixed:16-2000"), $QUANT (e.g. fp8: --quantization),
# $TAG a suffix, $N_TEXTS (default 2000), $LIMIT seconds (default 300), $EXTRA more flags. Writes $OUT/bench8b$TAG.{txt,json}.
# reranker8b: a random Qwen3-Reranker-8B shape (Qwen3ForCausalLM with its untied lm_head, 8.19 B parameters, bf16,
# same tokenizer) into $MODELS_DIR/qwen3-reranker-8b. rerank8b: scripts/rerank_bench.py on it, $QUERIES (default 20)
# queries x 100 documents of 50-400 tokens: vLLM with prefix caching on and off, then sentence-transformers'
# CrossEncoder (the reference), each in its own process under $STEP_LIMIT seconds (default 240), all under $LIMIT
# (default 570); $BACKENDS (default "vllm st"), $TAG. Writes $OUT/rerank8b$TAG.{txt,json,log}.
# load8b: the engine's start with each of $FORMATS (vLLM's --load-format; default "safetensors fastsafetensors
# runai_streamer safetensors"), a short bench each, the page cache dropped before each where the machine lets us
# (said in the output); $OUT/load8b.txt. The extra loaders' wheels: .devextra (carried), installed here.
# start8b: where an 8B engine's start goes: one fresh `bench` process (64 texts of 512 tokens) per configuration of
# $CONFIGS (default "mp mp inproc inproc-dropped inproc-nographs inproc-eager": mp = vLLM's engine-core process
# (VLLM_ENABLE_V1_MULTIPROCESSING=1), inproc = =0, default = neither set (ours decides), dropped = page cache dropped
# first, nographs = no CUDA graphs, eager = neither torch.compile nor graphs); vLLM's INFO timings of each into $OUT/start8b.txt, whole logs in $OUT/start8b-*.log.
# vlm2b: a random Qwen2-VL-2B shape (bf16, built on the GPU) with VLM2Vec's prompts on the three digit image tasks,
# `vllm-eval run` ours then --backend hf, each timed from command to exit; $OUT/vlm2b.txt and each run's files.
# profile8b: scripts/gpu_kernel_profile.py on the 8B (built by model8b): one in-process engine per configuration of
# $CONFIGS (JSON engine options, default fp8 then bf16, prefix caching off), each in its own process, $N_TEXTS (default
# 1000) texts of fixed 512 tokens in one chunk; GPU kernel time by class (matrix products, attention, fp8 quantisation,
# the rest). $OUT/profile8b-K.{json,log}, profile8b.txt. release8b: scripts/engine_release_check.py on the 8B.
# rerank2s8b: `vllm-eval rerank` on $TASKS (default "ArguAna SCIDOCS") of the MTEB(eng, v2) replica at $FRACTION (default
# 0.02): bm25s, then $RERANKER (default qwen3-reranker-8b, from reranker8b) on each query's top $TOP_K (default 100), for
# each of $BACKENDS (default "vllm st"), each under $STEP_LIMIT seconds (default 280); $OUT/rerank2s8b$TAG.txt and logs.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
models=${MODELS_DIR:-/root/models}
case $part in
  model8b)
    start=$(date +%s.%N)
    python3 -c "from vllm_eval.testing import build_random_embedding_model as b; \
b('$models/qwen3-8b', 'qwen3-8b', '.devtok/bert', dtype='bfloat16')" 2>&1 | grep -v "it/s" | tail -3
    echo "built in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s; $(du -sh $models/qwen3-8b)" | tee "$out/model8b.txt" ;;
  bench8b)
    name=bench8b${TAG:-}; work=/root/work/$name; rm -rf "$work"
    timeout -k 10 "${LIMIT:-300}" python3 -m vllm_eval.cli bench --model "$models/qwen3-8b" --dtypes bfloat16 \
      --backends ${BACKENDS:-vllm} --lengths ${LENGTHS:-fixed:512 mixed:16-2000} --n-texts "${N_TEXTS:-2000}" --batch-sizes "${N_TEXTS:-2000}" \
      --max-model-len 8192 ${QUANT:+--quantization $QUANT} ${EXTRA:-} --output-dir "$work" > "$out/$name.log" 2>&1
    echo "exit $?" >> "$out/$name.log"
    tr '\r' '\n' < "$out/$name.log" | grep -v "it/s\]" | grep -E "│|┃|━|tok/s|exit|rror|ready" > "$out/$name.txt"
    cp "$work/bench.json" "$out/$name.json" 2>/dev/null; cat "$out/$name.txt" ;;
  profile8b)  # one process per configuration: an in-process engine's device memory is not all back after release
    if [ -n "${CONFIGS:-}" ]; then eval "configs=($CONFIGS)"; else
      configs=('{"quantization": "fp8", "max_model_len": 8192, "enable_prefix_caching": false}'
               '{"max_model_len": 8192, "enable_prefix_caching": false}'); fi
    for i in "${!configs[@]}"; do
      timeout -k 10 "${LIMIT:-200}" python3 scripts/gpu_kernel_profile.py --model "$models/qwen3-8b" --dtype bfloat16 \
        --n-texts "${N_TEXTS:-1000}" --chunk "${N_TEXTS:-1000}" --lengths fixed:512 --top 12 --out "$out/profile8b-$i.json" \
        --configs "${configs[$i]}" > "$out/profile8b-$i.log" 2>&1
      echo "exit $?" >> "$out/profile8b-$i.log"
      python3 -c "
import json
for r in json.load(open('$out/profile8b-$i.json')):
    print(r['engine_options'], 'tok/s', r['tokens_per_s'], 'busy', r['busy_fraction_of_profiled_wall'],
          'tok/busy-s', r['tokens_per_gpu_busy_s'], 'tok/gemm-s', r['tokens_per_gemm_s'], r['kernel_s_by_class'])
" | tee -a "$out/profile8b.txt"
    done ;;
  release8b)  # scripts/engine_release_check.py on the 8B: its device memory after release, then a second engine
    timeout -k 10 "${LIMIT:-200}" python3 scripts/engine_release_check.py --model "$models/qwen3-8b" --dtype bfloat16 \
      --engine-kwargs '{"max_model_len": 8192}' > "$out/release8b.log" 2>&1
    echo "exit $?" >> "$out/release8b.log"
    grep -E "alive|ready|failed|exit" "$out/release8b.log" | tee "$out/release8b.txt" ;;
  load8b)
    [ -d .devextra ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .devextra/*.whl 2>&1 | grep -vi warning
    for fmt in ${FORMATS:-safetensors fastsafetensors runai_streamer safetensors}; do
      sync; dropped=no; (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null && dropped=yes
      log="$out/load8b-$fmt.log"; start=$(date +%s.%N)
      timeout -k 10 "${LIMIT:-150}" python3 -m vllm_eval.cli bench --model "$models/qwen3-8b" --dtypes bfloat16 \
        --backends vllm --lengths fixed:512 --n-texts 64 --batch-sizes 64 --max-model-len 8192 --load-format "$fmt" ${EXTRA:-} \
        --output-dir "/root/work/load8b-$fmt" > "$log" 2>&1
      rc=$?
      echo "$fmt: exit $rc, page cache dropped: $dropped, wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s, $(tr '\r' '\n' < "$log" | grep -o "ready in [0-9.]* s" | head -1)" | tee -a "$out/load8b.txt"
      [ $rc = 0 ] || tr '\r' '\n' < "$log" | grep -E "rror" | tail -3 | tee -a "$out/load8b.txt"
    done ;;
  reranker8b)
    start=$(date +%s.%N)
    timeout -k 10 "${LIMIT:-480}" python3 -c "from vllm_eval.testing import build_random_reranker_model as b; \
b('$models/qwen3-reranker-8b', 'qwen3-8b', '.devtok/bert', dtype='bfloat16')" 2>&1 | grep -v "it/s" | tail -3
    echo "built in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s; $(du -sh $models/qwen3-reranker-8b)" \
      | tee "$out/reranker8b.txt" ;;
  rerank8b)
    name=rerank8b${TAG:-}
    timeout -k 10 "${LIMIT:-570}" python3 scripts/rerank_bench.py --model "$models/qwen3-reranker-8b" \
      --backends ${BACKENDS:-vllm st} --queries "${QUERIES:-20}" --docs-per-query 100 --doc-tokens 50-400 \
      --prefix-caching on off --max-model-len 2048 --dtype bfloat16 --worker-timeout "${STEP_LIMIT:-240}" \
      --json "$out/$name.json" > "$out/$name.log" 2>&1
    echo "exit $?" >> "$out/$name.log"
    tr '\r' '\n' < "$out/$name.log" | grep -E "^(backend|vllm|st|---|prefix caching|[0-9]+ queries|exit)|rror" \
      | grep -v "it/s" > "$out/$name.txt"
    cat "$out/$name.txt" ;;
  rerank2s8b)  # two stages on the replica's retrieval tasks: bm25s, then the 8B reranker (reranker8b) on each query's top
    # $TOP_K (default 100): ours, then sentence-transformers' CrossEncoder, each timed from command to exit
    rep=/root/work/replica-rerank; name=rerank2s8b${TAG:-}
    python3 -c "from vllm_eval.tasks.shaped import build_replica as b; b('$rep', 'MTEB(eng, v2)', '.devtok/bert', \
fraction=${FRACTION:-0.02}, tasks='${TASKS:-ArguAna SCIDOCS}'.split())" 2>&1 | tail -2
    for backend in ${BACKENDS:-vllm st}; do
      log="$out/$name-$backend.log"; start=$(date +%s.%N)
      timeout -k 10 "${STEP_LIMIT:-280}" python3 -m vllm_eval.cli -v rerank --data "$rep" --reranker "$models/${RERANKER:-qwen3-reranker-8b}" \
        --preset qwen3-reranker --backend "$backend" --top-k "${TOP_K:-100}" --dtype "${DTYPE:-bfloat16}" ${EXTRA:-} --no-cache \
        --no-progress --output-dir "/root/work/$name-$backend" > "$log" 2>&1
      rc=$?
      echo "== $backend: exit $rc, command to exit $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s" | tee -a "$out/$name.txt"
      tr '\r' '\n' < "$log" | grep -E "│|┃|rror|ready|starting a vLLM|Loading weights took|init engine|Model loading took" \
        | grep -v "it/s" | cut -c1-200 | tee -a "$out/$name.txt"
    done ;;
  start8b)
    for cfg in ${CONFIGS:-mp mp inproc inproc-dropped inproc-nographs inproc-eager}; do
      envs=(); extra=(); drop=no
      [[ $cfg == inproc* ]] && envs=(VLLM_ENABLE_V1_MULTIPROCESSING=0)
      [[ $cfg == mp* ]] && envs=(VLLM_ENABLE_V1_MULTIPROCESSING=1)
      [[ $cfg == *dropped* ]] && { sync; (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null && drop=yes || drop=refused; }
      [[ $cfg == *nographs* ]] && extra=(--compilation-config '{"cudagraph_mode": "NONE"}')
      [[ $cfg == *eager* ]] && extra=(--enforce-eager)
      n=$(ls "$out"/start8b-*.log 2>/dev/null | wc -l); log="$out/start8b-$n-$cfg.log"; start=$(date +%s.%N)
      env "${envs[@]}" timeout -k 10 "${LIMIT:-150}" python3 -m vllm_eval.cli -v bench --model "$models/qwen3-8b" \
        --dtypes bfloat16 --backends vllm --lengths fixed:512 --n-texts 64 --batch-sizes 64 --max-model-len 8192 \
        "${extra[@]}" --output-dir "/root/work/start8b-$n" > "$log" 2>&1
      rc=$?
      { echo "== $cfg: exit $rc, page cache dropped: $drop, wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s, $(tr '\r' '\n' < "$log" | grep -o "ready in [0-9.]* s" | head -1)"
        tr '\r' '\n' < "$log" | grep -E "starting a vLLM engine|Initializing a V1|Loading weights took|Model loading took|torch.compile|Dynamo bytecode|Compil|Graph capturing|init engine|KV cache|tok/s|rror" \
          | grep -v "it/s\]" | cut -c1-220 | sed 's/^/   /' | head -30; } | tee -a "$out/start8b.txt"
    done ;;
  vlm2b)
    model=$models/q2vl-2b; tasks=(DigitsZeroShot DigitsImageClassification DigitsTextToImageRetrieval)
    python3 -c "from vllm_eval.testing import build_tiny_qwen2_vl as b; b('$model', shape='qwen2-vl-2b')" 2>&1 | tail -2
    for backend in vllm hf; do
      start=$(date +%s.%N)
      timeout -k 10 "${LIMIT:-280}" python3 -m vllm_eval.cli run --model "$model" --preset vlm2vec-qwen2vl \
        --backend $backend --tasks "${tasks[@]}" --dtype bfloat16 --output-dir "$out/vlm2b-$backend" --no-progress \
        --no-cache > "$out/vlm2b-$backend.log" 2>&1
      rc=$?
      echo "$backend: exit $rc, command to exit $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s" | tee -a "$out/vlm2b.txt"
      python3 -c "
import json; s = json.load(open('$out/vlm2b-$backend/summary.json'))
print('  ', {r['task']: round(r['main_score'], 6) for r in s['scores']}, 'engine/model', s.get('engine_start_seconds'))" \
        2>&1 | tail -1 | tee -a "$out/vlm2b.txt"
    done ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
