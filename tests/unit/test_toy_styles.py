"""scripts/toy_styles.py: the style mix of toy-world evaluations."""
from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from common.manifest import Manifest
from toy import forking
from toy.arithmetic import Problem, Term, solve

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "toy_styles.py"
spec = importlib.util.spec_from_file_location("toy_styles", SCRIPT)
toy_styles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(toy_styles)

PROBLEM = Problem((Term("number", (10,)), Term("product", (7, 4))), ("-",))


def _write_samples(path: Path, samples: list[tuple[str, int]]) -> None:
    path.mkdir(parents=True)
    with open(path / "samples.jsonl", "w") as out:
        for text, correct in samples:
            out.write(json.dumps({"problem_id": "p", "text": text, "correct": correct}) + "\n")


def test_rows_give_share_and_accuracy_per_style(tmp_path):
    rng = random.Random(0)
    steps, direct = solve(PROBLEM, "steps", rng), solve(PROBLEM, "direct", rng)
    _write_samples(tmp_path / "eval/toy/rl/base/toy_add", [(steps, 1), (steps, 0), (steps, 1), (direct, 0)])
    _write_samples(tmp_path / "eval/toy/sft/base/toy_add", [(direct, 0)])
    text = toy_styles.table(tmp_path, phase="rl", benchmark=None)
    header, rule, row = text.splitlines()
    assert header.endswith("| chain | steps | careful | direct |")
    assert row == "| toy | rl | base | toy_add | 0.500 | 0 / — | 0.75 / 0.67 | 0 / — | 0.25 / 0.00 |"
    # Issue 30.7: the output had no legend; it names what a cell is and each style of the tables shown.
    shown = toy_styles.legend(text).splitlines()
    assert shown[0].startswith("cells: share of the samples / accuracy of those samples")
    assert [line.split(":")[0].strip() for line in shown[1:]] == ["chain", "steps", "careful", "direct"]
    assert "guessing" in shown[-1]


def test_a_line_that_is_not_a_sample_is_named(tmp_path):
    _write_samples(tmp_path / "eval/toy/sft/base/toy_add", [("The answer is \\boxed{1}.", 1)])
    with open(tmp_path / "eval/toy/sft/base/toy_add/samples.jsonl", "a") as out:
        out.write('{"text": "x"}\n')
    with pytest.raises(SystemExit, match="samples.jsonl:2"):
        toy_styles.table(tmp_path, None, None)


def test_forking_benchmarks_give_strategy_shares_per_family_in_their_own_table(tmp_path):
    problem = forking.Problem(45, 38)
    place, round_ = forking.solve(problem, "place"), forking.solve(problem, "round")
    _write_samples(tmp_path / "eval/toy/sft/sft-1a2b3c4d/toy_fork_carry",
                   [(place, 0), (place, 0), (round_, 1), ("The answer is \\boxed{83}.", 1)])
    _write_samples(tmp_path / "eval/toy/sft/base/toy_add", [(solve(PROBLEM, "direct", random.Random(0)), 0)])
    arithmetic, forking_table = toy_styles.table(tmp_path, phase=None, benchmark=None).split("\n\n")
    assert arithmetic.splitlines()[0].endswith("| chain | steps | careful | direct |")
    header, _, row = forking_table.splitlines()
    assert header.endswith("| column | place | round | other |")
    assert row == ("| toy | sft | sft-1a2b3c4d | toy_fork_carry | 0.500 | "
                   "0 / — | 0.50 / 0.00 | 0.25 / 1.00 | 0.25 / 1.00 |")


def test_pool_seeds_pools_the_evaluations_of_one_method_and_counts_them(tmp_path):
    problem = forking.Problem(45, 38)
    place, round_ = forking.solve(problem, "place"), forking.solve(problem, "round")
    _write_samples(tmp_path / "eval/toy/sft/sft-1a2b3c4d/toy_fork_carry", [(place, 0), (round_, 1)])
    _write_samples(tmp_path / "eval/toy/sft/sft-9f8e7d6c/toy_fork_carry", [(round_, 1), (round_, 0)])
    _write_samples(tmp_path / "eval/toy/sft/eksft-00aa11bb/toy_fork_carry", [(place, 0), (place, 0)])
    header, _, *rows = toy_styles.table(tmp_path, None, None, pool_seeds=True).splitlines()
    assert header == "| model | phase | variant | benchmark | runs | pass@1 | column | place | round | other |"
    assert rows == ["| toy | sft | eksft | toy_fork_carry | 1 | 0.000 | 0 / — | 1.00 / 0.00 | 0 / — | 0 / — |",
                    "| toy | sft | sft | toy_fork_carry | 2 | 0.500 | 0 / — | 0.25 / 0.00 | 0.75 / 0.67 | 0 / — |"]


def _write_evaluation(path: Path, model_path: str, status: str = "complete") -> None:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps(asdict(Manifest(
        stage="eval", variant="x", status=status, details={"model": {"path": model_path}}))))


def test_fork_table_measures_each_evaluated_model_once_and_pools_its_seeds(tmp_path):
    forks = {"sft0": (0.2, 0.1, 0.6, 0.9), "sft1": (0.6, 0.3, 0.8, 1.0), "base": (1.1, 0.5, 0.4, 0.3)}
    measured = []

    def measure(model_path):
        measured.append(Path(model_path).name)
        entropy, column, round_, place = forks[Path(model_path).name]
        return {"fork_entropy_nats": entropy, "fork_small_p_column": column, "fork_carry_p_round": round_,
                "fork_plain_p_place": place, "fork_small_p_place": 1.0}

    models = {name: tmp_path / "models" / name for name in (*forks, "rl", "arithmetic")}
    for folder in models.values():
        folder.mkdir(parents=True)
    for family in ("small", "carry"):
        _write_evaluation(tmp_path / f"eval/toy/sft/sft-1a2b3c4d/toy_fork_{family}", str(models["sft0"]))
        _write_evaluation(tmp_path / f"eval/toy/sft/sft-9f8e7d6c/toy_fork_{family}", str(models["sft1"]))
    _write_evaluation(tmp_path / "eval/toy/sft/base-00aa11bb/toy_fork_small", str(models["base"]))
    _write_evaluation(tmp_path / "eval/toy/rl/sft-22cc33dd/toy_fork_small", str(models["rl"]), status="running")
    _write_evaluation(tmp_path / "eval/toy/sft/base-00aa11bb/toy_add", str(models["arithmetic"]))
    header, _, *rows = toy_styles.fork_table(tmp_path, None, measure).splitlines()
    assert header == ("| model | phase | variant | runs | fork H (nats) | p(column \\| small) | p(round \\| carry) "
                      "| p(place \\| plain) |")
    assert rows == ["| toy | sft | base | 1 | 1.10 [1.10, 1.10] | 0.50 | 0.40 | 0.30 |",
                    "| toy | sft | sft | 2 | 0.40 [0.20, 0.60] | 0.20 | 0.70 | 0.95 |"]
    assert sorted(measured) == ["base", "sft0", "sft1"]


def _write_rl_evaluation(experiment: Path, evaluation: str, rl_run: str, algorithm: str | None,
                         samples: list[tuple[str, int]]) -> None:
    """A complete forking evaluation of the RL run ``rl_run`` (trained with ``algorithm``; None: a run recorded
    before ``rl.algorithm`` existed), with its samples."""
    run = experiment / "rl" / "toy" / rl_run
    run.mkdir(parents=True)
    (run / "hf").mkdir()
    (run / "manifest.json").write_text(json.dumps(asdict(Manifest(
        stage="rl", variant="sft", status="complete", config={"rl": {"algorithm": algorithm} if algorithm else {}}))))
    _write_samples(experiment / evaluation, samples)
    (experiment / evaluation / "manifest.json").write_text(json.dumps(asdict(Manifest(
        stage="eval", variant="sft", status="complete",
        details={"model": {"path": str(run / "hf"), "upstream_run": str(run)}}))))


def test_the_points_of_an_rl_algorithm_sweep_are_methods_of_their_own(tmp_path):
    # Issue 42's comparison runs DAPO, KL-Cov, ... from the same SFT runs: their RL evaluations share the variant
    # `sft`, and --pool-seeds and --fork pooled all of them into one row.
    place, round_ = (forking.solve(forking.Problem(45, 38), name) for name in ("place", "round"))
    _write_rl_evaluation(tmp_path, "eval/toy/rl/sft-1a2b3c4d/toy_fork_carry", "sft-11111111", None, [(place, 0)])
    _write_rl_evaluation(tmp_path, "eval/toy/rl/sft-2b3c4d5e/toy_fork_carry", "sft-22222222", "dapo", [(place, 0)])
    _write_rl_evaluation(tmp_path, "eval/toy/rl/sft-3c4d5e6f/toy_fork_carry", "sft-33333333", "kl_cov", [(round_, 1)])
    _, _, *rows = toy_styles.table(tmp_path, None, None, pool_seeds=True).splitlines()
    assert rows == ["| toy | rl | sft | toy_fork_carry | 2 | 0.000 | 0 / — | 1.00 / 0.00 | 0 / — | 0 / — |",
                    "| toy | rl | sft+kl_cov | toy_fork_carry | 1 | 1.000 | 0 / — | 0 / — | 1.00 / 1.00 | 0 / — |"]
    assert "| toy | rl | sft-3c4d5e6f+kl_cov | toy_fork_carry |" in toy_styles.table(tmp_path, None, None)
    measured = []

    def measure(model_path):
        measured.append(model_path)
        return {"fork_entropy_nats": 0.1, **{f"fork_{f}_p_{s}": 0.5 for f, s in
                                              (("small", "column"), ("carry", "round"), ("plain", "place"))}}

    _, _, *rows = toy_styles.fork_table(tmp_path, None, measure).splitlines()
    assert [row.split(" | ")[2:4] for row in rows] == [["sft", "2"], ["sft+kl_cov", "1"]]
    assert len(measured) == 3


def test_fork_table_finds_the_models_of_a_run_made_in_another_checkout(tmp_path, monkeypatch):
    # Issue 43: manifests hold the model paths relative to the checkout the run was made in (run root `runs`); read
    # from anywhere else they named nothing and the script died in a 30-line traceback.
    experiment = tmp_path / "their-checkout" / "runs" / "demo"
    sft_model, base_model = experiment / "sft/toy/sft-1a2b3c4d/hf", experiment.parent / "cache/base/00aa/hf"
    for folder in (sft_model, base_model):
        folder.mkdir(parents=True)
    _write_evaluation(experiment / "eval/toy/sft/sft-1a2b3c4d/toy_fork_carry", "runs/demo/sft/toy/sft-1a2b3c4d/hf")
    _write_evaluation(experiment / "eval/toy/sft/base-00aa11bb/toy_fork_carry", "runs/cache/base/00aa/hf")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")  # another checkout: no runs/ of its own
    measured = []

    def measure(model_path):
        measured.append(model_path)
        return {"fork_entropy_nats": 1.0, **{f"fork_{f}_p_{s}": 0.5 for f, s in
                                              (("small", "column"), ("carry", "round"), ("plain", "place"))}}

    toy_styles.fork_table(experiment, None, measure)
    assert sorted(measured) == sorted([str(base_model), str(sft_model)])
    # A model folder that is gone is one line naming it and the evaluation that recorded it.
    _write_evaluation(experiment / "eval/toy/rl/sft-22cc33dd/toy_fork_carry", "runs/demo/rl/toy/sft-22cc33dd/hf")
    with pytest.raises(SystemExit, match=r"^eval/toy/rl/sft-22cc33dd/toy_fork_carry: its model "
                                         r"runs/demo/rl/toy/sft-22cc33dd/hf is not under the run root \S+/runs; "
                                         r"pass runs/<experiment> of the run root that holds it$"):
        toy_styles.fork_table(experiment, None, measure)


def test_fork_table_without_a_forking_evaluation_says_so(tmp_path):
    _write_evaluation(tmp_path / "eval/toy/sft/base/toy_add", "/arithmetic")
    with pytest.raises(SystemExit, match="no complete forking evaluation"):
        toy_styles.fork_table(tmp_path, None, lambda path: {})


@pytest.mark.parametrize("position", ["first", "mid"])
def test_the_exact_fork_is_measured_where_the_runs_world_puts_it(monkeypatch, position):
    # Issue 40: --fork measured the first response token even in the world toy.fork_position=mid.
    import common.models
    import toy.entropy

    worlds = []
    monkeypatch.setattr(common.models, "load_causal_lm", lambda path: torch.nn.Identity())
    monkeypatch.setattr(common.models, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(toy.entropy, "fork_distribution", lambda model, tokenizer, toy: worlds.append(toy) or {})
    toy_styles.exact_fork_distribution(3, position)("model")
    assert [(toy.fork_position, toy.fork_entropy_problems) for toy in worlds] == [(position, 3)]
