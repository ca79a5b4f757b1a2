"""The report stage: tables, plots and report.md from the eval stages' metrics files of an experiment."""
from __future__ import annotations

import json

import pytest

from eval import report
from pipeline.config import compose
from pipeline.manifest import read_manifest
from pipeline.paths import eval_dir, report_dir

pytestmark = pytest.mark.integration


def _write_metrics(cfg, phase, variant, benchmark, counts: dict[str, int], n: int = 4) -> None:
    folder = eval_dir(cfg, phase, variant, benchmark)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"n": n, "correct_counts": counts}))


def test_report_stage_on_the_toy_world(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft,eksft]"])
    for variant, counts in (("base", {"p1": 0, "p2": 4}), ("sft", {"p1": 1, "p2": 4}), ("eksft", {"p1": 2, "p2": 3})):
        for bench in ("toy_add", "toy_mixed"):
            _write_metrics(cfg, "sft", variant, bench, counts)
    manifest = report.run(cfg)
    out = report_dir(cfg)
    table = (out / "table1.md").read_text()
    # Columns named by the config; the second metric is pass@4 because only 4 samples were drawn (table_k is 32).
    assert table.splitlines()[0] == ("| Method | Toy-Add pass@1 | Toy-Add pass@4 | Toy-Mixed pass@1 | "
                                     "Toy-Mixed pass@4 | Avg pass@1 | Avg pass@4 |")
    # pass@1: base 50.0, sft 62.5, eksft 62.5; pass@4: base 50, sft 100, eksft 100.
    assert "| SFT | **62.5** | **100.0** | **62.5** | **100.0** | **62.5** | **100.0** |" in table
    assert "| Base | <u>50.0</u> | <u>50.0</u> |" in table
    assert not (out / "table2.md").exists()
    text = (out / "report.md").read_text()
    assert "only ours are shown" in text and "plots/passk_Toy-Qwen3-0.8M_sft_toy_add.png" in text
    assert (out / "plots" / "passk_Toy-Qwen3-0.8M_sft_toy_add.png").stat().st_size > 1000
    assert manifest.complete and len(manifest.inputs) == 6
    assert read_manifest(out).complete
    assert report.run(cfg).started_at == manifest.started_at  # unchanged inputs: skipped


def test_report_shows_the_papers_numbers_next_to_ours(tmp_path):
    cfg = compose(["profile=paper", "experiment=table1", f"experiment.run_root={tmp_path}"])
    _write_metrics(cfg, "sft", "eksft", "aime24", {"p": 16}, n=32)
    report.run(cfg)
    table = (report_dir(cfg) / "table1.md").read_text()
    assert "| EKSFT (Ours) | **50.0** (45.7) | **100.0** (73.3) | – (33.4) |" in table
    assert "***Qwen3-8B***" in table
    assert "Missing evaluations" in (report_dir(cfg) / "report.md").read_text()
