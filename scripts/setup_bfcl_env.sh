#!/usr/bin/env bash
# The isolated BFCL checker venv: requirements/bfcl.txt (bfcl-eval and the pinned import closure of its AST checker)
# into $BFCL_VENV (default .venv-bfcl), installed with --no-deps so bfcl-eval's own metadata (numpy==1.26.4, vendor
# SDKs, sentence-transformers, faiss) is never resolved against anything, and never into the project venv.
# Ends by starting eval/bfcl/_worker.py once, which imports exactly what scoring imports.
# Usage: scripts/setup_bfcl_env.sh  (BFCL_VENV=<folder> to build elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${BFCL_VENV:-.venv-bfcl}"
python="${PYTHON:-python3}"
say() { echo "[setup_bfcl_env] $*"; }
stamp="$venv/.requirements.sha256"
want="$(sha256sum requirements/bfcl.txt | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  say "$venv is up to date with requirements/bfcl.txt"
else
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --no-deps -r requirements/bfcl.txt
  echo "$want" > "$stamp"
fi
echo '' | "$venv/bin/python" eval/bfcl/_worker.py | grep -q '"ready": true' \
  && say "BFCL checker ready: BFCL_PYTHON=$venv/bin/python" \
  || { echo "[setup_bfcl_env] eval/bfcl/_worker.py does not start under $venv/bin/python" >&2; exit 1; }
