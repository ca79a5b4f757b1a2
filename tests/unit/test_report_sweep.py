"""Sweep aggregation: the points are the SFT runs the current config would train with another method, each with the
method its manifest records (never parsed from a label); they group into one table per method."""
from __future__ import annotations

import json
from dataclasses import replace

from common.config import compose
from common.config.sft import EKSFTMethod, SFTMethod
from common.manifest import Manifest, write_manifest
from common.paths import eval_run, method_label, sft_run
from common.grid import arm, experiment_grid, sweep_arms, with_method
from report.sections.sweep import sweep_tables
from report.sweep import Sweep, find_sweeps


def _labelled(*methods):
    return {method_label(method): method for method in methods}


def test_find_sweeps_groups_by_method_and_sorts_by_value():
    methods = _labelled(EKSFTMethod(rho=0.4), EKSFTMethod(), EKSFTMethod(rho=0.0), SFTMethod())
    assert find_sweeps(methods) == [Sweep(method="eksft", fields=["rho"], points=[
        ("eksft_rho0", (0.0,)), ("eksft", (0.2,)), ("eksft_rho0.4", (0.4,))])]
    grid = find_sweeps(_labelled(EKSFTMethod(lambda_entropy=0.0, lambda_kl=0.0), EKSFTMethod(lambda_entropy=0.0),
                                 EKSFTMethod()))
    assert grid[0].fields == ["lambda_entropy", "lambda_kl"]
    assert [p[1] for p in grid[0].points] == [(0.0, 0.0), (0.0, 0.05), (0.05, 0.05)]
    assert find_sweeps(_labelled(EKSFTMethod(), SFTMethod())) == []


def _trained(cfg, method, folder=None):
    """A complete SFT run of ``method`` under ``cfg`` (its manifest records the identity, method included)."""
    spec = sft_run(with_method(cfg, method))
    folder = folder or spec.directory
    folder.mkdir(parents=True)
    write_manifest(folder, Manifest(stage="sft", variant=spec.variant, status="complete", config=spec.config))
    return folder


def test_sweep_points_are_the_runs_the_current_config_would_train_with_another_method(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[eksft]"])
    point = _trained(cfg, EKSFTMethod(rho=0.1))
    _trained(cfg, EKSFTMethod())  # the experiment's own arm, not a sweep point
    _trained(replace(cfg, sft=replace(cfg.sft, lr=3e-3)), EKSFTMethod(rho=0.3))  # another lr: another experiment
    _trained(replace(cfg, seed=1), EKSFTMethod(rho=0.4))  # another seed
    assert [(a.variant, a.sft, a.method) for a in sweep_arms(cfg)] == [("eksft_rho0.1", point, EKSFTMethod(rho=0.1))]
    assert [a.variant for a in sweep_arms(replace(cfg, seed=1))] == ["eksft_rho0.4"]


def test_a_folder_label_is_not_read_back(tmp_path):
    # A run folder whose label says rho 0.4 but whose manifest and identity say rho 0.1 (renamed by hand) is not the
    # rho 0.1 run the config names: the folder is not where that run lives, so it is no point; nothing parses labels.
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[eksft]"])
    proper = sft_run(with_method(cfg, EKSFTMethod(rho=0.1))).directory
    _trained(cfg, EKSFTMethod(rho=0.1), folder=proper.with_name("eksft_rho0.4-" + proper.name.rpartition("-")[2]))
    assert sweep_arms(cfg) == []


def test_sweep_table_rows_and_columns(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[eksft]"])
    # n = 4; per benchmark (toy_add, toy_mixed) the correct counts of two problems.
    points = [(EKSFTMethod(rho=0.0), ([4, 0], [2, 2])), (EKSFTMethod(rho=0.1), ([1, 1], [0, 0])),
              (EKSFTMethod(), ([4, 4], [4, 2])), (None, ([0, 0], [0, 0])), (SFTMethod(), ([4, 4], [4, 4]))]
    for method, per_bench in points:
        if method is not None:
            _trained(cfg, method)
        evaluated = arm(cfg, method)
        for bench, counts in zip(("toy_add", "toy_mixed"), per_bench):
            folder = eval_run(cfg, "sft", evaluated.variant, bench, evaluated.sft).directory
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"n": 4, "correct_counts": dict(zip("ab", counts))}))
    [(mcfg, phase, sweep, table, files)] = sweep_tables(cfg, experiment_grid(cfg).models)
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
