"""The report stage: ``python -m report.run experiment=<name> [profile=…]`` (the orchestrator's last stage).

Reads the evaluations, training logs and exports of the experiment's grid (:func:`common.grid.experiment_grid`: its
models, seeds and arms, then the sweep points); those runs, and no others, are its inputs
(:func:`common.grid.report_run`). It collects the tables of both phases once (:func:`report.collect.collect_runs`),
then walks :data:`SECTIONS` in order: each section (:mod:`report.sections`) writes its files into ``report_dir(cfg)``
and returns its lines of ``report.md``, those files and its metrics. ``report.md`` opens with what the run shows
(:mod:`report.sections.head`), then the map of the paper's tables and figures to these files
(:func:`report.paper_figures.artefact_lines`); ``manifest.json`` lists every file and holds the metrics.
docs/report.md describes every section. A tool-use experiment (``data.benchmark_source=bfcl``) gets the BFCL appendix
tables instead (:mod:`report.bfcl`).
"""
from __future__ import annotations

import csv
import io
from dataclasses import asdict
from pathlib import Path
from typing import Any

from report.bfcl import run as bfcl_report
from report.collect import PHASES, collect_runs, model_title
from report.paper_figures import artefact_lines, curve_benchmarks
from report.sections import analyses, curves, head, headroom, iou, paper, readiness, rl_gain, runs, sweep, tables
from common.config import Config, stage_main
from common.grid import experiment_grid, report_run
from common.manifest import Manifest, read_manifest, stage_run
from common.paths import report_dir
from common.tracking import start_wandb

SECTIONS = (
    head.render,                # what this run shows, the benchmark legend, the fork table (forking world)
    tables.render,              # Tables 1-2, their pass@k curves and eval manifests
    paper.render,               # the paper's ablation tables and Figure 1
    analyses.render,            # per model: parameter drift, IoU, case study (report.analysis.run)
    iou.render_paper_table,     # the paper's IoU table
    sweep.render,               # sweep tables
    curves.render,              # SFT and RL training curves
    rl_gain.render,             # RL gain per arm
    headroom.render,            # RL headroom
    readiness.render,           # RL readiness: coverage and predicted DAPO groups per start
    runs.render,                # commits, machines, run times
)
"""The sections of ``report.md``, in order; each ``render(grid, collected) -> report.sections.Section``. The first is
the head: the map of the paper's artefacts follows it."""


def run(cfg: Config) -> Manifest:
    """Writes the tables, plots, analyses and ``report.md`` of the experiment; skipped when no input changed."""
    if cfg.data.benchmark_source == "bfcl":  # a tool-use experiment: the BFCL appendix tables (docs/tool_use.md)
        return bfcl_report(cfg)
    out_dir = report_dir(cfg)
    grid = experiment_grid(cfg)
    spec = report_run(cfg, grid)
    collected = collect_runs(grid, spec.inputs)
    with stage_run(out_dir, stage="report", variant="", config=spec.config, inputs=spec.inputs,
                   optional_inputs=True) as run_:
        if run_ is None:
            return read_manifest(out_dir)
        lines = [f"# Report: experiment `{cfg.experiment.name}` (profile {cfg.profile.name})", ""]
        metrics: dict[str, Any] = {}
        head_end = 0
        for render in SECTIONS:
            section = render(grid, collected)
            lines += section.lines
            head_end = head_end or len(lines)
            for relative, description in section.files.items():
                run_.add_output(relative, description)
            metrics.update({key: value for key, value in section.metrics.items() if value})
        benchmarks = curve_benchmarks(collected.tables["sft"].curves) if "sft" in collected.tables else []
        lines[head_end:head_end] = artefact_lines(list(run_.manifest.outputs),
                                                  [model_title(m.cfg) for m in grid.models], benchmarks)
        (out_dir / "report.md").write_text("\n".join(lines), encoding="utf-8")
        run_.add_output("report.md", "tables, plots and links to every eval manifest")
        run_.manifest.metrics = metrics
        log_to_wandb(cfg, run_.manifest, out_dir)
        return run_.manifest


def log_to_wandb(cfg: Config, manifest: Manifest, out_dir: Path) -> None:
    """Under ``logging.wandb_mode`` (nothing when disabled): one wandb run ``<experiment>/report`` in the experiment's
    group with every CSV output as a table (``table1``, ``table2``, sweeps, drift, ...: the CSV's rows and header),
    every PNG output as an image (key: its path without ``.png``), and the manifest's numeric metrics as scalars
    (``table1/<model>/<row>/Avg pass@1``, ...)."""
    tracker = start_wandb(cfg.logging.wandb_mode, project=cfg.logging.wandb_project, group=cfg.experiment.name,
                          name=cfg.logging.run_name or f"{cfg.experiment.name}/report",
                          config={"eval": asdict(cfg.eval), "report": asdict(cfg.report),
                                  "models": list(cfg.profile.models)}, directory=out_dir)
    if tracker is None:
        return
    import wandb

    logged: dict[str, Any] = {}
    for relative in manifest.outputs:
        path = out_dir / relative
        if relative.endswith(".csv"):
            header, *rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
            logged[relative.removesuffix(".csv")] = wandb.Table(columns=header, data=rows)
        elif relative.endswith(".png"):
            logged[relative.removesuffix(".png")] = wandb.Image(str(path))
    tables = {phase: name for phase, (name, _, _) in PHASES.items()}
    logged.update({f"{tables.get(group, group)}/{key}": value for group, values in manifest.metrics.items()
                   if isinstance(values, dict) for key, value in _numbers(values).items()})
    tracker.log(logged)
    tracker.finish()


def _numbers(values: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric leaves of nested metrics, keyed ``a/b/c``; a list [mean, low, high] or [low, high] gives
    ``<key>/0``, ``<key>/1``, ..."""
    flat: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_numbers(value, f"{name}/"))
        elif isinstance(value, list):
            flat.update({f"{name}/{i}": item for i, item in enumerate(value) if isinstance(item, (int, float))})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = value
    return flat


main = stage_main(run)


if __name__ == "__main__":
    main()
