"""Sweep aggregation: method labels parse back into their method configs; sweep points group into one table."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from report import run as report
from report.sweep import Sweep, find_sweeps
from common.config import compose
from common.config.sft import (
    SFT_METHOD_SCHEMAS,
    EAFTMethod,
    EKSFTMethod,
    GEMMethod,
    HighEntropyMethod,
    IWSFTMethod,
    SEDSFTMethod,
    SFTMethod,
)
from common.manifest import Manifest, write_manifest
from common.paths import eval_dir, method_label, parse_method_label


@pytest.mark.parametrize("name", sorted(SFT_METHOD_SCHEMAS))
def test_default_labels_round_trip(name):
    method = SFT_METHOD_SCHEMAS[name]()
    assert parse_method_label(method_label(method)) == method


@pytest.mark.parametrize("method", [
    EKSFTMethod(rho=0.0), EKSFTMethod(rho=0.1), EKSFTMethod(lambda_entropy=0.0, lambda_kl=0.1),
    EKSFTMethod(dynamic_lambda=True), EKSFTMethod(dynamic_lambda_factor=0.1),  # one field name prefixes the other
    EKSFTMethod(compat="official_code", kl_formula="true_kl"),  # values with underscores
    EKSFTMethod(kl_eps=1e-05, random_mask_seed=3), IWSFTMethod(level="token", temp=0.5), GEMMethod(h="logsigmoid"),
    EKSFTMethod(compat="official_code", loss_norm="micro_batch_mean"), SFTMethod(loss_norm="global_token_mean"),
    SEDSFTMethod(top_k=10, threshold=0.7), EAFTMethod(alpha=0.5), HighEntropyMethod(rho=0.1),
])
def test_sweep_point_labels_round_trip(method):
    label = method_label(method)
    assert parse_method_label(label) == method


def test_labels_read_back_field_by_field():
    assert method_label(EKSFTMethod(compat="official_code", kl_formula="true_kl")) == \
        "eksft_compatofficial_code_kl_formulatrue_kl"
    assert parse_method_label("eksft_rho0.1") == EKSFTMethod(rho=0.1)


@pytest.mark.parametrize("label", ["base", "my_model", "eksft_rho", "eksft_foo1", "eksft_rhoabc", "sft_rho0.1",
                                   "eksft_rho0.10", "eksft_rho0.2"])
def test_other_labels_are_rejected(label):
    # "eksft_rho0.10" and "eksft_rho0.2" parse to configs whose label is "eksft_rho0.1" / "eksft": not this label.
    with pytest.raises(ValueError, match=label):
        parse_method_label(label)


def _parsed(labels):
    """The label -> method map the report reads from evaluation manifests (non-method labels record none)."""
    return {label: parse_method_label(label) for label in labels if label not in ("base", "my_model")}


def test_find_sweeps_groups_by_method_and_sorts_by_value():
    labels = ["base", "eksft_rho0.4", "eksft", "eksft_rho0", "sft", "my_model"]
    assert find_sweeps(_parsed(labels)) == [Sweep(method="eksft", fields=["rho"], points=[
        ("eksft_rho0", (0.0,)), ("eksft", (0.2,)), ("eksft_rho0.4", (0.4,))])]
    grid = find_sweeps(_parsed(["eksft_lambda_entropy0_lambda_kl0", "eksft_lambda_entropy0", "eksft"]))
    assert grid[0].fields == ["lambda_entropy", "lambda_kl"]
    assert [p[1] for p in grid[0].points] == [(0.0, 0.0), (0.0, 0.05), (0.05, 0.05)]
    assert find_sweeps(_parsed(["eksft", "sft", "dft"])) == []


def test_sweep_table_rows_and_columns(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[eksft]"])
    # n = 4; per benchmark (toy_add, toy_mixed) the correct counts of two problems.
    points = {"eksft_rho0": ([4, 0], [2, 2]), "eksft_rho0.1": ([1, 1], [0, 0]), "eksft": ([4, 4], [4, 2]),
              "base": ([0, 0], [0, 0]), "sft": ([4, 4], [4, 4])}
    for label, per_bench in points.items():
        for bench, counts in zip(("toy_add", "toy_mixed"), per_bench):
            folder = eval_dir(cfg, "sft", label, bench)
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"n": 4, "correct_counts": dict(zip("ab", counts))}))
            details = {"variant": label, **({} if label == "base" else {"sft_method": asdict(parse_method_label(label))})}
            write_manifest(folder, Manifest(stage="eval_sft", variant=label, status="complete", details=details))
    [(mcfg, phase, sweep, table, files)] = report.sweep_tables(cfg, report.model_configs(cfg))
    assert (phase, sweep.fields, table.row_header) == ("sft", ["rho"], "rho")
    assert table.columns == ["Toy-Add", "Toy-Mixed", "Avg"] and table.metrics == ["pass@1", "pass@4"]
    rows = {row.label: row.ours for row in table.blocks[0].rows}
    assert list(rows) == ["0", "0.1", "0.2"]
    # rho 0: Toy-Add pass@1 = (4/4 + 0/4)/2 = 50, pass@4 = (1 + 0)/2 = 50; Toy-Mixed 50 / 100; Avg 50 / 75.
    assert rows["0"][("Toy-Add", "pass@1")] == 50.0 and rows["0"][("Toy-Add", "pass@4")] == 50.0
    assert rows["0"][("Avg", "pass@1")] == 50.0 and rows["0"][("Avg", "pass@4")] == 75.0
    # rho 0.1: 25 / 100 and 0 / 0; rho 0.2 (the default label): 100 / 100 and 75 / 100.
    assert (rows["0.1"][("Avg", "pass@1")], rows["0.1"][("Avg", "pass@4")]) == (12.5, 50.0)
    assert (rows["0.2"][("Avg", "pass@1")], rows["0.2"][("Avg", "pass@4")]) == (87.5, 100.0)
    assert len(files) == 6
