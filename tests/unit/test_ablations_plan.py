"""experiment=ablations: every arm once, the Qwen3-4B-only arms for the first model only, and Table 1's data, SFT and
evaluation runs reused by identity (experiment.train_in); the evaluation identities that make that work."""
from __future__ import annotations

from dataclasses import replace

import pytest

from common.config import ConfigError, compose
from common.paths import eval_run, method_label, sft_run
from common.grid import arm_named, with_method
from pipeline.run import run
from pipeline.stages import build_plan

PAPER = ["experiment=ablations", "profile=paper"]
SHARED_ARMS = ("sft", "eksft")
BOTH_MODELS = ("eksft_lambda_entropy0", "eksft_lambda_kl0", "eksft_lambda_entropy0_lambda_kl0",
               "eksft_global_regularisationTrue")
FIRST_MODEL_ONLY = ("eksft_selectionrandom", "eksft_rho0.1", "eksft_rho0.3", "eksft_rho0.4")


@pytest.fixture(scope="module")
def plans():
    """The ablations' and Table 1's plans on the paper profile: {name: manifest folders} each."""
    table1 = ["experiment=table1", "profile=paper"]
    return {name: {command.name: command.manifest_dirs for command in build_plan(compose(overrides), overrides)}
            for name, overrides in (("ablations", PAPER), ("table1", table1))}


def test_every_arm_is_planned_once_and_the_4b_only_arms_for_qwen3_4b_only(plans):
    names = list(plans["ablations"])
    assert len(names) == len(set(names))
    for model, arms in (("qwen3_4b", (*SHARED_ARMS, *BOTH_MODELS, *FIRST_MODEL_ONLY)),
                        ("qwen3_8b", (*SHARED_ARMS, *BOTH_MODELS))):
        assert sorted(n.split("/")[-1] for n in names if n.startswith(f"sft/{model}/")) == sorted(arms)
        assert sorted(n.split("/")[-1] for n in names if n.startswith(f"eval/{model}/sft/")) == sorted(
            ("base", *arms))
    assert not any(n.startswith(("rl/", "eval/qwen3_4b/rl")) for n in names)  # SFT only, as in the paper


def test_table1s_data_sft_and_evaluation_runs_are_reused_by_identity(plans):
    ablations, table1 = plans["ablations"], plans["table1"]
    shared = [name for name in ablations if name in table1 and name != "report"]  # each its own report
    assert sorted(shared) == sorted(["data", *(f"tokenize/{m}" for m in ("qwen3_4b", "qwen3_8b")),
                                     *(f"sft/{m}/{a}" for m in ("qwen3_4b", "qwen3_8b") for a in SHARED_ARMS),
                                     *(f"eval/{m}/sft/{a}" for m in ("qwen3_4b", "qwen3_8b")
                                       for a in ("base", *SHARED_ARMS))])
    assert all(ablations[name] == table1[name] for name in shared)  # the same folders: reused, not redone
    for name in ablations:  # the ablation arms train and evaluate in runs/table1 as well
        if name != "report":
            assert all(folder.parts[:2] == ("runs", "table1") for folder in ablations[name]), name


def test_the_dry_run_names_the_commands_table1_has_too(capsys):
    run(compose([*PAPER, "dry_run=true"]), PAPER)
    out = capsys.readouterr().out
    assert out.count("; experiment=table1 has these runs too)") == 13
    assert "13 of 38 commands write only runs that experiment=table1 (experiment.train_in) has" in out
    assert "dry run: nothing was started" in out


def test_rho_zero_is_sfts_run_not_a_run_of_its_own():
    """EKSFT at ρ = 0 computes plain CE bit for bit (tests/unit/test_losses.py), but its config, hence its run
    identity, differs from SFT's: the ratio table reads SFT's run for ρ = 0 instead of training a copy."""
    cfg = compose(["profile=paper"])
    sft = compose(["profile=paper", "sft/method=sft"]).sft.method
    rho0 = replace(compose(["profile=paper", "sft/method=eksft"]).sft.method, rho=0.0)
    assert method_label(rho0) == "eksft_rho0"
    assert sft_run(with_method(cfg, rho0)).directory != sft_run(with_method(cfg, sft)).directory


def test_first_model_only_must_name_methods_of_the_experiment():
    with pytest.raises(ConfigError, match=r"experiment.first_model_only\[\] must be one of"):
        compose([*PAPER, "experiment.first_model_only=[dft]"])


def test_each_benchmarks_evaluation_identity_holds_its_own_sample_count():
    """eval=passk320 (the paper profile's) draws 320 AIME25 samples once; AIME24, AMC and HMMT25 keep the folders
    eval=avg32 gives them, so the protocol that gives Figures 2-3 re-samples nothing else."""
    passk, avg32 = compose(["profile=paper"]), compose(["profile=paper", "eval=avg32"])
    assert passk.eval.n_per_benchmark == {**avg32.eval.n_per_benchmark, "aime25": 320}  # avg32's: LUFFY's extra sets
    assert "aime25" not in avg32.eval.n_per_benchmark
    folders = {name: {bench: eval_run(c, "sft", "base", bench, None) for bench in c.data.benchmarks}
               for name, c in (("passk", passk), ("avg32", avg32))}
    for bench in ("aime24", "amc", "hmmt25"):
        assert folders["passk"][bench].directory == folders["avg32"][bench].directory
    assert folders["passk"]["aime25"].directory.parent != folders["avg32"]["aime25"].directory.parent
    assert folders["passk"]["aime25"].config["protocol"]["n"] == 320
    assert folders["passk"]["aime25"].config["protocol"]["n_per_benchmark"] == {}


def test_evaluations_of_sft_models_live_with_the_sft_runs_and_rl_evaluations_with_the_rl_runs():
    cfg = compose(["experiment=table2", "profile=paper"])
    sft = arm_named(cfg, "sft")
    assert eval_run(cfg, "sft", "sft", "amc", sft.sft).directory.parts[:2] == ("runs", "table1")
    assert eval_run(cfg, "rl", "sft", "amc", sft.rl).directory.parts[:2] == ("runs", "table2")
