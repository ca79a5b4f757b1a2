"""Tables: bold/underline placement, Markdown, CSV and LaTeX layout."""
from __future__ import annotations

import pytest

import math

from eval.intervals import Estimate
from report.tables import (
    Block,
    Gain,
    ResultTable,
    Row,
    attach_paper_values,
    fill_estimates,
    interval_marks,
    load_paper_tables,
    mark_primary,
    primary_gains,
    primary_note,
    rank_marks,
    rl_gains,
    to_csv,
    to_latex,
    to_markdown,
    unjudged_note,
)

def test_rank_marks_dense_with_ties_and_missing():
    assert rank_marks([25.6, 46.3, 36.5, 45.3, 40.9, 45.7]) == ["", "best", "", "", "", "second"]
    assert rank_marks([60.0, 73.3, 70.0, 73.3, None, 73.3]) == ["", "best", "second", "best", "", "best"]
    assert rank_marks([1.04, 1.0, 0.5]) == ["best", "best", "second"]  # ranked on the printed value
    assert rank_marks([None, None]) == ["", ""]
    assert rank_marks([None, 45.0]) == ["", ""]  # one value: nothing to rank (issue 43: a one-row table all bold)


def test_interval_marks_only_where_intervals_separate():
    def e(mean, low, high):
        return Estimate(mean, low, high)

    # best above everyone, second above the rest: bold and underline
    assert interval_marks([e(10, 8, 12), e(30, 28, 32), e(20, 18, 22)]) == ["", "best", "second"]
    # best separated, second overlaps the third: the second says n.s.
    assert interval_marks([e(10, 8, 19), e(30, 28, 32), e(20, 18, 22)]) == ["", "best", "n.s."]
    # best overlaps the second: n.s. and nothing marked below it
    assert interval_marks([e(10, 8, 12), e(30, 19, 32), e(20, 18, 22)]) == ["", "n.s.", ""]
    # a tie on the printed value is never separated; missing cells are skipped
    assert interval_marks([e(30, 30, 30), None, e(30.04, 30.04, 30.04)]) == ["n.s.", "", "n.s."]
    assert interval_marks([None, e(5, 5, 5), e(2, 1, 3)]) == ["", "best", "second"]
    # one value in the column: nothing to rank, no mark (issue 43: Table 2 with one row had every cell bold)
    assert interval_marks([None, e(5, 5, 5)]) == ["", ""]
    assert interval_marks([e(5, 4, 6)]) == [""]


def _doc(*counts: int, n: int = 32) -> dict:
    return {"n": n, "correct_counts": {f"p{i}": c for i, c in enumerate(counts)}}


def _constructed_table() -> ResultTable:
    """One benchmark (AIME), n = 32, two problems, one seed; DFT not evaluated."""
    table = ResultTable(caption="t", row_header="Method", columns=["AIME", "Avg"], metrics=["pass@1", "pass@32"],
                        blocks=[])
    rows = [Row("Base", "base", evaluations={"AIME": {0: _doc(0, 8)}}),
            Row("SFT", "sft", evaluations={"AIME": {0: _doc(32, 24)}}),
            Row("EKSFT (paper eq.)", "eksft", evaluations={"AIME": {0: _doc(16, 16)}}),
            Row("DFT", "dft")]
    table.blocks.append(Block("Qwen3-4B", rows))
    fill_estimates(table)
    return table


def test_estimates_of_the_constructed_table():
    rows = {row.label: row for row in _constructed_table().blocks[0].rows}
    # pass@1 per problem: SFT (1, 3/4); two problems resampled: the interval runs from the smaller to the larger.
    assert rows["SFT"].intervals[("AIME", "pass@1")] == Estimate(87.5, 75.0, 100.0)
    # pass@32 with n = 32 is 1 for any correct sample: Base (0, 1).
    assert rows["Base"].intervals[("AIME", "pass@32")] == Estimate(50.0, 0.0, 100.0)
    assert rows["Base"].ours[("Avg", "pass@1")] == 12.5 and rows["Base"].per_seed[("AIME", "pass@1")] == {0: 12.5}
    # Paired: EKSFT − SFT per problem = (1/2 − 1, 1/2 − 3/4) = (−50, −25) points.
    assert rows["EKSFT (paper eq.)"].delta[("AIME", "pass@1")] == Estimate(-37.5, -50.0, -25.0)
    assert not rows["SFT"].delta and not rows["DFT"].delta and rows["DFT"].ours[("AIME", "pass@1")] is None


def test_fill_estimates_uses_the_unbiased_pass_at_k():
    table = ResultTable(caption="t", row_header="Method", columns=["A", "Avg"], metrics=["pass@1", "pass@2"],
                        blocks=[Block("m", [Row("x", "x", evaluations={"A": {0: _doc(1, 0, n=4)}})])])
    fill_estimates(table)
    row = table.blocks[0].rows[0]
    assert row.ours[("A", "pass@1")] == pytest.approx(12.5)
    assert row.ours[("A", "pass@2")] == pytest.approx(25.0)  # (1 - C(3,2)/C(4,2)) / 2


def test_markdown_marks_and_intervals():
    table = _constructed_table()
    attach_paper_values(table, "sft", load_paper_tables())
    lines = to_markdown(table).splitlines()
    assert lines[0] == "| Method | AIME pass@1 | AIME pass@32 | Avg pass@1 | Avg pass@32 |"
    assert lines[2].startswith("| ***Qwen3-4B***")
    assert lines[3] == ("| Base | 12.5 [0.0, 25.0] (25.6) | 50.0 [0.0, 100.0] (60.0) | 12.5 [0.0, 25.0] (29.7) "
                        "| 50.0 [0.0, 100.0] (55.8) |")
    # One seed: no seed-level interval, and no primary comparison was declared, so every Δ is exploratory.
    assert lines[4] == ("| <sub>Δ vs SFT</sub> | <sub>−75.0 [−100.0, −50.0] expl.</sub> | "
                        "<sub>−50.0 [−100.0, +0.0] expl.</sub> | <sub>−75.0 [−100.0, −50.0] expl.</sub> | "
                        "<sub>−50.0 [−100.0, +0.0] expl.</sub> |")
    # pass@1: SFT's [75, 100] lies above EKSFT's [50, 50], which lies above Base's [0, 25]: bold, underline.
    # pass@32: SFT and EKSFT tie at 100: n.s.
    assert lines[5] == ("| SFT | **87.5** [75.0, 100.0] (46.3) | 100.0 [100.0, 100.0] n.s. (73.3) "
                        "| **87.5** [75.0, 100.0] (41.0) | 100.0 [100.0, 100.0] n.s. (63.3) |")
    assert lines[6] == ("| EKSFT (paper eq.) | <u>50.0</u> [50.0, 50.0] (45.7) | 100.0 [100.0, 100.0] n.s. (73.3) "
                        "| <u>50.0</u> [50.0, 50.0] (41.7) | 100.0 [100.0, 100.0] n.s. (68.4) |")
    assert lines[7].startswith("| <sub>Δ vs SFT</sub> | <sub>−37.5 [−50.0, −25.0] expl.</sub> | "
                               "<sub>+0.0 [+0.0, +0.0] expl.</sub>")
    assert lines[8] == "| DFT | – (36.5) | – (70.0) | – (35.5) | – (59.7) |" and len(lines) == 9


def test_latex_and_csv_layout():
    table = _constructed_table()
    attach_paper_values(table, "sft", load_paper_tables())
    latex = to_latex(table)
    assert "\\begin{tabular}{l|cc | cc}" in latex
    assert ("SFT & \\textbf{87.5} {\\scriptsize [75.0, 100.0]} {\\scriptsize(46.3)} & "
            "100.0\\textsuperscript{n.s.} {\\scriptsize [100.0, 100.0]} {\\scriptsize(73.3)}") in latex
    assert "EKSFT (paper eq.) & \\underline{50.0} {\\scriptsize [50.0, 50.0]} {\\scriptsize(45.7)}" in latex
    assert "{\\scriptsize\\quad $\\Delta$ vs SFT} & {\\scriptsize $-$37.5 [$-$50.0, $-$25.0] expl.}" in latex
    rows = to_csv(table).splitlines()
    assert rows[0] == ("model,method,variant,column,metric,mean,ci_low,ci_high,mark,delta_reference,delta,delta_low,"
                       "delta_high,paper,num_seeds,seed_t_low,seed_t_high,delta_seed_t_low,delta_seed_t_high,"
                       "delta_p_t,delta_role,delta_p_holm,seed 0")
    assert rows[1] == ("Qwen3-4B,Base,base,AIME,pass@1,12.5000,0.0000,25.0000,,SFT,-75.0000,-100.0000,-50.0000,"
                       "25.6000,1,,,,,,exploratory,,12.5000")
    assert "Qwen3-4B,SFT,sft,AIME,pass@32,100.0000,100.0000,100.0000,n.s.,,,,,73.3000,1,,,,,,,,100.0000" in rows
    assert "Qwen3-4B,DFT,dft,Avg,pass@32,,,,,,,,,59.7000,0,,,,,,,," in rows
    assert len(rows) == 1 + 4 * 4


def test_paper_values_attach_by_variant_to_both_eksft_arms():
    table = ResultTable(caption="t", row_header="Method", columns=["AIME", "Avg"], metrics=["pass@1", "pass@32"],
                        blocks=[Block("Qwen3-4B", [Row("any title", "eksft"), Row("other", "eksft_compatofficial_code"),
                                                   Row("EKSFT (Ours)", "eksft_rho0.1")])])
    attach_paper_values(table, "sft", load_paper_tables())
    paper_eq, official, sweep_point = table.blocks[0].rows
    assert paper_eq.paper[("AIME", "pass@1")] == official.paper[("AIME", "pass@1")] == 45.7
    assert not sweep_point.paper  # a sweep point is not the paper's configuration


def test_rl_gain_is_paired_on_the_arm_and_compared_with_the_reference_gain():
    # One benchmark, two problems, n = 4, two seeds; each seed's two problems are alike, so only seeds vary.
    before = ResultTable(caption="1", row_header="Method", columns=["A", "Avg"], metrics=["pass@1"], blocks=[Block(
        "m", [Row("SFT", "sft", evaluations={"A": {0: _doc(2, 2, n=4), 1: _doc(1, 1, n=4)}}),
              Row("EKSFT", "eksft", evaluations={"A": {0: _doc(0, 0, n=4), 1: _doc(0, 0, n=4)}}),
              Row("DFT", "dft", evaluations={"A": {0: _doc(4, 4, n=4)}})])])
    after = ResultTable(caption="2", row_header="Method(+DAPO)", columns=["A", "Avg"], metrics=["pass@1"],
                        blocks=[Block("m", [
                            Row("SFT", "sft", evaluations={"A": {0: _doc(3, 3, n=4), 1: _doc(1, 1, n=4)}}),
                            Row("EKSFT", "eksft", evaluations={"A": {0: _doc(4, 4, n=4), 1: _doc(2, 2, n=4)}})])])
    (title, gains), = rl_gains(before, after, "pass@1")
    assert title == "m" and [gain.variant for gain in gains] == ["sft", "eksft"]
    sft, eksft = gains
    # SFT: seed 0 +25, seed 1 +0. Two seeds resampled 2000 times: the interval spans both seeds' values.
    assert sft.per_seed == {0: 25.0, 1: 0.0} and sft.gain == Estimate(12.5, 0.0, 25.0)
    assert sft.versus_reference is None
    # EKSFT: +100, +50; minus SFT's gain of the same seed: +75, +50.
    assert eksft.per_seed == {0: 100.0, 1: 50.0} and eksft.gain == Estimate(75.0, 50.0, 100.0)
    assert eksft.versus_reference == Estimate(62.5, 50.0, 75.0)
    # Seed level, df = 1 (t_{0.975, 1} = 12.706): gains 100, 50 -> 75 ± 12.706 · 35.355 / sqrt(2) = 75 ± 317.655;
    # differences to SFT's 75, 50 -> t = 62.5 / 12.5 = 5, p = 1 − 2 atan(5) / π.
    assert eksft.seed_interval == Estimate(75.0, pytest.approx(75 - 317.655, abs=1e-3),
                                           pytest.approx(75 + 317.655, abs=1e-3))
    assert eksft.versus_p == pytest.approx(1 - 2 * math.atan(5) / math.pi)
    assert sft.versus_seed is None and sft.versus_p is None


def test_rl_arms_are_compared_with_rl_from_the_base_model_after_rl():
    # One benchmark, two problems, n = 4, seeds 0 and 1. After RL: Base + DAPO 50, 75; SFT 75, 25; EKSFT 100, 50.
    def seeds(first, second):
        return {"A": {0: _doc(first, first, n=4), 1: _doc(second, second, n=4)}}

    rows = [("Base", "base", seeds(1, 1)), ("SFT", "sft", seeds(2, 1)), ("EKSFT", "eksft", seeds(0, 0))]
    before = ResultTable(caption="1", row_header="Method", columns=["A", "Avg"], metrics=["pass@1"],
                         blocks=[Block("m", [Row(label, variant, evaluations=ev) for label, variant, ev in rows])])
    rows = [("Base", "base", seeds(2, 3)), ("SFT", "sft", seeds(3, 1)), ("EKSFT", "eksft", seeds(4, 2))]
    after = ResultTable(caption="2", row_header="Method(+DAPO)", columns=["A", "Avg"], metrics=["pass@1"],
                        blocks=[Block("m", [Row(label, variant, evaluations=ev) for label, variant, ev in rows])])
    (_, (base, sft, eksft)), = rl_gains(before, after, "pass@1")
    assert base.versus_control is None and base.versus_control_seed is None  # the control itself
    # EKSFT − Base + DAPO per seed: +50, −25 -> +12.5; the two seeds resampled span both values. Seed level
    # (df = 1): sd 53.033, t = 12.5 / 37.5 = 1/3, p = 1 − 2 atan(1/3) / π; 12.5 ± 12.7062 · 37.5.
    assert eksft.versus_control == Estimate(12.5, -25.0, 50.0)
    assert eksft.versus_control_seed == Estimate(12.5, pytest.approx(12.5 - 476.483, abs=1e-3),
                                                 pytest.approx(12.5 + 476.483, abs=1e-3))
    assert eksft.versus_control_p == pytest.approx(1 - 2 * math.atan(1 / 3) / math.pi)
    assert sft.versus_control == Estimate(-12.5, -50.0, 25.0)  # +25, −50
    # Without a Base row in Table 2 (experiment.rl_from_base=false) there is no control.
    after.blocks[0].rows = after.blocks[0].rows[1:]
    (_, (sft, eksft)), = rl_gains(before, after, "pass@1")
    assert sft.versus_control is None and eksft.versus_control is None


def _three_seed_table() -> ResultTable:
    """One benchmark, one problem per seed, n = 4, seeds 0, 1, 2: SFT 25, 50, 75; X 50, 100, 100 (Δ +25, +50, +25);
    Y 25, 75, 100 (Δ 0, +25, +25); Base 0, 0, 0."""
    def seeds(*counts):
        return {seed: _doc(count, n=4) for seed, count in enumerate(counts)}

    table = ResultTable(caption="t", row_header="Method", columns=["A", "Avg"], metrics=["pass@1"], blocks=[Block(
        "m", [Row("Base", "base", evaluations={"A": seeds(0, 0, 0)}),
              Row("SFT", "sft", evaluations={"A": seeds(1, 2, 3)}),
              Row("X", "x", evaluations={"A": seeds(2, 4, 4)}), Row("Y", "y", evaluations={"A": seeds(1, 3, 4)})])])
    fill_estimates(table)
    return table


def test_primary_comparisons_are_holm_adjusted_and_the_rest_exploratory():
    table = _three_seed_table()
    base, sft, x, y = table.blocks[0].rows
    # X: Δ per seed +25, +50, +25: mean 33.33, sd 14.434, t = 33.33 / (14.434 / sqrt 3) = 4, df 2:
    # p = 1 − t / sqrt(2 + t²) = 1 − 4 / sqrt 18; seed level 33.33 ± 4.302653 · 14.434 / sqrt 3 = 33.33 ± 35.856.
    # Y: Δ 0, +25, +25: t = 2, p = 1 − 2 / sqrt 6.
    p_x, p_y = 1 - 4 / math.sqrt(18), 1 - 2 / math.sqrt(6)
    assert x.delta_p[("Avg", "pass@1")] == pytest.approx(p_x) and y.delta_p[("Avg", "pass@1")] == pytest.approx(p_y)
    assert x.delta_seed[("Avg", "pass@1")] == Estimate(pytest.approx(100 / 3),
                                                       pytest.approx(100 / 3 - 35.8555, abs=1e-3),
                                                       pytest.approx(100 / 3 + 35.8555, abs=1e-3))
    assert sft.seed_intervals[("A", "pass@1")] == Estimate(50.0, pytest.approx(50 - 62.1034, abs=1e-3),
                                                           pytest.approx(50 + 62.1034, abs=1e-3))  # sd 25
    absent = mark_primary(table, ["Avg pass@1", "Avg pass@32"], {"x", "y"})
    assert absent == ["Avg pass@32"] and table.primary_family == 2
    # Holm over the two: 0.0572 · 2 = 0.1144 first, then max(0.1144, 0.1835 · 1).
    assert x.primary == {("Avg", "pass@1"): pytest.approx(2 * p_x)}
    assert y.primary == {("Avg", "pass@1"): pytest.approx(p_y)}
    assert not base.primary and not sft.primary  # Base is not among the arms; SFT has no Δ
    lines = to_markdown(table).splitlines()
    assert lines[lines.index(next(line for line in lines if line.startswith("| X |"))) + 1] == (
        "| <sub>Δ vs SFT</sub> | <sub>+33.3 [+25.0, +50.0] ⟨−2.5, +69.2⟩ expl.</sub> | "
        "<sub>+33.3 [+25.0, +50.0] ⟨−2.5, +69.2⟩ p(Holm) 0.114</sub> |")
    assert "| SFT | 50.0 [25.0, 75.0] ⟨−12.1, 112.1⟩ | 50.0 [25.0, 75.0] ⟨−12.1, 112.1⟩ |" in lines
    assert "{\\scriptsize +33.3 [+25.0, +50.0] $\\langle$$-$2.5, +69.2$\\rangle$ p(Holm) 0.114}" in to_latex(table)
    csv_rows = to_csv(table).splitlines()
    x_avg = next(row for row in csv_rows if row.startswith("m,X,x,Avg,pass@1,")).split(",")
    header = csv_rows[0].split(",")
    assert x_avg[header.index("delta_role")] == "primary"
    assert float(x_avg[header.index("delta_p_holm")]) == pytest.approx(2 * p_x, rel=1e-5)
    assert next(row for row in csv_rows if row.startswith("m,X,x,A,pass@1,")).split(",")[header.index("delta_role")] \
        == "exploratory"
    note = primary_note(table, "report.primary_endpoints.sft", ["Avg pass@1", "Avg pass@32"], absent)
    assert "2, of which 2 with a p-value" in note and "p(Holm) ≤ 0.05: none." in note
    assert note.endswith("Declared endpoints this table has no cell for: Avg pass@32.")


def test_primary_rl_gains_are_adjusted_together():
    def gain(label, versus_p):
        return Gain(label, label.lower(), Estimate(1, 0, 2), Estimate(1, 0, 2), {}, versus_p=versus_p)

    by_metric = {"pass@1": [("m", [gain("SFT", None), gain("X", 0.01), gain("Y", 0.04), gain("Z", 0.001)])],
                 "pass@32": [("m", [gain("X", 0.001)])]}
    # Arms X and Y, endpoint Avg pass@1: Z is not a primary arm and pass@32 not a primary endpoint.
    assert primary_gains(by_metric, ["Avg pass@1"], {"x", "y"}) == {("m", "X", "pass@1"): pytest.approx(0.02),
                                                                   ("m", "Y", "pass@1"): pytest.approx(0.04)}
    assert primary_gains(by_metric, [], {"x", "y"}) == {}


def test_unjudged_note_counts_per_table():
    table = ResultTable(caption="t", row_header="Method", columns=["A", "Avg"], metrics=["pass@1"], blocks=[Block(
        "m", [Row("SFT", "sft", evaluations={"A": {0: {**_doc(1, 2, n=4), "time_limited_samples": 1,
                                                         "rejudged_samples": 3},
                                                     1: {**_doc(1, 2, n=4), "time_limited_samples": 0,
                                                         "rejudged_samples": 0}}})])])
    assert unjudged_note(table).endswith("scored 0 above): 1 of 16; 3 re-judged. By evaluation: m / SFT / A / seed 0: "
                                         "1 of 8.")

