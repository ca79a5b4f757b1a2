"""The base model as a random factor (issue 40): ``toy.base_seed`` gives another base model of the same world (its
initialisation and pretraining order), ``experiment.base_seeds`` plans one per entry with every seed nested in it,
and the default keeps today's run identities."""
from __future__ import annotations

import pytest
import torch

from common.config import ConfigError, compose
from common.config.toy import ToyConfig
from common.grid import NestedSeed, arm_named, experiment_grid, rl_variants, top_level_unit
from common.paths import base_run, data_run, eval_run
from eval.intervals import Estimate, no_spread, seed_t_test
from pipeline.stages import build_plan
from report.tables import Block, ResultTable, Row, fill_estimates
from toy.base import base_model_seed, pretrain_order

FORKING = ["experiment=forking", "profile=toy"]
SMALL = [*FORKING, "experiment.methods=[sft]", "experiment.stages=[data,base,sft,rl]"]


def identities(overrides: list[str]) -> dict[str, str]:
    cfg = compose([*FORKING, "experiment.methods=[eksft]", *overrides])  # one arm's runs: the others' are alike
    a = arm_named(cfg, "eksft")
    return {"base": base_run(cfg).directory.name, "data": data_run(cfg).directory.name, "sft": a.sft.name,
            "rl": a.rl.name, "eval": eval_run(cfg, "rl", "eksft", "toy_fork_plain", a.rl).directory.parent.name}


def test_the_default_base_seed_keeps_todays_run_identities():
    # recorded on the commit before toy.base_seed existed: base seed 0 is the same base model and the same runs
    today = {"base": "3a0cdc41a0dddba6", "data": "toy-f400a0e7", "sft": "eksft-8099d243", "rl": "eksft-8419c51a",
             "eval": "eksft-a120c50f"}
    assert identities([]) == today == identities(["toy.base_seed=0"])
    other = identities(["toy.base_seed=1"])
    assert other["data"] == today["data"]  # problems, tokenizer and teacher: the data stage is the same
    assert all(other[stage] != today[stage] for stage in ("base", "sft", "rl", "eval"))


def test_a_base_seed_changes_the_initialisation_and_the_order_not_the_sequences():
    toy = ToyConfig(world="forking")
    sequences = torch.arange(40).reshape(10, 4)
    assert pretrain_order(sequences, toy) is sequences
    reordered = pretrain_order(sequences, ToyConfig(world="forking", base_seed=2))
    assert not torch.equal(reordered, sequences)
    assert sorted(map(tuple, reordered.tolist())) == sorted(map(tuple, sequences.tolist()))
    assert base_model_seed(ToyConfig(base_seed=1), "model-init") != base_model_seed(toy, "model-init")


def test_base_seeds_plan_one_base_model_each_with_the_seeds_nested_in_it():
    overrides = [*SMALL, "experiment.base_seeds=[0,1]", "experiment.seeds=[0,1]"]
    cfg = compose(overrides)
    plan = build_plan(cfg, overrides)
    bases = [c for c in plan if c.stage == "base" and c.name.startswith("base/")]
    assert [c.name for c in bases] == ["base/toy/base0", "base/toy/base1"]
    assert len({c.runs[0].directory for c in bases}) == 2
    assert bases[0].runs[0].directory == base_run(compose(FORKING)).directory  # base seed 0 is today's
    assert [c.name for c in plan if c.stage == "sft" and c.name.startswith("sft/toy/sft/")] == \
        ["sft/toy/sft/base0/seed0", "sft/toy/sft/base0/seed1", "sft/toy/sft/base1/seed0", "sft/toy/sft/base1/seed1"]
    rl = [c.name for c in plan if c.stage == "rl"]
    assert rl == [f"rl/toy/{arm}/base{b}/seed{s}" for b in (0, 1) for s in (0, 1) for arm in ("base", "sft")]
    sft_b1 = next(c for c in plan if c.name == "sft/toy/sft/base1/seed0")
    assert "toy.base_seed=1" in sft_b1.argv and sft_b1.needs == ["tokenize/toy/base1"]
    model = experiment_grid(cfg, sweep_points=False).models[0]
    assert list(model.seeds) == [NestedSeed(0, 0), NestedSeed(0, 1), NestedSeed(1, 0), NestedSeed(1, 1)]
    assert model.arms[NestedSeed(1, 0)]["sft"].sft == sft_b1.runs[0].directory
    assert [top_level_unit(key) for key in model.seeds] == [0, 0, 1, 1] and str(NestedSeed(1, 0)) == "b1s0"


def test_the_forking_experiment_runs_dapo_from_the_base_model():
    # the control for "a better start for RL": Table 2's Base row (experiment.rl_from_base, on by default)
    cfg = compose([*FORKING, "experiment.methods=[sft]"])
    assert cfg.experiment.rl_from_base and rl_variants(cfg) == ["base", "sft"]


@pytest.mark.parametrize("overrides, message", [
    (["experiment.base_seeds=[0,0]"], "experiment.base_seeds has duplicates"),
    (["experiment.base_seeds=[-1]"], r"experiment.base_seeds\[\] must be in"),
    (["experiment=table1", "profile=paper", "experiment.base_seeds=[0,1]"], "experiment.base_seeds=.* needs a base "
                                                                             "model the pipeline trains")])
def test_bad_base_seeds_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(overrides if overrides[0].startswith("experiment=") else [*FORKING, *overrides])


def test_seed_level_statistics_take_the_base_seed_as_the_unit():
    # Two base models, two SFT seeds each; one problem, n = 4. SFT: 1, 3 | 1, 3 correct; X: 2, 4 | 3, 3.
    # Per run Δ (points): +25, +25 | +50, 0; per base model: +25, +25 (no spread over base models) where the four
    # runs alone would give a t-test; X's level per base model 75, 75 and SFT's 50, 50.
    def runs(*counts):
        return {NestedSeed(b, s): {"n": 4, "correct_counts": {"p0": c}}
                for (b, s), c in zip([(0, 0), (0, 1), (1, 0), (1, 1)], counts)}

    table = ResultTable(caption="t", row_header="Method", columns=["A", "Avg"], metrics=["pass@1"], blocks=[Block(
        "m", [Row("SFT", "sft", evaluations={"A": runs(1, 3, 1, 3)}),
              Row("X", "x", evaluations={"A": runs(2, 4, 3, 3)})])])
    fill_estimates(table)
    sft, x = table.blocks[0].rows
    cell = ("Avg", "pass@1")
    assert x.per_seed[cell] == {NestedSeed(0, 0): 50.0, NestedSeed(0, 1): 100.0, NestedSeed(1, 0): 75.0,
                                NestedSeed(1, 1): 75.0}
    assert x.seed_intervals[cell] == Estimate(75.0, 75.0, 75.0) and sft.seed_intervals[cell] == Estimate(50, 50, 50)
    assert x.delta_seed[cell] == Estimate(25.0, 25.0, 25.0) and no_spread(x.delta_p[cell])
    # a flat design (the same four runs as four seeds) would have spread: the unit is what changed
    assert not no_spread(seed_t_test([25.0, 25.0, 50.0, 0.0]))
