"""docs/evaluation.md's evaluate-any-model commands run as written on the toy profile (issue 30.7: the documented
command had no experiment or profile and failed), with only the model folder, the run root and the problem count
filled in."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from bench.tiny_model import build_tiny_qwen3

REPO = Path(__file__).resolve().parents[2]


def documented_commands() -> list[list[str]]:
    """The data.prepare and eval.run lines of the "Any HF folder" block of docs/evaluation.md's commands."""
    text = (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")
    block = text.split("# Any HF folder", 1)[1].split("\n\n", 1)[0]
    return [shlex.split(line) for line in block.splitlines() if re.match(r"python -m (data\.prepare|eval\.run) ", line)]


def test_the_documented_evaluate_any_model_command_runs(tmp_path):
    commands = documented_commands()
    assert [argv[2] for argv in commands] == ["data.prepare", "eval.run"]
    model = build_tiny_qwen3(tmp_path / "model", think_prompt=True)
    extra = [f"experiment.run_root={tmp_path / 'runs'}", "eval.max_problems=2", "eval.max_tokens=16"]
    for argv in commands:
        argv = [sys.executable, *[arg.replace("/path/to/hf", str(model)) for arg in argv[1:]], *extra]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
    metrics = list((tmp_path / "runs" / "table1" / "eval").glob("*/sft/my_model*/toy_add/metrics.json"))
    assert len(metrics) == 1 and json.loads(metrics[0].read_text())["n"] == 4
    assert "results: toy_add: avg@4 " in result.stdout and f"-> {metrics[0]}" in result.stdout
