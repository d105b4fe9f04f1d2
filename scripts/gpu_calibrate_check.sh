#!/usr/bin/env bash
# GPU check of `primus-optuna calibrate` (issue 38), prepared for a session that is lent one H100/H200 (the
# device tool: check `status` first). On that machine, from the repository root:
#
#   bash scripts/gpu_calibrate_check.sh [BUDGET_S]        # default 300: calibrate + compare end in < 8 minutes
#
# It measures the GPU (GEMMs bf16 + FP8 over the default grid, grouped GEMMs, SDPA forward/backward at head
# widths 64 and 128, memory-bound kernels, the caching allocator's reserve on a 4096-wide layer; one GPU: no
# collectives), writes $OUT/gpu-profile.yaml (OUT: the device tool's folder, else /tmp) and prints the measured
# curves against the catalog's Hopper constants (scripts/compare_profile.py) into $OUT/compare.txt too.
#
# The device image has torch, click, PyYAML and tqdm but not pydantic: carry its wheels. Here, once:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
# then `run` with carry [".whl"] and command `bash scripts/gpu_calibrate_check.sh`, timeout_s 540.
set -euo pipefail
BUDGET="${1:-300}"
DEST="${OUT:-/tmp}"
export PYTHONUNBUFFERED=1
SITE=""
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  SITE="/tmp/site:"
fi
export PYTHONPATH="${SITE}${PWD}${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
python3 -c "import torch, pydantic, yaml, click; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'gpu', torch.cuda.get_device_name(0))"
start=$(date +%s)
# the calibration itself stops measuring at BUDGET; imports and the allocator's layer come on top
timeout $((BUDGET + 150)) python3 -c "from primus_optuna.cli import main; main()" calibrate --device cuda \
  --budget-s "$BUDGET" --out "$DEST/gpu-profile.yaml" --no-progress
echo "calibrate: $(( $(date +%s) - start )) s wall"
python3 scripts/compare_profile.py "$DEST/gpu-profile.yaml" | tee "$DEST/compare.txt"
