"""The report's RL readiness section on a fixture grid whose numbers have closed forms: coverage pass@G, the predicted
all-wrong / mixed / all-right shares of groups of G rollouts, and their correlation with the measured RL gain."""
from __future__ import annotations

import json
from math import comb

import pytest

from common.config import compose
from common.grid import experiment_grid
from common.paths import RL_DISCARDED_GROUPS, eval_run
from eval.intervals import cluster_spearman
from report.collect import collect_runs
from report.sections import readiness

pytestmark = pytest.mark.integration

N, G, PROBLEMS = 8, 4, 4
BEFORE = {"base": [4, 4, 4, 4], "sft": [8, 8, 0, 0], "eksft": [2, 2, 2, 2]}
"""Table 1 correct counts of each problem (every seed and benchmark)."""
AFTER = {"base": lambda seed: [5] * PROBLEMS, "sft": lambda seed: BEFORE["sft"],
         "eksft": lambda seed: [3 + seed] * PROBLEMS}
"""Table 2 correct counts per seed: RL gains of +12.5 (base), 0 (sft) and +12.5 / +25 (eksft, seeds 0 / 1)."""


def all_wrong(c: int) -> float:
    return comb(N - c, G) / comb(N, G)


def all_right(c: int) -> float:
    return comb(c, G) / comb(N, G)


def build(root, phases=("sft", "rl"), n=N):
    cfg = compose([f"experiment.run_root={root}", "experiment.methods=[sft,eksft]", "experiment.seeds=[0,1]",
                   f"rl.rollout_n={G}", "report.analysis.run=[]", "logging.progress=false"])
    grid = experiment_grid(cfg)
    (model,) = grid.models
    for seed, scfg in model.seeds.items():
        for variant, a in model.arms[seed].items():
            for phase in phases:
                counts = BEFORE[variant] if phase == "sft" else AFTER[variant](seed)
                for bench in ("toy_add", "toy_mixed"):
                    folder = eval_run(scfg, phase, variant, bench, a.model(phase)).directory
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / "metrics.json").write_text(json.dumps(
                        {"n": n, "correct_counts": {f"p{i}": min(c, n) for i, c in enumerate(counts)}}))
        log = [{"step": 1, RL_DISCARDED_GROUPS: 3 * cfg.rl.train_batch_size}, {"step": 2}]
        model.arms[seed]["sft"].rl.mkdir(parents=True, exist_ok=True)
        (model.arms[seed]["sft"].rl / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    return grid, collect_runs(grid, {})


def test_coverage_and_predicted_group_shares_per_start(tmp_path):
    section = readiness.render(*build(tmp_path))
    levels = section.metrics["readiness"]
    for variant, label in (("base", "Base"), ("sft", "SFT"), ("eksft", "EKSFT (paper eq.)")):
        counts = BEFORE[variant]
        wrong = 100 * sum(map(all_wrong, counts)) / PROBLEMS
        right = 100 * sum(map(all_right, counts)) / PROBLEMS
        found = levels[f"Toy-Qwen3-0.8M/{label}"]
        assert found["coverage"] == pytest.approx(100 - wrong)
        assert found["all_wrong"] == pytest.approx(wrong) and found["all_right"] == pytest.approx(right)
        assert found["mixed"] == pytest.approx(100 - wrong - right)
    assert levels["Toy-Qwen3-0.8M/SFT"]["mixed"] == 0 and levels["Toy-Qwen3-0.8M/SFT"]["coverage"] == 50
    assert levels["Toy-Qwen3-0.8M/SFT"]["coverage_vs_base"][0] == pytest.approx(50 - 100 * (1 - 1 / 70))
    assert "coverage_vs_base" not in levels["Toy-Qwen3-0.8M/Base"]
    assert levels["Toy-Qwen3-0.8M/SFT"]["groups_kept"] == pytest.approx(100 * 2 / 5)  # 2 of 2 + 3 batches
    assert levels["Toy-Qwen3-0.8M/EKSFT (paper eq.)"]["rl_gain"] == pytest.approx(18.75)
    assert "| Toy-Qwen3-0.8M | SFT | 2 | 50.0 ⟨50.0, 50.0⟩ | −48.6 [−86.1, −11.1] ⟨−48.6, −48.6⟩ | 50.0 | 0.0 | 50.0 " \
           "| 40.0 | +0.0 |" in section.lines


def test_the_mixed_share_is_correlated_with_the_rl_gain_over_arms_and_seeds(tmp_path):
    section = readiness.render(*build(tmp_path))
    metrics = section.metrics["readiness"]
    mixed = {variant: 100 * (1 - (sum(map(all_wrong, c)) + sum(map(all_right, c))) / PROBLEMS)
             for variant, c in BEFORE.items()}
    gains = {"base": [12.5, 12.5], "sft": [0.0, 0.0], "eksft": [12.5, 25.0]}
    expected = cluster_spearman([mixed[v] for v in gains for _ in (0, 1)], [g for v in gains for g in gains[v]],
                                [v for v in gains for _ in (0, 1)])
    assert metrics["points"] == 6 and metrics["arms"] == 3
    assert metrics["spearman_mixed"] == pytest.approx(expected.estimate.mean)
    assert metrics["spearman_mixed 95% arms"] == pytest.approx([expected.estimate.low, expected.estimate.high])
    # the points the correlation is computed over, plotted (one figure per model)
    assert list(section.files) == ["plots/readiness_Toy-Qwen3-0.8M.png"]
    (plot,) = tmp_path.glob("*/report/plots/readiness_Toy-Qwen3-0.8M.png")
    assert plot.stat().st_size > 0
    assert "![RL readiness, Toy-Qwen3-0.8M](plots/readiness_Toy-Qwen3-0.8M.png)" in section.lines


def test_without_rl_evaluations_the_levels_alone_and_with_too_few_samples_skipped(tmp_path):
    section = readiness.render(*build(tmp_path / "sft_only", phases=("sft",)))
    assert "The correlation with the RL gain needs Table 2 (after RL) evaluations." in section.lines
    assert "spearman_mixed" not in section.metrics["readiness"] and not section.files
    section = readiness.render(*build(tmp_path / "few", phases=("sft",), n=2))
    assert section.lines[2].startswith("Skipped: some Table 1 evaluation drew fewer samples per problem than")
