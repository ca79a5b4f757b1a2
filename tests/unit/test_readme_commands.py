"""The README's "evaluate any HF folder" command composes, selects the benchmarks it names and evaluates the
folder it names (the old form failed: toy benchmarks do not define aime24 and amc)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from common.config import compose
from common.paths import data_dir
from common.preflight import model_paths

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_command(module: str) -> list[str]:
    """The overrides of the README table's ``python -m <module> ...`` command."""
    commands = re.findall(rf"`python -m {re.escape(module)} ([^`]+)`", README.read_text(encoding="utf-8"))
    assert len(commands) == 1, commands
    return shlex.split(commands[0])


def test_evaluate_any_model_command_as_written():
    from eval.stage import benchmark_names, resolve_model

    overrides = readme_command("eval.run")
    cfg = compose(overrides)
    assert benchmark_names(cfg) == ["aime24", "amc"]
    assert resolve_model(cfg) == ("/path/to/hf", {"model": {"path": "/path/to/hf", "upstream_run": None},
                                                  "sft_method": None})
    assert model_paths(cfg, f"eval_{cfg.eval.phase}") == [("eval.model_path", "/path/to/hf")]
    assert cfg.eval.n == 4 and cfg.eval.variant == "my_model"


def test_the_data_command_it_points_to_writes_the_benchmarks_it_reads():
    """The README's data command names the same experiment and profile, so both use one data folder."""
    text = README.read_text(encoding="utf-8")
    data_command = re.search(r"`python -m data\.prepare ([^`]+)`", text).group(1)
    evaluate = [o for o in readme_command("eval.run") if o.split("=")[0] in ("experiment", "profile")]
    assert data_dir(compose(shlex.split(data_command))) == data_dir(compose(evaluate))
