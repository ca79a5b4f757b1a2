"""The head of ``report.md``: what this run shows, in claims built from the report's own cells (each with its
numbers), the legend of its benchmarks, and, for a forking-world experiment, the fork table (:mod:`common.forks`:
each model's exact fork distribution on the benchmarks' prompts)."""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

from report.collect import Collected, base_model_folder, model_title, row_label, trained_exports
from report.sections import Section
from report.tables import AVERAGE, REFERENCE_VARIANT, ResultTable, Row, rl_gains, signed_estimate
from common.benchmarks import read_benchmark
from common.config import Config
from common.config.rl import ALGORITHM_TITLES
from common.config.toy import (
    ARITHMETIC_BENCHMARK_RULES,
    FORK_BENCHMARK_PREFIX,
    FORK_BEST_STRATEGY,
    FORK_FAMILY_RULES,
    fork_prefix,
)
from common.forks import FORK_ENTROPY, best_strategy_key, fork_distribution, summarize
from common.grid import Grid
from common.paths import benchmark_file, data_dir, hf_export_dir, report_benchmarks

FORK_PHASES = {"sft": "before RL", "rl": "after RL"}
"""The fork table's phases: the models of Table 1 (base and SFT exports) and of Table 2 (RL exports)."""

Measure = Callable[[str, Mapping[str, Sequence[list[dict[str, str]]]], str], dict[str, float]]
"""(model folder, family → chat prompts, the fixed text before the fork) → :func:`common.forks.fork_distribution` of
that model."""


def render(grid: Grid, collected: Collected) -> Section:
    """``## What this run shows`` (:func:`claims`), the benchmark legend (:func:`legend`) and ``### The fork``
    (:func:`fork_table`, forking-world experiments only); metrics ``fork``: per (model, phase, method) the pooled fork
    distribution."""
    cfg = grid.cfg
    families = fork_families(cfg)
    forks = fork_measurements(grid, families, measure_fork) if families else {}
    lines = ["## What this run shows", "",
             "Each claim from this report's own cells (Table 1, Table 2, the RL gain, the fork table): mean [95% "
             "bootstrap interval over seeds and problems], in points of pass@k unless said.", "",
             *claims(cfg, collected, forks, families), "", *legend(cfg, families), ""]
    if families:
        lines += ["### The fork", "", *fork_table(cfg, forks, families), ""]
    return Section(lines, metrics={"fork": {" / ".join(key): value for key, value in forks.items()}})


def fork_families(cfg: Config) -> list[str]:
    """The forking-world families the report's benchmarks hold (``toy_fork_<family>``), in their order."""
    return [bench.removeprefix(FORK_BENCHMARK_PREFIX) for bench in report_benchmarks(cfg)
            if bench.startswith(FORK_BENCHMARK_PREFIX)]


def measure_fork(folder: str, prompts: Mapping[str, Sequence[list[dict[str, str]]]], prefix: str) -> dict[str, float]:
    """:func:`common.forks.fork_distribution` of the model in ``folder`` (HF format) on ``prompts`` with the fork after
    ``prefix`` (:func:`common.config.toy.fork_prefix` of the run's ``toy.fork_position``), on one thread: one
    prompt per forward pass through a toy model gains nothing from more, and on a busy 2-core machine they cost
    (scripts/toy_styles.py, ``exact_fork_distribution``)."""
    import torch

    from common.models import load_causal_lm, load_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fork_distribution(load_causal_lm(folder).eval(), load_tokenizer(folder), prompts, prefix=prefix)
    finally:
        torch.set_num_threads(threads)


def fork_measurements(grid: Grid, families: list[str], measure: Measure) -> dict[tuple[str, str, str], dict]:
    """(model title, phase, row label) → :func:`common.forks.summarize` over the seeds of the fork distributions of
    that row's models on the prompts of the data run's ``toy_fork_<family>`` benchmarks: the base model and every
    complete SFT export (phase ``before RL``), every complete RL export (``after RL``)."""
    found: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for model in grid.models:
        title = model_title(model.cfg)
        for seed, scfg in model.seeds.items():
            files = {family: data_dir(scfg) / benchmark_file(FORK_BENCHMARK_PREFIX + family) for family in families}
            if not all(path.is_file() for path in files.values()):
                continue
            prompts = {family: [row["prompt"] for row in read_benchmark(path)] for family, path in files.items()}
            folders = {("sft", "base"): base_model_folder(scfg)[0]}
            for phase in FORK_PHASES:
                folders.update({(phase, variant): hf_export_dir(folder)
                                for variant, folder in trained_exports(model.arms[seed], phase).items()})
            for (phase, variant), folder in folders.items():
                if folder is not None and folder.is_dir():
                    found.setdefault((title, FORK_PHASES[phase], row_label(grid.cfg, variant)), []).append(
                        measure(str(folder), prompts, fork_prefix(scfg.toy.fork_position)))
    return {key: summarize(forks, families) for key, forks in found.items()}


def fork_table(cfg: Config, forks: dict[tuple[str, str, str], dict], families: list[str]) -> list[str]:
    """One row per (model, phase, method): the fork entropy (mean over the seeds' models [min, max]) and per family the
    probability of its always-right strategy."""
    if not forks:
        return ["No model to measure yet: the fork table needs the base model and the SFT or RL exports of this "
                "experiment's runs."]
    columns = [f"p({FORK_BEST_STRATEGY[f]} \\| {family_title(cfg, f)})" for f in families]
    lines = ["The exact distribution of each model's first response token, which names its strategy "
             "(`common.forks`), on this run's benchmark prompts: the fork entropy in nats over the vocabulary and, "
             "per family, the probability of the family's always-right strategy; mean over the seeds (fork H: "
             "[min, max] over them). The base model's fork is wide; a collapsed fork (H near 0) samples one strategy "
             "whatever the problem.", "",
             "| model | phase | method | fork H (nats) | " + " | ".join(columns) + " |",
             "|---|---|---|:---:|" + ":---:|" * len(columns)]
    for (title, phase, label), pooled in forks.items():
        low, high = pooled["fork_entropy_range"]
        cells = [f"{pooled[FORK_ENTROPY]:.2f} [{low:.2f}, {high:.2f}]",
                 *(f"{pooled[best_strategy_key(f)]:.2f}" for f in families)]
        lines.append(f"| {title} | {phase} | {label} | " + " | ".join(cells) + " |")
    return lines


def family_title(cfg: Config, family: str) -> str:
    bench = FORK_BENCHMARK_PREFIX + family
    return cfg.report.benchmark_labels.get(bench, bench)


def legend(cfg: Config, families: list[str]) -> list[str]:
    """``Benchmarks:`` one item per benchmark of the report: its column title, its name and what it holds where the
    toy worlds define it (docs/toy_world.md)."""
    items = []
    for bench in report_benchmarks(cfg):
        title = cfg.report.benchmark_labels.get(bench, bench)
        family = bench.removeprefix(FORK_BENCHMARK_PREFIX)
        if family in families:
            what = f": {FORK_FAMILY_RULES[family]}; only `{FORK_BEST_STRATEGY[family]}` is always right"
        else:
            what = f": {ARITHMETIC_BENCHMARK_RULES[bench]}" if bench in ARITHMETIC_BENCHMARK_RULES else ""
        items.append(f"* {title} (`{bench}`){what}")
    return ["Benchmarks:", "", *items]


def claims(cfg: Config, collected: Collected, forks: dict[tuple[str, str, str], dict],
           families: list[str]) -> list[str]:
    """One bullet per claim: per model, each primary arm against SFT in Table 1 (Avg cells and the benchmark column
    where their pass@k differ most, Base beside them), the RL gain of every RL arm with its levels before and after
    RL, and the fork entropy and the right strategy's probability of every model of the fork table."""
    lines = []
    if "sft" in collected.tables:
        lines += table1_claims(collected.tables["sft"].table, collected.primary)
    if "sft" in collected.tables and "rl" in collected.tables:
        lines += rl_claims(collected.tables["sft"].table, collected.tables["rl"].table,
                           ALGORITHM_TITLES[cfg.rl.algorithm])
    lines += fork_claims(cfg, forks, families)
    return lines or ["* Nothing to state yet: no evaluation with a reference row (SFT) to compare."]


def _cell(row: Row, cell: tuple[str, str]) -> str:
    value = row.ours.get(cell)
    return "–" if value is None else f"{value:.1f}"


def table1_claims(table: ResultTable, primary: set[str]) -> list[str]:
    """Per model and primary arm with a ``Δ vs SFT``: Avg pass@1 and pass@k against SFT's, and the column where the
    two differ most in pass@k with Base's value beside them."""
    lines = []
    first, last = table.metrics[0], table.metrics[-1]
    for block in table.blocks:
        rows = {row.variant: row for row in block.rows}
        reference, base = rows.get(REFERENCE_VARIANT), rows.get("base")
        if reference is None:
            continue
        for row in block.rows:
            if row.variant not in primary or not row.delta:
                continue
            parts = [f"Avg {metric} {_cell(row, (AVERAGE, metric))} against SFT's "
                     f"{_cell(reference, (AVERAGE, metric))} (Δ {signed_estimate(row.delta[(AVERAGE, metric)])})"
                     for metric in (first, last) if (AVERAGE, metric) in row.delta]
            columns = [(column, last) for column in table.averaged_columns if (column, last) in row.delta]
            if columns:
                cell = max(columns, key=lambda c: abs(row.delta[c].mean))
                base_text = f", Base {_cell(base, cell)}" if base is not None else ""
                parts.append(f"the largest gap, {cell[0]} {last}: {_cell(row, cell)} against SFT's "
                             f"{_cell(reference, cell)}{base_text} (Δ {signed_estimate(row.delta[cell])})")
            lines.append(f"* **{block.title}, {row.label} against SFT (Table 1, before RL):** "
                         + "; ".join(parts) + ".")
    return lines


def rl_claims(before: ResultTable, after: ResultTable, algorithm: str) -> list[str]:
    """Per model: every RL arm's Avg pass@1 before and after RL (``algorithm``) with its gain
    (:func:`report.tables.rl_gains`)."""
    metric = after.metrics[0]
    levels = {(block.title, row.variant, phase): row.ours.get((AVERAGE, metric))
              for phase, table in (("before", before), ("after", after))
              for block in table.blocks for row in block.rows}
    lines = []
    for title, gains in rl_gains(before, after, metric):
        if not gains:
            continue
        parts = []
        for gain in gains:
            start, end = levels.get((title, gain.variant, "before")), levels.get((title, gain.variant, "after"))
            if start is None or end is None:
                continue
            parts.append(f"{gain.label} {start:.1f} → {end:.1f} ({signed_estimate(gain.gain)})")
        if parts:
            lines.append(f"* **{title}, RL ({algorithm}), Avg {metric} before → after (RL gain):** "
                         + "; ".join(parts) + ".")
    return lines


def fork_claims(cfg: Config, forks: dict[tuple[str, str, str], dict], families: list[str]) -> list[str]:
    """Per model and phase: the fork entropy of each method and its probabilities of the families' always-right
    strategies."""
    lines = []
    strategies = " / ".join(f"{FORK_BEST_STRATEGY[f]} on {family_title(cfg, f)}" for f in families)
    for title, phase in dict.fromkeys((title, phase) for title, phase, _ in forks):
        rows = {label: pooled for (t, p, label), pooled in forks.items() if (t, p) == (title, phase)}
        entropy = ", ".join(f"{label} {pooled[FORK_ENTROPY]:.2f}" for label, pooled in rows.items())
        right = ", ".join(f"{label} " + " / ".join(f"{pooled[best_strategy_key(f)]:.2f}" for f in families)
                          for label, pooled in rows.items())
        lines.append(f"* **{title}, the fork {phase}:** fork entropy (nats) {entropy}; p(the right strategy: "
                     f"{strategies}) {right}.")
    return lines
