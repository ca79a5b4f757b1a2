"""wandb receives the configured project and the experiment as the run's group (no wandb process is started)."""
from __future__ import annotations

import sys
from types import SimpleNamespace

from common.tracking import MetricsLogger


def test_wandb_run_gets_project_and_experiment_group(tmp_path, monkeypatch):
    calls = []
    run = SimpleNamespace(log=lambda *args, **kwargs: None, finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(init=lambda **kwargs: calls.append(kwargs) or run))
    with MetricsLogger(tmp_path / "metrics.jsonl", wandb_mode="offline", wandb_project="my_project",
                       run_name="table1/sft/eksft", group="table1") as logger:
        logger.log(1, {"loss": 0.5})
    assert [(c["project"], c["group"], c["name"], c["mode"]) for c in calls] == [
        ("my_project", "table1", "table1/sft/eksft", "offline")]


def test_disabled_wandb_is_never_imported(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # importing it would raise
    with MetricsLogger(tmp_path / "metrics.jsonl", group="table1") as logger:
        logger.log(1, {"loss": 0.5})
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
