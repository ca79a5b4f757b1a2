"""The default DAPO argv, byte for byte (``tests/assets/dapo_argv_*.txt``): a refactor of ``rl/verl_args.py`` or of
the RL schema must not change what verl runs for ``rl/algorithm=dapo``, the default.

Machine-specific parts are replaced before comparing: the interpreter, the repository root, the working directory
(run folders are absolute) and the 8-hex-digit run ids (they hash upstream configs that other changes may move; the
RL identity has its own test in tests/unit/test_rl_algorithms.py). To regenerate after an intended change:
``PYTHONPATH=$PWD python tests/unit/test_rl_dapo_golden.py``.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from common.config import compose
from rl.verl_args import build_command

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSETS = REPO_ROOT / "tests" / "assets"
GOLDEN = {"toy": ["experiment=toy_rl", "profile=toy"], "paper": ["experiment=table2", "profile=paper"]}
"""Golden file suffix -> the overrides of the default DAPO configs it holds the argv of."""


def normalised_argv(overrides: list[str]) -> str:
    """``build_command`` of ``overrides``, one argument a line, machine-specific parts as placeholders."""
    text = "\n".join(build_command(compose(overrides))) + "\n"
    text = text.replace(sys.executable, "<python>")
    text = text.replace(str(Path.cwd().resolve()), "<cwd>").replace(str(REPO_ROOT), "<repo>")
    return re.sub(r"-[0-9a-f]{8}/", "-<id>/", text)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_default_dapo_argv_is_byte_equal_to_the_golden_file(name, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    golden = (ASSETS / f"dapo_argv_{name}.txt").read_text(encoding="utf-8")
    assert normalised_argv(GOLDEN[name]) == golden


if __name__ == "__main__":
    os.chdir(REPO_ROOT)
    for suffix, overrides in GOLDEN.items():
        (ASSETS / f"dapo_argv_{suffix}.txt").write_text(normalised_argv(overrides), encoding="utf-8")
