#!/bin/bash
# Compare variants of the Shapes ViT recipe on a GPU machine: one data pool drawn once, the variants trained
# side by side on it (they share the GPU, so their timings are not the recipe's), then quick figures of each.
#
#   VARIANTS="A:--drloc-weight 0.2;B:--drloc-weight 0.3" OUT=/tmp/sweep bash tools/teaching/teaching_sweep.sh
#
# Each variant is "name:extra train flags"; all start from the shipped recipe (TrainConfig's defaults).
# Run from the repository root (the tools are modules of it: python -m tools.teaching...).
# This is how the DRLoc weights in tools/teaching/train.py were compared (three at a time on one H100).
set -u
OUT=${OUT:-/tmp/sweep}; mkdir -p "$OUT"
POOL=${POOL:-/tmp/shapes_pool.npz}
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" || exit 3
python -c "
import time
from tools.teaching.train import TrainConfig, make_train_set
t = time.time(); make_train_set(TrainConfig(gen_workers=16, data_cache='$POOL')); print('pool', round(time.time() - t, 1), 's', flush=True)
" || exit 4
run() {  # name, extra flags
  python -m tools.teaching.train --out "$OUT/$1" --device cuda --precision bf16 --data-cache "$POOL" --log-every 500 "${@:2}" \
    > "$OUT/$1.log" 2>&1 && python -m tools.teaching.teaching_quick_eval "$OUT/$1" --threads 5 >> "$OUT/$1.log" 2>&1
  tail -2 "$OUT/$1.log"
}
IFS=';' read -ra LIST <<< "${VARIANTS:?VARIANTS=\"name:flags;name:flags\"}"
for v in "${LIST[@]}"; do
  run "${v%%:*}" ${v#*:} &
done
wait
