"""One experiment grid: the plan's commands cover the models x variants the report reads (common.paths), and an
override that would make a stage command's run differ from the report's is refused before anything runs."""
from __future__ import annotations

import pytest

from common.config import ConfigError, compose
from common.grid import method_labels, model_configs, rl_variants, variants
from report.collect import row_label
from pipeline.stages import build_plan

TWO_METHODS = ["experiment=table1", "profile=toy", "experiment.methods=[sft,eksft]"]


def test_the_plan_trains_and_evaluates_the_variants_the_report_reads():
    cfg = compose(TWO_METHODS)
    plan = build_plan(cfg, TWO_METHODS)
    assert variants(cfg) == ["base", "sft", "eksft"] and [m.model.name for m in model_configs(cfg)] == ["toy"]
    assert [c.name for c in plan if c.stage == "sft"] == ["sft/toy/sft", "sft/toy/eksft"]
    assert [c.name for c in plan if c.stage == "eval_sft"] == ["eval/toy/sft/base", "eval/toy/sft/sft",
                                                               "eval/toy/sft/eksft"]


def test_rl_methods_choose_the_rl_arms_and_base_gets_one_unless_told_not_to():
    overrides = [*TWO_METHODS, "experiment.methods=[sft,dft,eksft]", "experiment.rl_methods=[eksft]",
                 "experiment.stages=[sft,rl,eval_rl]"]
    cfg = compose(overrides)
    plan = build_plan(cfg, overrides)
    assert rl_variants(cfg) == ["base", "eksft"]
    assert rl_variants(compose(TWO_METHODS)) == variants(compose(TWO_METHODS))
    assert [c.name for c in plan if c.stage == "sft"] == ["sft/toy/sft", "sft/toy/dft", "sft/toy/eksft"]
    assert [c.name for c in plan if c.stage == "rl"] == ["rl/toy/base", "rl/toy/eksft"]
    assert [c.name for c in plan if c.stage == "eval_rl"] == ["eval/toy/rl/base", "eval/toy/rl/eksft"]
    no_base = [*overrides, "experiment.rl_from_base=false"]
    assert [c.name for c in build_plan(compose(no_base), no_base) if c.stage in ("rl", "eval_rl")] == \
        ["rl/toy/eksft", "eval/toy/rl/eksft"]


def test_the_demo_runs_dapo_from_sft_beside_eksft():
    # Issue 43: the demo's RL result had no control (DAPO from EKSFT only); SFT + DAPO is its control.
    overrides = ["experiment=demo", "profile=toy"]
    plan = build_plan(compose(overrides), overrides)
    assert [c.name for c in plan if c.stage == "rl"] == ["rl/toy/sft", "rl/toy/eksft"]
    assert [c.name for c in plan if c.stage == "eval_rl"] == ["eval/toy/rl/sft", "eval/toy/rl/eksft"]


def test_rl_methods_not_trained_are_passed_over():
    # experiment=demo names eksft among its RL arms; `experiment.methods=[sft]` must still compose
    cfg = compose(["experiment=demo", "profile=toy", "experiment.methods=[sft]"])
    assert cfg.experiment.rl_methods == ["sft", "eksft"]
    assert rl_variants(cfg) == ["sft"]
    assert rl_variants(compose([*TWO_METHODS, "experiment.rl_methods=[psft]"])) == ["base"]


@pytest.mark.parametrize("rl_methods, message", [
    ("[eksft_typo]", r"experiment.rl_methods\[\] must be one of \[.*'eksft_official'.*\]; got 'eksft_typo'"),
    ("[sft,sft]", "experiment.rl_methods has duplicates")])
def test_rl_methods_that_name_no_method_are_refused(rl_methods, message):
    with pytest.raises(ConfigError, match=message):
        compose([*TWO_METHODS, f"experiment.rl_methods={rl_methods}"])


def test_a_method_override_that_the_report_would_not_see_is_refused():
    # sft.method.loss_norm reached both methods' SFT runs (sft_loss_normmicro_batch_sum, ...) while the report looked
    # for sft and eksft_loss_normmicro_batch_sum, so the table silently lost the sft row.
    overrides = [*TWO_METHODS, "sft.method.loss_norm=micro_batch_sum"]
    with pytest.raises(ConfigError, match=r"makes sft train as sft_loss_normmicro_batch_sum but the report looks for "
                                          r"sft .*use sft\.\* settings"):
        build_plan(compose(overrides), overrides)
    one_method = [*overrides[:2], "experiment.methods=[eksft]", "sft.method.loss_norm=micro_batch_sum"]
    names = [c.name for c in build_plan(compose(one_method), one_method) if c.stage == "sft"]
    assert names == ["sft/toy/eksft_loss_normmicro_batch_sum"]


def test_a_model_override_that_the_report_would_not_see_is_refused():
    overrides = ["experiment=table1", "profile=paper", "experiment.methods=[sft]", "model.attn_implementation=eager"]
    with pytest.raises(ConfigError, match=r"profile.models: a model.\* override .* reaches qwen3_8b"):
        build_plan(compose(overrides), overrides)


def test_every_arm_of_the_forking_experiment_has_a_row_title():
    cfg = compose(["experiment=forking"])
    assert [row_label(cfg, label) for label in method_labels(cfg)] == [
        "SFT", "EKSFT (paper eq.)", "EKSFT (official code)", "masking only (λ = 0)", "DFT", "EKSFT w/o entropy",
        "EKSFT w/o KL", "EKSFT, global regularisation", "EKSFT (official code, paper's alignment)",
        "EKSFT, random mask (EKSFT's size)", "EKSFT (paper eq.), ρ 0.02", "EKSFT (paper eq.), ρ 0.05", "ProFit",
        "PEAR, π_β = base model (variant)", "PEAR"]  # pear_base_ref (the 2026-11-26 arm), then PEAR as defined


def test_every_arm_of_the_ablations_has_a_row_title():
    cfg = compose(["experiment=ablations"])
    assert [row_label(cfg, label) for label in method_labels(cfg)] == [
        "SFT", "EKSFT (paper eq.)", "EKSFT w/o entropy", "EKSFT w/o KL", "masking only (λ = 0)",
        "EKSFT, global regularisation", "EKSFT, random mask (10%)", "EKSFT (paper eq.), ρ 0.1",
        "EKSFT (paper eq.), ρ 0.3", "EKSFT (paper eq.), ρ 0.4"]
