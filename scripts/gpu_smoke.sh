#!/usr/bin/env bash
# The paper profile's GPU path on one GPU (scripts/gpu_smoke.py: A head-gradient accuracy, B memory and step time at
# 20k tokens, C a 2-step trainer run with resume and export; meant for < 8 min on an H100), one JSON results file.
# Needs a CUDA torch, transformers and the project's base dependencies, no vLLM or verl.
#   scripts/gpu_smoke.sh [--parts A B C] [--out FILE]     # on the GPU node (make gpu-smoke)
#   scripts/gpu_smoke.sh --dry-run                        # any machine, < 1 min: imports, shapes, A and B at tiny CPU sizes
# Python: $PYTHON, else .venv-gpu (make env-gpu), else .venv, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in .venv-gpu/bin/python .venv/bin/python python3; do
    if [ -x "$candidate" ] || command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
  done
fi
export PYTHONUNBUFFERED=1 GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-10000}"
exec "$python" scripts/gpu_smoke.py "$@"
