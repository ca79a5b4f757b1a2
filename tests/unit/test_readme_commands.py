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
    evaluate = [o for o in readme_command("eval.run") if o.split("=")[0] in ("experiment", "profile", "data.source")]
    assert data_dir(compose(shlex.split(data_command))) == data_dir(compose(evaluate))


REPO = README.parent


def readme_code() -> str:
    """Every inline-code span and code block of the README, where its commands are."""
    text = README.read_text(encoding="utf-8")
    return "\n".join(re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", text))


def test_every_make_target_the_readme_names_exists():
    targets = set(re.findall(r"^([A-Za-z0-9_-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), flags=re.M))
    named = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", readme_code()))
    assert {"demo", "test", "reproduce-table1", "dry-run"} <= named
    assert named <= targets, sorted(named - targets)


def test_every_module_and_script_the_readme_runs_exists():
    code = readme_code()
    modules = set(re.findall(r"python -m ([A-Za-z_][\w.]*)", code))
    assert {"pipeline.run", "eval.run", "data.prepare", "report.run"} <= modules
    for module in modules:
        path = REPO / module.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), module
    for script in re.findall(r"python (scripts/[\w/]+\.py)", code):
        assert (REPO / script).is_file(), script


def test_every_experiment_the_readme_names_has_a_config():
    code = readme_code()
    named = set(re.findall(r"experiment=([a-z0-9_]+)", code)) | set(re.findall(r"EXPERIMENT=([a-z0-9_]+)", code))
    for choices in re.findall(r"experiment=<([^>]+\|[^>]+)>", code):  # <a|b|c> lists choices; <name> is a placeholder
        named |= set(choices.replace("\\", "").split("|"))
    assert {"demo", "table1", "table2", "forking", "toy_rl"} <= named
    for name in named:
        assert (REPO / "conf" / "experiment" / f"{name}.yaml").is_file(), name


def sequences_per_step(cfg) -> int:
    return cfg.sft.micro_batch_size * cfg.sft.grad_accum * cfg.profile.nproc_per_node


def test_the_one_gpu_recipe_keeps_the_papers_sequences_per_step():
    """Issue 43.4: overriding model.path kept Qwen3-4B's name in every folder; the recipe names a model config."""
    args = re.search(r'make dry-run PROFILE=paper ARGS="([^"]+)"', README.read_text(encoding="utf-8")).group(1)
    one_gpu, paper = compose(["profile=paper", *shlex.split(args)]), compose(["profile=paper"])
    assert sequences_per_step(one_gpu) == sequences_per_step(paper) == 64 and one_gpu.profile.nproc_per_node == 1
    assert [(m, (REPO / "conf" / "model" / f"{m}.yaml").is_file()) for m in one_gpu.profile.models] == [
        ("qwen3_0_6b", True)]
