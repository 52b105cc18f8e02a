#!/usr/bin/env bash
# GPU verification of ep-trace's capture paths (issue 7): Kineto Tracer vs CUPTI collector vs no
# capture on the MoE EP workload, kernel lists compared, gpu_user_annotation spans checked, a small
# real CUDA trace packed for tests/data. One run, < 8 minutes on one H200 (see benchmarks/README.md).
#
# Usage (from the repository root):
#   bash benchmarks/gpu_check.sh --fetch-wheels  # on a machine WITH network: wheels the GPU machine lacks -> .whl/
#   bash benchmarks/gpu_check.sh                 # on the GPU machine: the check; results in $OUT (default /tmp/ep_gpu_out)
#   bash benchmarks/gpu_check.sh --dry-run       # on a CPU machine: same pipeline on gloo/CPU, tiny sizes, no CUPTI
#
# Device tool (this project's GPU machine has no network; its python3 holds torch, pyarrow, typer,
# rich, pandas, but not polars, orjson, cupti-python):
#   here:    echo /.whl/ >> .git/info/exclude; bash benchmarks/gpu_check.sh --fetch-wheels
#   device:  run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=540)
# Results come back as $OUT/results.md (paste into the cupti section of benchmarks/README.md),
# $OUT/results.json, $OUT/gpu_check.log and $OUT/tests_data_cuda/cuda_trace.tar.gz
# (unpack under tests/data/cuda/ and commit; COMMAND.txt inside says how it was made).
set -euo pipefail

cd "$(dirname "$0")/.."
MODE=run
case "${1:-}" in
  --fetch-wheels) MODE=fetch ;;
  --dry-run) MODE=dry ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_check.sh [--fetch-wheels|--dry-run]" >&2; exit 2 ;;
esac

PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/ep_gpu_out}
WORK=${EP_GPU_WORK:-/tmp/ep_gpu_work}
# Versions pinned to what ep-trace is developed against (pyproject + the dev venv).
WHEELS=(polars==2.1.0 polars-runtime-32==2.1.0 orjson==3.13.0 cupti-python==13.0.1)

if [[ $MODE == fetch ]]; then
  mkdir -p .whl
  # Python 3.12 / x86-64 is what the GPU machine runs (device KINDS.md); pip matches platforms exactly.
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
  du -sh .whl
  exit 0
fi

mkdir -p "$OUT" "$WORK"
LOG="$OUT/gpu_check.log"
: > "$LOG"
export PYTHONUNBUFFERED=1

if [[ $MODE == run ]]; then
  if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ep_site .whl/*.whl
    export PYTHONPATH=/tmp/ep_site${PYTHONPATH:+:$PYTHONPATH}
  fi
  # ep-trace itself: a plain (non-editable) install so that parsers/ maps to ep_trace.parsers.
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/ep_pkg . 2>&1 | tail -3 | tee -a "$LOG"
  export PYTHONPATH=/tmp/ep_pkg:$PYTHONPATH
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true; } 2>&1 | tee -a "$LOG"
  "$PY" -c "import torch, polars, orjson, ep_trace.parsers.cupti; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"
  "$PY" -c "from cupti import cupti; print('cupti-python ok')" 2>&1 | tee -a "$LOG" || echo "cupti-python missing: CUPTI mode will record the error" | tee -a "$LOG"
  set -o pipefail
  timeout 470 "$PY" benchmarks/gpu/check.py --out "$OUT" --work "$WORK" --steps 20 --warmup 5 --job-timeout 90 2>&1 | tee -a "$LOG"
else
  set -o pipefail
  timeout 300 "$PY" benchmarks/gpu/check.py --dry-run --out "$OUT" --work "$WORK" --job-timeout 60 2>&1 | tee -a "$LOG"
fi
