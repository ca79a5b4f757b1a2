"""report.algorithm_comparison: arms of different rl/algorithm points on one table, paired on seeds and problems,
with the primary comparisons Holm-adjusted together (a synthetic run root)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from common.config import ConfigError, compose
from common.grid import experiment_grid
from eval.intervals import holm, no_spread, seed_t_test
from report import algorithm_comparison as comparison
from report.collect import metrics_path

N = 32
BASE_COUNTS = np.array([6, 9, 12, 14, 16, 19])
SHIFT = {"base+dapo": 6, "sft+dapo": 0, "sft+entropy_bonus": 1, "sft+kl_cov": 0, "sft+clip_cov": -2,
         "eksft+dapo": -4, "eksft_official_aligned+dapo": 8}
"""Correct counts added to every problem of an arm (relative to SFT + DAPO)."""
WOBBLE = {"base+dapo": 1, "sft+dapo": 0, "sft+entropy_bonus": 2, "sft+kl_cov": 0, "sft+clip_cov": -1,
          "eksft+dapo": 3, "eksft_official_aligned+dapo": 1}
"""Counts added per seed index (seed s adds s × wobble): the per-seed differences differ, so the t-test has a p."""
OVERRIDES = ["experiment=forking", "experiment.methods=[sft,eksft,eksft_official_aligned]",
             "rl.ppo_mini_batch_size=4", "rl.micro_batch_size_per_gpu=32"]


SOLVED_HARD = {"base+dapo", "eksft_official_aligned+dapo"}
"""The arms that solve a seventh problem once in 32 samples (a pass@32 the others lack)."""


def counts(arm: str, seed: int) -> np.ndarray:
    return np.append(BASE_COUNTS + SHIFT[arm] + seed * WOBBLE[arm], int(arm in SOLVED_HARD))


def write_run_root(root, skip: tuple[str, int] | None = None) -> dict[str, set]:
    """The phase-rl metrics.json of every default arm, seed and benchmark, where each point's report reads them;
    returns each arm's evaluation folders."""
    folders: dict[str, set] = {}
    for spec in map(comparison.parse_arm, comparison.DEFAULT_ARMS):
        cfg = compose([f"experiment.run_root={root}", *OVERRIDES, f"rl/algorithm={spec.algorithm}"])
        model = experiment_grid(cfg, sweep_points=False).models[0]
        label = {"base": "base", "sft": "sft", "eksft": "eksft"}.get(spec.start) or \
            next(v for v in model.variants if v.startswith("eksft_compat"))
        for seed, scfg in model.seeds.items():
            if skip == (spec.name, seed):
                continue
            for bench in ("toy_fork_small", "toy_fork_carry", "toy_fork_plain"):
                path = metrics_path(scfg, "rl", model.arms[seed][label], bench)
                path.parent.mkdir(parents=True, exist_ok=True)
                doc = {"n": N, "correct_counts": {f"p{i}": int(c) for i, c in enumerate(counts(spec.name, seed))}}
                path.write_text(json.dumps(doc))
                folders.setdefault(spec.name, set()).add(path.parent.parent)
    return folders


def compare(root, **kwargs) -> comparison.Comparison:
    return comparison.compare_arms([f"experiment.run_root={root}", *OVERRIDES],
                                   [comparison.parse_arm(a) for a in comparison.DEFAULT_ARMS],
                                   comparison.parse_arm(comparison.DEFAULT_REFERENCE), **kwargs)


def test_twelve_primary_comparisons_paired_across_points_and_holm_adjusted_together(tmp_path):
    folders = write_run_root(tmp_path)
    assert len(set.union(*folders.values())) == 3 * len(comparison.DEFAULT_ARMS)  # every arm, seed: its own folder
    result = compare(tmp_path)
    (block,) = result.table.blocks
    rows = {row.variant: row for row in block.rows}
    assert list(rows) == list(comparison.DEFAULT_ARMS)
    assert rows["sft+kl_cov"].label == "SFT + KL-Cov" and rows["eksft+dapo"].label == "EKSFT (paper eq.) + DAPO"
    assert result.table.metrics == ["pass@1", "pass@32"] and result.endpoints == ["Avg pass@1", "Avg pass@32"]
    p1 = ("Avg", "pass@1")
    for arm, row in rows.items():
        # final level: mean over seeds, benchmarks and problems of c/n
        expected_level = 100 * np.mean([counts(arm, s).mean() / N for s in range(3)])
        assert row.ours[p1] == pytest.approx(expected_level)
        if arm == comparison.DEFAULT_REFERENCE:
            assert not row.delta and not row.primary
            continue
        per_seed = [100 * (counts(arm, s) - counts("sft+dapo", s)).mean() / N for s in range(3)]
        assert row.delta[p1].mean == pytest.approx(np.mean(per_seed))
        assert row.delta_p[p1] == pytest.approx(seed_t_test(per_seed), nan_ok=True)
        assert set(row.primary) == {p1, ("Avg", "pass@32")}
    assert rows["sft+kl_cov"].delta[p1].mean == 0 and no_spread(rows["sft+kl_cov"].delta_p[p1])  # SFT + DAPO's counts
    assert rows["eksft_official_aligned+dapo"].delta_seed[p1].low > 0
    family = [(row, cell) for row in block.rows for cell in row.primary]
    assert len(family) == 12 and result.table.primary_family == 12
    p_values = [row.delta_p[cell] for row, cell in family]
    adjusted = holm([1.0 if no_spread(p) else p for p in p_values])  # no spread counts as p = 1, and stays "no spread"
    expected = [p if no_spread(p) else q for p, q in zip(p_values, adjusted)]
    assert [row.primary[cell] for row, cell in family] == pytest.approx(expected, nan_ok=True)
    assert result.missing == []


def test_the_printout_lists_the_levels_and_the_primary_comparisons(tmp_path, capsys):
    write_run_root(tmp_path)
    comparison.main([f"experiment.run_root={tmp_path}", *OVERRIDES])
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if line.startswith("| Toy-Qwen3-0.8M | ") and "| Avg pass@" in line]
    assert len(listed) == 12
    assert "| SFT + KL-Cov | Avg pass@1 | +0.0 [+0.0, +0.0] ⟨+0.0, +0.0⟩ | n/a (no spread) |" in out
    assert "| SFT + DAPO |" in out and "Missing evaluations" not in out


def test_a_missing_seed_is_named_and_the_comparison_uses_the_shared_seeds(tmp_path):
    write_run_root(tmp_path, skip=("sft+clip_cov", 2))
    result = compare(tmp_path)
    clip_cov = next(row for row in result.table.blocks[0].rows if row.variant == "sft+clip_cov")
    assert any("Clip-Cov" in item and "seed 2" in item for item in result.missing)
    assert clip_cov.per_seed[("Avg", "pass@1")].keys() == {0, 1}


def test_an_arm_without_evaluations_is_listed_as_missing(tmp_path):
    result = compare(tmp_path / "empty")
    assert len(result.missing) == 3 * len(comparison.DEFAULT_ARMS)
    assert all(row.ours[("Avg", "pass@1")] is None for row in result.table.blocks[0].rows)


@pytest.mark.parametrize("arm, message", [("sft+ppo", "choices: dapo, grpo"), ("kl_cov", "<start>+<algorithm>")])
def test_a_bad_arm_is_refused_naming_it(arm, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        comparison.parse_arm(arm)


def test_an_unknown_start_and_an_rl_algorithm_override_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="'dft' is neither base nor an experiment.methods entry"):
        comparison.compare_arms(OVERRIDES, [comparison.ArmSpec("dft", "dapo")], comparison.ArmSpec("dft", "dapo"))
    with pytest.raises(ConfigError, match="overrides set rl/algorithm"):
        comparison.compare_arms([*OVERRIDES, "rl/algorithm=gspo"], [comparison.ArmSpec("sft", "dapo")],
                                comparison.ArmSpec("sft", "dapo"))
    assert compose(OVERRIDES).rl.algorithm == "dapo"
