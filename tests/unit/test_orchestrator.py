"""The orchestrator: the plan an experiment expands to, skipping finished commands, stopping on failure."""
from __future__ import annotations

import sys

import pytest

from pipeline.config import ConfigError, compose
from pipeline.launch import StageFailed, is_done, run_command
from pipeline.run import stage_overrides
from pipeline.stages import StageCommand, build_plan


def test_table1_plan_covers_models_methods_and_benchmarks():
    cfg = compose(["experiment=table1", "profile=paper"])
    plan = build_plan(cfg, ["experiment=table1", "profile=paper"])
    names = [c.name for c in plan]
    assert names[0] == "data" and names[-1] == "report"
    for model in ("qwen3_4b", "qwen3_8b"):
        for method in ("sft", "dft", "iwsft", "psft", "eksft"):
            assert f"sft/{model}/{method}" in names
            assert f"eval/{model}/sft/{method}" in names
        assert f"eval/{model}/sft/base" in names
    sft = next(c for c in plan if c.name == "sft/qwen3_8b/eksft")
    assert "--nproc_per_node=8" in sft.argv and "sft/method=eksft" in sft.argv and "model=qwen3_8b" in sft.argv
    evals = [c for c in plan if c.stage == "eval_sft"]
    assert all(c.settings["sampling"]["n"] == 32 and len(c.manifest_dirs) == 4 for c in evals)


def test_toy_plan_pretrains_the_base_model_first():
    cfg = compose(["experiment=table1", "profile=toy"])
    stages = [c.name for c in build_plan(cfg, [])]
    assert stages.index("base/toy") < stages.index("tokenize/toy") < stages.index("sft/toy/sft")


def test_sweep_points_get_their_own_folders():
    cfg = compose(["experiment=table1", "experiment.methods=[eksft]", "sft.method.rho=0.1"])
    names = [c.name for c in build_plan(cfg, ["sft.method.rho=0.1"])]
    assert "sft/toy/eksft_rho0.1" in names


def test_overrides_the_plan_owns_are_refused_with_a_hint():
    with pytest.raises(ConfigError, match="profile.models"):
        stage_overrides(["model=qwen3_8b"])
    assert stage_overrides(["dry_run=true", "sft.lr=1e-4", "hydra.verbose=true"]) == ["sft.lr=1e-4"]


def _fake_stage(tmp_path, body: str) -> StageCommand:
    script = ("import sys; from pipeline.manifest import stage_run\n"
              f"with stage_run(r'{tmp_path / 'stage'}', stage='x', variant='v', config={{}}) as run:\n"
              f"    {body}\n")
    return StageCommand("x", "x/v", [sys.executable, "-c", script], [tmp_path / "stage"], compose([]))


def test_finished_command_is_skipped_until_its_manifest_changes(tmp_path):
    command = _fake_stage(tmp_path, "pass")
    assert not is_done(command)
    run_command(command)
    assert is_done(command)
    (tmp_path / "stage" / "manifest.json").write_text((tmp_path / "stage" / "manifest.json").read_text() + " ")
    assert not is_done(command)


def test_failed_stage_reports_its_reason(tmp_path):
    command = _fake_stage(tmp_path, "raise ValueError('row 3: field target missing')")
    with pytest.raises(StageFailed, match="row 3: field target missing"):
        run_command(command)
    assert (tmp_path / "stage" / "launch.log").exists()
    assert not is_done(command)


def test_sweep_preset_stays_with_the_orchestrator():
    kept = stage_overrides(["+sweep=eksft_rho", "sft.method.rho=0.3"], methods=["eksft"])
    assert kept == ["experiment.methods=[eksft]", "sft.method.rho=0.3"]
