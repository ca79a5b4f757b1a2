"""The BFCL appendix tables (report/bfcl.py) on hand-made per-question verdicts: the live cell pools the live
categories (count-weighted), the irrelevance cell is live_irrelevance's, the paper's numbers sit beside ours."""
from __future__ import annotations

import json

import pytest

from common.config import compose
from common.paths import eval_run
from common.grid import arms, model_configs
from report.bfcl import caption, render, variant_cells


@pytest.fixture
def cfg(tmp_path):
    cfg = compose(["experiment=bfcl", "profile=paper", f"experiment.run_root={tmp_path}",
                   "eval.benchmarks=[live_simple,live_multiple,live_irrelevance]"])
    qwen3_4b = model_configs(cfg)[0]
    verdicts = {"live_simple": [1, 1, 1, 0], "live_multiple": [1, 0], "live_irrelevance": [1, 1]}
    for category, values in verdicts.items():
        folder = eval_run(qwen3_4b, "sft", "base", category, None).directory
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps(
            {"correct_counts": {f"{category}_{i}": v for i, v in enumerate(values)}}))
    return cfg


def test_live_cell_pools_the_live_categories_and_irrelevance_is_its_own(cfg):
    qwen3_4b = model_configs(cfg)[0]
    base, sft = arms(qwen3_4b)[:2]
    cells, counts = variant_cells(qwen3_4b, base)
    assert cells["BFCL live"].mean == pytest.approx(100 * 4 / 6) and counts["BFCL live"] == 6
    assert cells["BFCL live"].low < cells["BFCL live"].mean < cells["BFCL live"].high
    assert (cells["Irrelevance Det."].mean, counts["Irrelevance Det."]) == (100.0, 2)
    assert variant_cells(qwen3_4b, sft)[0] == {"BFCL live": None, "Irrelevance Det.": None}


def test_a_missing_live_category_leaves_the_live_cell_empty(cfg):
    cfg.eval.benchmarks = []  # all of data.benchmarks: live_parallel(_multiple) too, which were not evaluated
    cells, _ = variant_cells(model_configs(cfg)[0], arms(model_configs(cfg)[0])[0])
    assert cells["BFCL live"] is None and cells["Irrelevance Det."].mean == 100.0


def test_tables_show_ours_beside_the_papers_and_the_caption_names_the_irrelevance_set(cfg):
    text, numbers = render(cfg)
    assert "| Base | 66.7 | [" in text and "| 82.4 | 100.0 | [100.0, 100.0] | 75.9 |" in text
    assert "| Method (Qwen3-8B) |" in text and "| Base | – | – | 84.5 | – | – | 76.9 |" in text
    assert "| EKSFT (official code) | – | – | 86.2 |" in text  # the paper's one EKSFT row, against both arms
    assert numbers["Qwen3-4B/Base"]["BFCL live"]["questions"] == 6
    assert "**live_irrelevance**" in caption(cfg) and "live_simple, live_multiple" in caption(cfg)
