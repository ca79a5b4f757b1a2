"""The report of experiment=ablations: the paper's ablation tables in its layout beside its numbers, Figure 1, the
pass@k numbers, the extra benchmarks after the Avg column, and the map of the paper's artefacts (metrics files
written by hand)."""
from __future__ import annotations

import csv
import io
import json

import pytest

from common.config import compose
from common.paths import eval_run, report_dir
from common.grid import arm_named, model_configs, variants
from report import run as report

pytestmark = pytest.mark.integration


def _write_metrics(cfg, variant, benchmark, counts: dict[str, int], n: int) -> None:
    folder = eval_run(cfg, "sft", variant, benchmark, arm_named(cfg, variant).sft).directory
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"n": n, "correct_counts": counts}))


def _csv(path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _block(text: str, title: str) -> list[str]:
    """The lines of one model's block of a Markdown table."""
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if f"***{title}***" in line))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("| ***")), len(lines))
    return lines[start:end]


# Per-problem correct counts of 4 samples on two problems, the same on both toy benchmarks. EKSFT (1/2, 1) and
# "w/o entropy" (1/4, 1): pass@1 75.0 and 62.5, paired difference (−1/4, 0) -> −12.5 [−25, 0].
# Base (1, 1) and SFT (3, 0): pass@k Base 25, 50, 75, 100; SFT 37.5, 50, 50, 50 -> Base catches up at k = 2.
TOY_COUNTS = {"base": {"p1": 1, "p2": 1}, "sft": {"p1": 3, "p2": 0}, "eksft": {"p1": 2, "p2": 4},
              "eksft_lambda_entropy0": {"p1": 1, "p2": 4}}


def test_the_toy_ablations_report(tmp_path):
    cfg = compose(["experiment=ablations", f"experiment.run_root={tmp_path}", "report.analysis.run=[]"])
    for variant in variants(cfg):
        for bench in ("toy_add", "toy_mixed"):
            _write_metrics(cfg, variant, bench, TOY_COUNTS.get(variant, {"p1": 2, "p2": 2}), 4)
    assert report.run(cfg).complete
    out = report_dir(cfg)
    table = (out / "tab_ablation.md").read_text()
    assert table.splitlines()[0] == ("| Model | Toy-Add pass@1 | Toy-Add pass@4 | Toy-Mixed pass@1 | "
                                     "Toy-Mixed pass@4 |")  # the paper's layout: no Avg
    lines = table.splitlines()
    row = lines.index(next(line for line in lines if line.startswith("| w/o entropy regularisation (λ_H = 0) |")))
    assert lines[row].startswith("| w/o entropy regularisation (λ_H = 0) | 62.5 [25.0, 100.0] |")
    assert lines[row + 1].startswith("| <sub>Δ vs EKSFT (paper eq.)</sub> | <sub>−12.5 [−25.0, +0.0] expl.</sub> |")
    assert [line.split(" | ")[0] for line in (out / "tab_ratio.md").read_text().splitlines()[3:] if
            not line.startswith("| <sub>")] == ["| 0.0 (SFT)", "| 0.1", "| 0.2 (EKSFT, paper eq.)", "| 0.3", "| 0.4"]
    for stem in ("tab_ablation_masking", "tab_random_mask", "tab_ratio", "tab_ablation"):
        assert {(out / f"{stem}.{suffix}").exists() for suffix in ("md", "csv", "tex")} == {True}
    figure = _csv(out / "fig_intro_Toy-Qwen3-0.8M_toy_add.csv")
    assert [(int(r["k"]), float(r["Base"]), float(r["SFT"])) for r in figure] == [
        (1, 25.0, 37.5), (2, 50.0, 50.0), (3, 75.0, 50.0), (4, 100.0, 50.0)]
    text = (out / "report.md").read_text()
    assert "The ablation tables declare no primary comparison: every Δ is exploratory." in text
    assert "Toy-Qwen3-0.8M, toy_add (n = 4): Base's pass@k is at least SFT's from k = 2 on" in text
    assert "| Table 3 (`tab:ablation`) | ablation of the regularisers | [tab_ablation.md](tab_ablation.md)" in text
    assert "[plots/passk_Toy-Qwen3-0.8M_sft_toy_add.png](plots/passk_Toy-Qwen3-0.8M_sft_toy_add.png)" in text
    passk = _csv(out / "passk_Toy-Qwen3-0.8M_sft_toy_add.csv")
    assert {(r["method"], r["k"], r["pass@k"]) for r in passk} >= {("Base", "4", "100.0000"), ("SFT", "1", "37.5000")}


def test_the_paper_ablations_report_beside_the_papers_numbers_with_the_extra_benchmarks(tmp_path):
    cfg = compose(["experiment=ablations", "profile=paper", f"experiment.run_root={tmp_path}", "report.analysis.run=[]",
                   "eval.benchmarks=[aime24,aime25,amc,hmmt25,aime26,hmmt_feb26]"])
    for mcfg in model_configs(cfg):
        for variant in variants(mcfg):
            for bench in cfg.eval.benchmarks:
                n = mcfg.eval.samples_for(bench)
                # The paper's four: one of two problems right in every sample; the extras: every sample right.
                counts = {"p1": n, "p2": n} if bench in ("aime26", "hmmt_feb26") else {"p1": n, "p2": 0}
                _write_metrics(mcfg, variant, bench, counts, n)
    report.run(cfg)
    out = report_dir(cfg)
    table1 = (out / "table1.md").read_text()
    assert table1.splitlines()[0].endswith("| Avg pass@1 | Avg pass@32 | AIME26 pass@1 | AIME26 pass@32 | "
                                           "HMMT26 pass@1 | HMMT26 pass@32 |")
    cells = {(r["model"], r["variant"], r["column"], r["metric"]): float(r["mean"])
             for r in _csv(out / "table1.csv")}
    assert cells[("Qwen3-4B", "sft", "Avg", "pass@1")] == 50.0  # the extras (100.0) are not averaged
    assert cells[("Qwen3-4B", "sft", "AIME26", "pass@1")] == 100.0
    assert not any("ρ 0.1" in line for line in _block(table1, "Qwen3-8B"))  # a Qwen3-4B-only arm
    ablation = (out / "tab_ablation.md").read_text()
    for model, paper in (("Qwen3-4B", "(45.7)"), ("Qwen3-8B", "(47.2)")):
        (eksft,) = [line for line in _block(ablation, model) if line.startswith("| EKSFT (paper eq.) |")]
        assert eksft.split(" | ")[1] == f"50.0 [0.0, 100.0] n.s. {paper}"  # AIME pass@1: ours, then the paper's
    ratio = (out / "tab_ratio.md").read_text()
    assert ratio.splitlines()[0] == ("| ρ | AIME pass@1 | AIME pass@32 | AIME25 pass@1 | AIME25 pass@32 | AMC pass@1 | "
                                     "AMC pass@32 | AIME26 pass@1 | AIME26 pass@32 | HMMT26 pass@1 | HMMT26 pass@32 |")
    assert "***Qwen3-8B***" not in ratio and "(35.0)" in ratio  # ρ = 0.4, AIME pass@1
    # Figure 1 on the benchmark drawn 320 times only (AIME25), pass@k for every k to 320.
    assert sorted(p.name for p in (out / "plots").glob("fig_intro_*.png")) == [
        "fig_intro_Qwen3-4B_aime25.png", "fig_intro_Qwen3-8B_aime25.png"]
    assert len(_csv(out / "fig_intro_Qwen3-8B_aime25.csv")) == 320
    text = (out / "report.md").read_text()
    assert ("| Figure 2 (`fig:passk`) | pass@k to k = n of every method, Qwen3-8B | "
            "[plots/passk_Qwen3-8B_sft_aime25.png](plots/passk_Qwen3-8B_sft_aime25.png), "
            "[passk_Qwen3-8B_sft_aime25.csv](passk_Qwen3-8B_sft_aime25.csv) |") in text
    assert "| Table 2 (`tab:stage2`) | pass@1 / pass@32 after DAPO | not in this report" in text
