"""The orchestrator: the plan an experiment expands to, skipping finished commands, stopping on failure."""
from __future__ import annotations

import json
import sys

import pytest

from pipeline.config import ConfigError, compose
from pipeline.launch import StageFailed, is_done, run_command
from pipeline.run import critical_path_lengths, execute, stage_overrides, status_line
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


def _fake_stage(tmp_path, body: str, name: str = "stage", needs: tuple[str, ...] = ()) -> StageCommand:
    script = ("import sys, time; from pipeline.manifest import stage_run\n"
              f"with stage_run(r'{tmp_path / name}', stage='x', variant='{name}', config={{}}) as run:\n"
              f"    {body}\n")
    return StageCommand("x", name, [sys.executable, "-c", script], [tmp_path / name], compose([]), needs=list(needs))


def _timed_stage(tmp_path, name: str, seconds: float, needs: tuple[str, ...] = ()) -> StageCommand:
    """A stage that sleeps and records when it ran in ``<name>.json``."""
    body = (f"start = time.time(); time.sleep({seconds}); "
            f"open(r'{tmp_path / name}.json', 'w').write(repr([start, time.time()]))")
    return _fake_stage(tmp_path, body, name, needs)


def _span(tmp_path, name: str) -> tuple[float, float]:
    return tuple(json.loads((tmp_path / f"{name}.json").read_text()))


def test_plan_needs_point_at_the_producers():
    cfg = compose(["experiment=demo"])
    plan = {c.name: c for c in build_plan(cfg, [])}
    assert plan["tokenize/toy"].needs == ["data", "base/toy"]
    assert plan["rl/toy/eksft"].needs == ["sft/toy/eksft"]
    assert plan["rl/toy/base"].needs == ["data", "base/toy"]
    assert plan["eval/toy/rl/dft"].needs == ["data", "rl/toy/dft"]
    assert set(plan["report"].needs) == set(plan) - {"report"}
    only_eval = {c.name: c for c in build_plan(compose(["experiment=demo", "experiment.stages=[eval_sft]"]), [])}
    assert all(c.needs == [] for c in only_eval.values())  # producers outside the plan are not waited for


def test_longest_chain_goes_first():
    cfg = compose(["experiment=demo"])
    chain = critical_path_lengths(build_plan(cfg, []))
    assert chain["sft/toy/sft"] > chain["rl/toy/base"] > chain["eval/toy/sft/base"]
    assert chain["report"] == 1 and chain["base/toy"] > chain["tokenize/toy"]


def test_parallel_slots_overlap_independent_commands_and_wait_for_needs(tmp_path):
    first = _timed_stage(tmp_path, "first", 1.0)
    second = _timed_stage(tmp_path, "second", 1.0)
    after_first = _timed_stage(tmp_path, "after_first", 0.1, needs=("first",))
    assert execute([first, second, after_first], parallel=2) is None
    assert _span(tmp_path, "first")[0] < _span(tmp_path, "second")[1]  # ran at the same time
    assert _span(tmp_path, "after_first")[0] >= _span(tmp_path, "first")[1]
    assert all(is_done(c) for c in (first, second, after_first))


def test_failure_lets_running_commands_finish_and_starts_nothing_new(tmp_path):
    failing = _fake_stage(tmp_path, "raise ValueError('bad row 7')", "failing")
    slow = _timed_stage(tmp_path, "slow", 1.0)
    later = _timed_stage(tmp_path, "later", 0.1, needs=("slow",))
    failure = execute([failing, slow, later], parallel=2)
    assert isinstance(failure, StageFailed) and "bad row 7" in str(failure)
    assert is_done(slow) and not (tmp_path / "later.json").exists()


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


def test_status_shows_the_latest_progress_bar_of_each_running_command(tmp_path):
    command = _fake_stage(tmp_path, "pass", "rl")
    command.record_dir.mkdir(parents=True)
    (command.record_dir / "launch.log").write_text("$ python -m rl.train\nrl/sft:  12%| 1/8 [00:40<04:40]\r"
                                                    "rl/sft:  25%| 2/8 [00:52<02:36]\r")
    line = status_line([command], finished=3, total=27, elapsed_s=600)
    assert line == "[3/27 done, 10.0 min] rl: rl/sft:  25%| 2/8 [00:52<02:36]"
