"""What can be run (issue 30.5): `python -m pipeline.run --help` and `make list` list the experiments with their
profiles, the profiles, every SFT method with a one-line description, the benchmarks and the orchestrator's flags,
read from conf/; schema entries (base_*) are neither listed nor selectable."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import CONF_DIR, ConfigError, compose
from common.config.catalogue import catalogue, method_description

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
METHODS = sorted(p.stem for p in (CONF_DIR / "sft" / "method").glob("*.yaml"))


def test_help_lists_experiments_methods_benchmarks_and_flags():
    result = subprocess.run([sys.executable, "-m", "pipeline.run", "--help"], capture_output=True, text=True,
                            timeout=120, cwd=REPO, check=True)
    out = result.stdout
    assert out.strip() == catalogue().strip()
    lines = out.splitlines()
    for experiment in EXPERIMENTS:
        assert any(line.startswith(f"  {experiment} ") for line in lines), experiment
    assert any(line.startswith("  demo ") and "[toy] The demo (`make demo`)" in line for line in lines)
    for method in METHODS:
        row = next(line for line in lines if line.startswith(f"  {method} "))
        assert row.split(None, 1)[1] == method_description(method) != "", method
    assert "  data=toy_forking      toy_fork_small, toy_fork_carry, toy_fork_plain" in lines
    assert any(line.startswith("  data=openr1 ") and "aime24, aime25, amc, hmmt25, +aime26" in line for line in lines)
    for flag in ("dry_run=true", "preflight=true", "force=[", "experiment.parallel="):
        assert any(line.startswith(f"  {flag}") for line in lines), flag
    assert not re.search(r"\bbase_", out)  # the structured-config schemas (base_pear, ...) are not presets


def test_a_method_preset_without_a_comment_is_described_by_its_schema():
    assert method_description("sft") == "Plain SFT: token-mean negative log-likelihood of the response tokens."
    assert method_description("eksft_no_kl") == ('Paper ablation "w/o KL regularisation": lambda_KL = 0 '
                                                 "(selection unchanged).")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_list_prints_the_help():
    out = subprocess.run(["make", "-n", "--no-print-directory", "list"], cwd=REPO, check=True, capture_output=True,
                         text=True, env={**os.environ, "STACK": ""}).stdout
    assert ".venv/bin/python -m pipeline.run --help" in out


@pytest.mark.parametrize("choice", ["experiment=base_experiment", "sft/method=base_eksft", "profile=base_profile"])
def test_schema_entries_are_not_selectable(choice):
    group = choice.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{choice} is a schema, not an option; choose one of: "):
        compose([choice])
    result = subprocess.run([sys.executable, "-m", "pipeline.run", choice, "dry_run=true"], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
    assert result.stderr.strip() == f"error: {choice} is a schema, not an option; choose one of: {options}"


GROUPS = sorted(str(path.relative_to(CONF_DIR)) for path in CONF_DIR.rglob("*") if path.is_dir()
                and any(path.glob("*.yaml")))


@pytest.mark.parametrize("group", GROUPS)
def test_an_unknown_option_of_any_group_is_one_line_with_the_closest_options(group):
    """Issue 43.6: Hydra's own error for ``sft/method=eksf`` was 48 lines with the schema entries and no hint."""
    option = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))[0]
    typo = option + "x"
    with pytest.raises(ConfigError) as error:
        compose([f"{group}={typo}"])
    assert str(error.value).startswith(f"unknown {group} '{typo}'; did you mean {option}")
    assert "base_" not in str(error.value) and "\n" not in str(error.value)


def test_an_unknown_option_far_from_every_option_lists_the_options():
    with pytest.raises(ConfigError, match=r"^unknown profile 'gpu'; choose one of: paper, toy$"):
        compose(["profile=gpu"])


@pytest.mark.parametrize("module", ["pipeline.run", "data.prepare"])
def test_an_unknown_option_on_the_command_line_is_one_line(module):
    result = subprocess.run([sys.executable, "-m", module, "sft/method=eksf", "dry_run=true"], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: unknown sft/method 'eksf'; did you mean eksft?"
