"""The RL-headroom table with the held-out NLL: its Spearman ρ with the RL gain, and RL arms paired with their own
Table 1 rows when Table 2 holds fewer arms (``experiment.rl_methods``)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from report import run as report
from common.config import compose
from common.manifest import stage_run
from common.paths import HELDOUT_NLL, eval_run, heldout_nll_run
from common.grid import arm_named

pytestmark = pytest.mark.integration


def test_headroom_correlates_the_heldout_nll_and_pairs_arms_by_variant(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft,eksft]", "experiment.rl_methods=[eksft]",
                   "experiment.seeds=[0,1]", "report.analysis.run=[]", "data.num_heldout_rows=4"])
    # One problem per benchmark, n = 4: correct counts per (arm, seed); Table 2 has base and eksft only.
    before = {"base": (0, 1), "sft": (2, 3), "eksft": (1, 2)}
    after = {"base": (2, 2), "eksft": (4, 3)}
    nll = {"base": (2.0, 1.9), "sft": (1.0, 1.1), "eksft": (1.5, 1.6)}
    for phase, counts in (("sft", before), ("rl", after)):
        for variant, per_seed in counts.items():
            for seed, count in zip((0, 1), per_seed):
                for bench in ("toy_add", "toy_mixed"):
                    scfg = replace(cfg, seed=seed)
                    folder = eval_run(scfg, phase, variant, bench, arm_named(scfg, variant).model(phase)).directory
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / "metrics.json").write_text(json.dumps({"n": 4, "correct_counts": {"p": count}}))
    for variant, per_seed in nll.items():
        for seed, value in zip((0, 1), per_seed):
            scfg = replace(cfg, seed=seed)
            spec = heldout_nll_run(scfg, variant, arm_named(scfg, variant).sft)
            with stage_run(spec.directory, stage=spec.stage, variant=spec.variant, config=spec.config,
                           announce=lambda message: None) as run:
                run.manifest.metrics = {HELDOUT_NLL: value}
    manifest = report.run(cfg)
    text = (report.report_dir(cfg) / "report.md").read_text()
    # Points (base s0, base s1, eksft s0, eksft s1): pre-RL pass@1 0, 25, 25, 50; after 50, 50, 100, 75;
    # gain 50, 25, 75, 25 (ranks 3, 1.5, 4, 1.5). NLL 2.0, 1.9, 1.5, 1.6 (ranks 4, 3, 1, 2):
    # Σ dx·dy = 1.5·0.5 + 0.5·(−1) + (−1.5)·1.5 + (−0.5)·(−1) = −1.5, Σ dx² = 5, Σ dy² = 4.5: ρ = −1.5 / √22.5.
    headroom = manifest.metrics["headroom"]
    assert headroom["points"] == 4
    assert headroom["spearman_heldout_nll"] == pytest.approx(-1.5 / 22.5 ** 0.5)
    assert "| held-out NLL on a held-out slice of the SFT set | -0.32 [-1.00, +1.00] (4 of 4 pairs) |" in text
    assert "| Toy-Qwen3-0.8M | EKSFT (paper eq.) | 0 | 25.0 | 100.0 (4) | n/a | n/a | 1.500 | +75.0 |" in text
    assert "| Toy-Qwen3-0.8M | Base | 1 | 25.0 | 100.0 (4) | n/a | n/a | 1.900 | +25.0 |" in text
    assert "| SFT |" not in text.split("## RL headroom")[1]  # no RL arm: not a point
