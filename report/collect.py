"""What the report reads, once per report: the evaluations of the experiment's grid (:mod:`common.grid`) as the
tables of each phase, with the metrics files behind them and the pass@k curves (:class:`Collected`), and the few
lookups every section shares (row titles, model titles, the complete exports of an arm)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from report.tables import (
    AVERAGE,
    REFERENCE_VARIANT,
    Block,
    ResultTable,
    Row,
    attach_paper_values,
    fill_estimates,
    load_paper_tables,
    mark_primary,
)
from common.config import Config
from common.config.rl import ALGORITHM_TITLES
from common.config.sft import SFTMethod
from common.grid import Arm, Grid, ModelGrid, method_labels, run_seeds
from common.manifest import StageInputError, read_manifest
from common.models import local_model_dir
from common.paths import EVAL_METRICS_FILE, base_run, eval_run, hf_export_dir, report_benchmarks, report_dir

PHASES = {"sft": ("table1", "Method", "Table 1 (stage 1: without RL)"),
          "rl": ("table2", "Method(+{algorithm})", "Table 2 (stage 2: after RL)")}
"""Per phase: the table's file stem, its row header and its title."""
PHASE_MODELS = {"sft": "after SFT, before RL (Table 1's models)",
                "rl": "after RL (Table 2's models)"}
"""Per phase, which models a figure of that phase shows: its title names them."""


def row_label(cfg: Config, variant: str) -> str:
    """``report.row_labels`` title of a variant; a sweep label ``eksft_rho0.1`` becomes ``EKSFT (paper eq.) (rho0.1)``."""
    titles = cfg.report.row_labels
    if variant in titles:
        return titles[variant]
    name, _, suffix = variant.partition("_")
    return f"{titles[name]} ({suffix})" if name in titles and suffix else variant


def model_title(mcfg: Config) -> str:
    """How a model is named in tables, plot titles and file names: ``model.display_name``, else ``model.name``."""
    return mcfg.model.display_name or mcfg.model.name


def metrics_path(cfg: Config, phase: str, a: Arm, benchmark: str) -> Path:
    """The ``metrics.json`` of arm ``a``'s evaluation in ``phase`` on ``benchmark`` (``cfg``: the model and seed)."""
    return eval_run(cfg, phase, a.variant, benchmark, a.model(phase)).directory / EVAL_METRICS_FILE


def collect(cfg: Config, phase: str, models: list[ModelGrid], labels: list[str]
            ) -> tuple[ResultTable, dict[str, Path], dict[tuple[str, str], dict]]:
    """The phase's table over ``models`` x ``labels`` x seeds (:func:`common.grid.run_seeds`) with intervals and paired
    differences, the metrics files it read (by ``model/phase/variant/benchmark/seed<s>``), and pass@k curves.

    Curves map (model title, benchmark) to {row label: {seed: metrics.json}}.
    """
    name, header, stage = PHASES[phase]
    header = header.format(algorithm=ALGORITHM_TITLES[cfg.rl.algorithm])  # Method(+DAPO), Method(+GSPO), ...
    names = report_benchmarks(cfg)
    titles = {bench: cfg.report.benchmark_labels.get(bench, bench) for bench in names}
    extra_columns = [titles[bench] for bench in names if bench in cfg.data.extra_benchmarks]
    columns = [titles[bench] for bench in names if bench not in cfg.data.extra_benchmarks]
    docs: dict[tuple[int, str, str], dict[int, dict]] = {}
    inputs: dict[str, Path] = {}
    for m, model in enumerate(models):
        for seed, scfg in model.seeds.items():
            for variant in labels:
                if variant not in model.arms[seed]:
                    continue
                for bench in names:
                    path = metrics_path(scfg, phase, model.arms[seed][variant], bench)
                    if path.exists():
                        docs.setdefault((m, variant, bench), {})[seed] = json.loads(path.read_text(encoding="utf-8"))
                        inputs[f"{model.cfg.model.name}/{phase}/{variant}/{bench}/seed{seed}"] = path
    # The second column is pass@table_k unless some evaluation drew fewer samples than that.
    k = min([cfg.report.table_k, *(doc["n"] for by_seed in docs.values() for doc in by_seed.values())])
    present = sorted({seed for by_seed in docs.values() for seed in by_seed}) or run_seeds(cfg)
    table = ResultTable(caption=f"{stage}: pass@1 (avg@n) and pass@{k} in percent, mean [95% interval] over "
                                f"{_seeds_text(present)} and problems",
                        row_header=header, columns=[*columns, AVERAGE, *extra_columns],
                        metrics=["pass@1", f"pass@{k}"], blocks=[], extra_columns=extra_columns)
    curves: dict[tuple[str, str], dict] = {}
    for m, model in enumerate(models):
        title = model_title(model.cfg)
        rows = [Row(label=row_label(cfg, variant), variant=variant,
                    evaluations={titles[bench]: docs[(m, variant, bench)] for bench in names
                                 if (m, variant, bench) in docs})
                for variant in labels if model.has(variant)]
        for row in rows:
            for bench, column in titles.items():
                if column in row.evaluations:
                    curves.setdefault((title, bench), {})[row.label] = row.evaluations[column]
        table.blocks.append(Block(title=title, rows=rows))
    fill_estimates(table)
    attach_paper_values(table, phase, load_paper_tables())
    return table, inputs, curves


def _seeds_text(seeds: list[int]) -> str:
    """The seeds a table holds (every seed some evaluation of it has), as its caption names them."""
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"


def primary_arms(cfg: Config) -> set[str]:
    """The variants whose ``Δ vs SFT`` are primary comparisons: the labels of ``report.primary_arms`` among
    ``experiment.methods``, or (empty) of every method but SFT."""
    labels = dict(zip(cfg.experiment.methods, method_labels(cfg)))
    chosen = cfg.report.primary_arms or list(labels)
    return {labels[name] for name in chosen if name in labels} - {REFERENCE_VARIANT}


def missing_seeds(cfg: Config, table: ResultTable) -> list[str]:
    """``model / method / benchmark: seeds …`` for every evaluation some but not all seeds have."""
    expected = set(run_seeds(cfg))
    return [f"{block.title} / {row.label} / {column}: seed {', '.join(map(str, sorted(expected - set(by_seed))))}"
            for block in table.blocks for row in block.rows for column, by_seed in row.evaluations.items()
            if expected - set(by_seed)]


def trained_exports(arms: dict[str, Arm], phase: str) -> dict[str, Path]:
    """Variant → run folder of every arm whose SFT (phase sft) or RL (phase rl) run is complete with an HF export."""
    exports = {}
    for variant, a in arms.items():
        folder = a.sft if phase == "sft" else a.rl
        manifest = read_manifest(folder) if folder is not None else None
        if manifest is not None and manifest.complete and hf_export_dir(folder).is_dir():
            exports[variant] = folder
    return exports


def base_model_folder(cfg: Config) -> tuple[Path | None, Path | None]:
    """(HF folder of the base model, folder of its manifest) or None where there is no local safetensors copy."""
    if (base := base_run(cfg)) is not None:  # a base model built by a stage of ours
        manifest = read_manifest(base.directory)
        return (hf_export_dir(base.directory), base.directory) if manifest and manifest.complete else (None, None)
    if cfg.model.source != "hub":
        return None, None
    try:
        return Path(local_model_dir(cfg.model.path)), None
    except Exception:  # neither a folder nor in the hub cache (offline machines): the analyses that need it skip
        return None, None


def evaluated_methods(model: ModelGrid, phase: str, benchmarks: list[str]) -> dict[str, SFTMethod]:
    """Label → SFT method of every arm of ``model`` (the experiment's and the sweep points) with an evaluation in
    ``phase``; the method is the one its SFT run's manifest records."""
    return {variant: a.method for seed, scfg in model.seeds.items()
            for variant, a in model.arms[seed].items()
            if a.method is not None and any(metrics_path(scfg, phase, a, bench).exists() for bench in benchmarks)}


class PhaseTable(NamedTuple):
    """One phase's table, the ``metrics.json`` files it read (by ``model/phase/variant/benchmark/seed<s>``) and its
    pass@k curves ((model title, benchmark) → {row label: {seed: metrics.json}})."""

    table: ResultTable
    files: dict[str, Path]
    curves: dict[tuple[str, str], dict]


@dataclass
class Collected:
    """What every section reads besides the grid: the tables of the phases with evaluations (in :data:`PHASES`
    order), their primary endpoints (``report.primary_endpoints``; ``rl_gain`` too), the endpoints each table has no
    cell for, the primary arms (:func:`primary_arms`), the report's inputs (``common.grid.report_run``) and the
    report folder the sections write into."""

    tables: dict[str, PhaseTable]
    endpoints: dict[str, list[str]]
    absent: dict[str, list[str]]
    primary: set[str]
    inputs: dict[str, Path]
    out_dir: Path


def collect_runs(grid: Grid, inputs: dict[str, Path]) -> Collected:
    """The tables of both phases over the grid (:func:`collect`: Table 1 over every model's variants, Table 2 over
    its RL arms), their primary cells marked; raises :class:`StageInputError` when no evaluation exists."""
    cfg = grid.cfg
    rows = {"sft": grid.variants, "rl": grid.rl_variants}
    tables = {phase: PhaseTable(*collect(cfg, phase, grid.models, rows[phase])) for phase in PHASES}
    tables = {phase: found for phase, found in tables.items() if found.files}
    if not tables:
        raise StageInputError(f"no eval metrics found for experiment '{cfg.experiment.name}' "
                              f"(models {cfg.profile.models}, variants {grid.variants}); run the eval stages first")
    endpoints = {phase: list(cfg.report.primary_endpoints.get(phase, [])) for phase in (*PHASES, "rl_gain")}
    primary = primary_arms(cfg)
    absent = {phase: mark_primary(found.table, endpoints[phase], primary) for phase, found in tables.items()}
    return Collected(tables, endpoints, absent, primary, inputs, report_dir(cfg))
