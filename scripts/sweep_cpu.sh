#!/usr/bin/env bash
# A sweep against one run per checkpoint, on this machine's CPU (the GPU version: scripts/gpu_scale.sh sweep).
# $N (default 4) checkpoints are copies of the packaged all-MiniLM-L6-v2 with seeded noise (sd 1e-3) on every weight,
# in a training folder ($WORK/training/checkpoint-100, -200 ...). Each `vllm-eval run` of one checkpoint on the
# offline suite is timed from command to exit, then one `vllm-eval run --model $WORK/training` (the sweep); every
# score of the sweep is compared with the separate runs' (bit for bit). Run from the project root:
#   bash scripts/sweep_cpu.sh [WORK]        (default WORK=/tmp/vllm-eval-sweep; results in WORK/sweep-cpu.txt)
set -uo pipefail
work=${1:-/tmp/vllm-eval-sweep}; n=${N:-4}; py=${PY:-.venv/bin/python}
rm -rf "$work"; mkdir -p "$work/training"
secs() { python3 -c "print(round($(date +%s.%N) - $1, 1))"; }
"$py" - "$work/training" "$n" <<'PY'
import shutil, sys
from pathlib import Path
import numpy as np
from safetensors.numpy import load_file, save_file
from vllm_eval.utils.modelinfo import packaged_model_path
root, n = Path(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    dest = root / f"checkpoint-{100 * (i + 1)}"
    shutil.copytree(packaged_model_path(), dest)
    tensors = load_file(str(dest / "model.safetensors"))
    rng = np.random.default_rng(i)
    for name, value in tensors.items():
        if value.dtype == np.float32:
            tensors[name] = (value + rng.normal(0, 1e-3, value.shape)).astype(np.float32)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
PY
report=$work/sweep-cpu.txt; : > "$report"
all=$(date +%s.%N)
for ((i=1; i<=n; i++)); do
  start=$(date +%s.%N)
  "$py" -m vllm_eval.cli run --model "$work/training/checkpoint-$((100 * i))" --no-cache --no-progress \
    --output-dir "$work/separate/checkpoint-$((100 * i))" > "$work/separate-$i.txt" 2>&1
  echo "separate run $i: exit $?, $(secs "$start") s" | tee -a "$report"
done
echo "separate runs, all $n: $(secs "$all") s" | tee -a "$report"
start=$(date +%s.%N)
"$py" -m vllm_eval.cli run --model "$work/training" --no-cache --no-progress --output-dir "$work/sweep" > "$work/sweep.txt" 2>&1
echo "sweep of $n: exit $?, $(secs "$start") s" | tee -a "$report"
grep -E "seconds per model" "$work/sweep.txt" | tee -a "$report"
"$py" - "$work" "$n" <<'PY' | tee -a "$report"
import json, sys
from pathlib import Path
work, n = Path(sys.argv[1]), int(sys.argv[2])
swept = json.loads((work / "sweep" / "sweep.json").read_text())["scores"]
same = diff = 0
for i in range(1, n + 1):
    label = f"checkpoint-{100 * i}"
    alone = json.loads((work / "separate" / label / "summary.json").read_text())["scores"]
    for row in alone:
        equal = swept[label].get(row["task"]) == row["main_score"]
        same, diff = same + equal, diff + (not equal)
print(f"scores equal to the separate runs': {same}, different: {diff}")
PY
