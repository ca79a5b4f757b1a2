"""The report of an RL algorithm other than DAPO: Table 2's header names it and the report has its own folder."""
from __future__ import annotations

import json

import pytest

from common.config import compose
from common.grid import arm_named
from common.paths import eval_run, report_dir
from report import run as report

pytestmark = pytest.mark.integration


def test_table2_is_titled_with_the_algorithm_in_its_own_report_folder(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.stages=[eval_sft,rl,eval_rl,report]",
                   "report.analysis.run=[]", "rl/algorithm=gspo"])
    for phase in ("sft", "rl"):
        for variant in ("base", "sft"):
            for bench in ("toy_add", "toy_mixed"):
                folder = eval_run(cfg, phase, variant, bench, arm_named(cfg, variant).model(phase)).directory
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "metrics.json").write_text(json.dumps({"n": 4, "correct_counts": {"p": 2}}))
    report.run(cfg)
    out = report_dir(cfg)
    assert out.name == "report+gspo"
    assert (out / "table2.md").read_text().startswith("| Method(+GSPO) |")
    assert (out / "table1.md").read_text().startswith("| Method |")
