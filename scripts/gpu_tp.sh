#!/usr/bin/env bash
# Tensor-parallel generation on two GPUs: greedy outputs with --tensor-parallel-size 2 against 1, on a
# Qwen3-0.6B-shaped random LM (float32, eager), run on the lent 2-GPU machine after vLLM is staged:
#   source .devstage/bin/on-device.sh && bash scripts/gpu_tp.sh $OUT [LIMIT]
set -euo pipefail
out=${1:?output dir}; limit=${2:-200}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
models=${MODELS_DIR:-/root/models}
python3 - <<PY
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from vllm_eval.testing import tiny_tokenizer
tok = tiny_tokenizer()
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                  tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                  pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None, torch_dtype="float32")
Qwen3ForCausalLM(cfg).save_pretrained("$models/qwen3-0.6b-lm-fp32", safe_serialization=True)
tok.save_pretrained("$models/qwen3-0.6b-lm-fp32")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for tp in 1 2; do
  start=$(date +%s)
  python3 -m vllm_eval.cli generate --model "$models/qwen3-0.6b-lm-fp32" --tasks PangLeePolarity --limit "$limit" \
    --max-tokens 32 --dtype float32 --enforce-eager --tensor-parallel-size $tp --max-missing 1 \
    --output-dir "$out/tp$tp" --no-progress --no-cache 2>&1 | grep -v "it/s\]\|^$" | tail -3
  echo "tp=$tp wall $(( $(date +%s) - start )) s" | tee -a "$out/tp.txt"
done
python3 - <<PY | tee -a "$out/tp.txt"
import json
a = [json.loads(l) for l in open("$out/tp1/samples.jsonl")]
b = [json.loads(l) for l in open("$out/tp2/samples.jsonl")]
same = sum(x["output"] == y["output"] for x, y in zip(a, b))
print(f"greedy outputs identical with --tensor-parallel-size 2 and 1: {same} of {len(a)}")
diff = [(x["id"], x["output"][:80], y["output"][:80]) for x, y in zip(a, b) if x["output"] != y["output"]][:3]
print("first differences:", diff)
PY
