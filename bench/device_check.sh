#!/usr/bin/env bash
# The device checks of one GPU session, as one short script (docs/benchmarks.md, "Ranking
# on a GPU"): the CUDA tests, then bench/search.py's measured greedy walk ranked by ORT
# (the "today" and the planner's evaluator) and by torch on CUDA, in one process
# per size, the chosen plan confirmed in ORT. Every figure goes to $OUT with the card's name.
#
# Here, first:  python bench/device_model.py minilm-l6 .devcarry   (a 47 MiB trimmed model;
#               .devcarry is in .git/info/exclude and travels as the device tool's `carry`)
# There:        bash bench/device_check.sh            (MODEL, SIZES, PLANS, TORCH_DEVICE to vary)
set -uo pipefail
OUT=${OUT:-/tmp/qs-out}
MODEL=${MODEL:-minilm-l6}
SIZES=${SIZES:-"64 256"}
PLANS=${PLANS:-16}
TORCH_DEVICE=${TORCH_DEVICE:-cuda}
PY=${PY:-python3}
export PYTHONPATH=src PYTHONUNBUFFERED=1 QUANTSCOPE_CACHE=${QUANTSCOPE_CACHE:-/tmp/qs-cache}
mkdir -p "$OUT" "$QUANTSCOPE_CACHE"
if [ -f ".devcarry/$MODEL.v1.onnx.gz" ] && [ ! -f "$QUANTSCOPE_CACHE/$MODEL.v1.onnx" ]; then
  gunzip -c ".devcarry/$MODEL.v1.onnx.gz" > "$QUANTSCOPE_CACHE/$MODEL.v1.onnx"
fi
{ nvidia-smi -L 2>&1; "$PY" -c "import torch, onnxruntime as o; print('torch', torch.__version__,
  'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available()
  else '-', '| onnxruntime', o.__version__)"; nproc; } | tee "$OUT/machine.txt"
if [ "$TORCH_DEVICE" = cuda ]; then
  timeout 150 "$PY" -m pytest -q -p no:cacheprovider -k cuda tests/test_rank_engine.py \
    tests/test_finetune.py 2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"
fi
for n in $SIZES; do
  timeout $(( n > 100 ? 250 : 150 )) "$PY" bench/search.py --model "$MODEL" --pairs "$n" --seq-len 128 --plans "$PLANS" \
    --variants today,incremental+cheap,torch --torch-device "$TORCH_DEVICE" --no-outputs-only \
    --json "$OUT/search_${MODEL}_${n}.json" 2>&1 | grep -v "^\[" | tee "$OUT/search_${MODEL}_${n}.txt"
done
