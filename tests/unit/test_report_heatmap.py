"""The (λ_H, λ_KL) sweep heatmap: one grid cell per sweep point, Avg of each metric."""
from __future__ import annotations

from report.sections.sweep import sweep_heatmaps
from report.sweep import Sweep
from report.tables import AVERAGE, Block, ResultTable, Row


class _Outputs:
    """Collects what the report would register as outputs of its run."""

    def __init__(self):
        self.outputs = {}

    def add_output(self, relative: str, description: str) -> None:
        self.outputs[relative] = description


def _grid_table(points):
    rows = [Row(label, label, ours={(AVERAGE, "pass@1"): value,
                                   (AVERAGE, "pass@4"): None if value is None else value + 10})
            for label, value in points]
    return ResultTable(caption="t", row_header="lambda_entropy, lambda_kl", columns=[AVERAGE],
                       metrics=["pass@1", "pass@4"], blocks=[Block("m", rows)])


def test_two_field_sweep_gets_one_heatmap_per_metric(tmp_path):
    sweep = Sweep("eksft", ["lambda_entropy", "lambda_kl"], [
        ("eksft_lambda_entropy0_lambda_kl0", (0.0, 0.0)), ("eksft_lambda_entropy0", (0.0, 0.05)),
        ("eksft", (0.05, 0.05))])
    table = _grid_table([("a", 10.0), ("b", 20.0), ("c", None)])
    run_ = _Outputs()
    lines = sweep_heatmaps(sweep, table, "title", "sweep_m_sft_eksft_lambda", tmp_path, run_)
    assert lines[0] == ("![pass@1 heatmap](plots/sweep_m_sft_eksft_lambda_heatmap_pass1.png) "
                        "![pass@4 heatmap](plots/sweep_m_sft_eksft_lambda_heatmap_pass4.png)")
    for relative in run_.outputs:
        assert (tmp_path / relative).stat().st_size > 1000


def test_one_field_sweep_has_no_heatmap(tmp_path):
    sweep = Sweep("eksft", ["rho"], [("eksft_rho0.1", (0.1,)), ("eksft", (0.2,))])
    run_ = _Outputs()
    assert sweep_heatmaps(sweep, _grid_table([("a", 1.0), ("b", 2.0)]), "t", "s", tmp_path, run_) == []
    assert not run_.outputs
