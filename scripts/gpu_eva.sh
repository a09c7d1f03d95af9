#!/usr/bin/env bash
# kaiko-eva's PatchCamelyon on one GPU, three vLLM paths side by side in one lease (scripts/eva_vlm_bench.py): ours
# (`vllm-eval generate --tasks eva.PatchCamelyon`), eva's VllmModel calls (one llm.generate per batch of 256) and
# lmms-eval's VLLM model, on a Qwen2.5-VL-7B-shaped model with random weights (vllm_eval.testing.build_random_qwen2_5_vl,
# SmolLM2's tokenizer) and 1,000 PatchCamelyon-shaped images (vllm_eval.testing.build_patch_camelyon, 250 per class
# and split: eva's balanced sampler at --n-runs 1). MAX_NEW_TOKENS (default 16) bounds every side's answers: a random
# model never stops by itself.
# Staging (on this machine, before the first call):
#   VLLM_VERSION=0.33.0 bash ../shared/device/stage-vllm.sh --with-project-deps kaiko-eva==0.4.5 jsonargparse \
#     docstring-parser litellm==1.110.2 backoff fastuuid python-dotenv pydantic-settings importlib-metadata tenacity \
#     pyzipper pycryptodomex boto3 botocore jmespath s3transfer omegaconf==2.4.0 lmms-eval==0.7.3 evaluate==0.4.6 \
#     nibabel cryptography cffi pycparser lm-eval==0.4.13 pytablewriter DataProperty mbstrdecoder pathvalidate \
#     tabledata tcolorpy typepy chardet rouge-score nltk lazy-importer h2 hpack hyperframe pytz
#   (the last five were missing on 2026-12-07: eva.language imports lazy_importer and httpx's http2, lmms_eval pytz)
#   bash scripts/gpu_eva.sh - stage     (.deveva: SmolLM2's tokenizer and wheels with no binary on the index)
# then re-split the parts under 52 MB as scripts/gpu_lm_eval.sh's header says, carry each to /root/parts/, and carry
# .deveva once (mv .deveva /root/eva). Each later call carries .devstage/bin:
#   source .devstage/bin/on-device.sh && bash scripts/gpu_eva.sh $OUT PART
# PART:
#   setup   installs /root/eva's wheels; compiles /root/site (as pip does at install); fills vLLM's model-info
#           cache; builds the model in /root/models/Qwen2.5-VL-7B-random (bfloat16) and the
#           images in /root/data/patch_camelyon; $OUT/setup.txt.
#   ours    our side with ARGS (vllm-eval generate flags); $OUT/ours-$NAME.json and its log less the per-weight
#           lines, ours-$NAME.log (PROFILE=1: under py-spy, $OUT/prof-$NAME.txt).
#   eva     eva's calls (BS, default 256); $OUT/eva.json ($OUT/eva-$NAME.json with NAME).
#   (VLLM_BATCH_INVARIANT=1 before a part: vLLM's batch-invariant kernels, for answers that do not depend on how
#   requests were batched: the parity runs.)
#   lmms    lmms-eval's VLLM at BS (default 1), LIMIT requests (default all); $OUT/lmms-bs$BS.json.
#   (NUM: per class and split, eva's NUM_SAMPLES, on every side; default 250.)
#   compare A B: the answers of $OUT's A.json and B.json, sample by sample; $OUT/compare-A-B.json.
set -uo pipefail
out=${1:?output dir}; part=${2:?part}
export PYTHONPATH=${SRC:-$PWD/src}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-16} LITELLM_LOCAL_MODEL_COST_MAP=True
model=/root/models/Qwen2.5-VL-7B-random; data=/root/data; name=${NAME:-default}; bs=${BS:-}
bench=(python3 scripts/eva_vlm_bench.py)
quiet() { grep -v "^INFO\|^(EngineCore\|it/s\]$\|LiteLLM" | tail -${1:-30}; }
case "$part" in
  stage)
    py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python
    rm -rf .deveva && mkdir -p .deveva/wheels
    $py -c "from vllm_eval.testing.packaged import build_smollm2; build_smollm2('.deveva/smollm2-full')"
    mkdir -p .deveva/smollm2 && find .deveva/smollm2-full -maxdepth 1 -type f ! -name "*.safetensors" \
      ! -name config.json ! -name generation_config.json -exec cp {} .deveva/smollm2/ \;
    rm -rf .deveva/smollm2-full
    $py -m pip wheel -q --no-deps -w .deveva/wheels sqlitedict word2number
    $py -m pip download -q --no-deps -d .deveva/wheels py-spy==0.4.3   # the profile part
    gd=$(git rev-parse --git-dir); grep -qx '/.deveva/' "$gd/info/exclude" 2>/dev/null || echo '/.deveva/' >> "$gd/info/exclude"
    du -sh .deveva ;;
  setup)
    python3 -m pip install -q --no-index --no-deps --target /root/site /root/eva/wheels/*.whl 2>&1 | grep -vi warning
    # The staging installs with --no-compile; a user's pip compiles at install. Do that once, so no side's first
    # import pays for it (PYTHONDONTWRITEBYTECODE may be set, and then nothing is ever cached).
    start=$(date +%s); timeout 240 python3 -m compileall -q -j 16 /root/site > /dev/null 2>&1
    echo "rc $? compiled /root/site in $(( $(date +%s) - start )) s (PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-})" | tee "$out/setup.txt"
    start=$(date +%s)
    timeout 300 python3 -c "
from vllm_eval.testing import build_random_qwen2_5_vl
from vllm_eval.testing.eva_data import build_patch_camelyon
build_patch_camelyon('$data/patch_camelyon', per_class=250)
build_random_qwen2_5_vl('$model', '/root/eva/smollm2')"
    echo "rc $? built the model and images in $(( $(date +%s) - start )) s" | tee -a "$out/setup.txt"
    # vLLM inspects a model class once per machine in a subprocess and keeps the answer (its model-info cache); a
    # user's second run finds it. Fill it here, so that neither side's timing holds it.
    start=$(date +%s); timeout 120 python3 -c "
from vllm.model_executor.models.registry import ModelRegistry, _try_inspect_model_cls
arch = 'Qwen2_5_VLForConditionalGeneration'; print(arch, _try_inspect_model_cls(arch, ModelRegistry.models[arch]) is not None)" 2>&1 | tail -1
    echo "rc $? vLLM's model-info cache filled in $(( $(date +%s) - start )) s" | tee -a "$out/setup.txt"
    timeout 120 python3 -c "
from transformers import AutoProcessor; p = AutoProcessor.from_pretrained('$model'); print(type(p).__name__)
import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)
" 2>&1 | tail -3 | tee -a "$out/setup.txt"
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >> "$out/setup.txt" ;;
  ours)
    # PROFILE=1: under py-spy (every process, 20 Hz), $OUT/prof-$NAME.txt (collapsed stacks).
    [ -n "${PROFILE:-}" ] && bench=(/root/site/bin/py-spy record --subprocesses -r 20 --format raw -o "$out/prof-$name.txt" -- "${bench[@]}")
    timeout ${TIME:-560} "${bench[@]}" ours --model "$model" --data-root "$data" --out "$out/ours-$name.json" \
      ${NUM:+--num-samples $NUM} -- ${ARGS:-} 2>&1 | quiet 40 ;;
  eva)
    timeout ${TIME:-560} "${bench[@]}" eva --model "$model" --data-root "$data" --out "$out/eva${NAME:+-$NAME}.json" \
      --batch-size ${bs:-256} ${NUM:+--num-samples $NUM} 2>&1 | quiet ;;
  lmms)
    timeout ${TIME:-560} "${bench[@]}" lmms --model "$model" --data-root "$data" --out "$out/lmms-bs${bs:-1}.json" \
      --batch-size ${bs:-1} ${LIMIT:+--limit $LIMIT} ${NUM:+--num-samples $NUM} 2>&1 | quiet ;;
  compare)
    a=${3:?first side}; b=${4:?second side}
    "${bench[@]}" compare --out "$out/$a.json" --other "$out/$b.json" | tee "$out/compare-$a-$b.json" ;;
  *) echo "PART: stage, setup, ours, eva, lmms or compare" >&2; exit 2 ;;
esac
