"""Tables 1 and 2 in the paper's layout, from the eval stage's ``metrics.json`` files: Markdown, CSV and LaTeX.

One block per model; rows Base, then the SFT methods (``experiment.methods``) as labelled by ``report.row_labels``;
columns per benchmark pass@1 (= avg@n) and pass@k (k = ``report.table_k``, or the smallest n evaluated if that is
less; the unbiased estimator from each problem's correct count), then their mean over benchmarks ("Avg").

Every cell is the mean over seeds and problems with its 95% bootstrap interval (:mod:`eval.intervals`), in percent
with one decimal, and with two or more seeds the seed-level 95% t-interval over the per-seed means beside it:
``62.5 [50.0, 75.0] ⟨41.0, 84.0⟩``. Under each row of a block that has a reference row (SFT: variant ``sft``)
a ``Δ vs SFT`` line gives the paired difference to it with both intervals (same seeds, same problems, same resampled
indices; the t-interval over the per-seed differences). A Δ cell of a primary comparison (:func:`mark_primary`: the
declared arms × endpoints) carries its Holm-adjusted p-value over the table's primary comparisons (the paired t-test
over the per-seed differences); every other Δ cell is marked exploratory. Marks, per block and column: the best
value is bold and the second best underlined only where the bootstrap intervals separate (the best's interval lies
above every other row's; the second's above every row below it); where they do not, the cell says "n.s." instead.
The paper's own marks (no intervals) follow :func:`rank_marks`. Where the paper has a number for the same model,
row, benchmark and metric (``report/paper_tables.json``), it is shown in parentheses next to ours. The CSV is long:
one line per (model, method, column, metric) with the mean, intervals, paired difference, its test, the paper's
value and one column per seed.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from eval.intervals import (
    NO_SPREAD,
    Estimate,
    common_problems,
    estimate,
    holm,
    no_spread,
    paired_difference,
    per_seed_means,
    seed_t_interval,
    seed_t_test,
    top_level_means,
    value_matrix,
)
from common.grid import top_level_unit
from common.paths import BASE_VARIANT

PAPER_TABLES = Path(__file__).with_name("paper_tables.json")
AVERAGE = "Avg"
MISSING = "–"
NOT_SEPARATED = "n.s."
PAPER_ROWS = {"base": "Base", "sft": "SFT", "dft": "DFT", "iwsft": "IW-SFT", "psft": "PSFT",
              "eksft": "EKSFT (Ours)", "eksft_compatofficial_code": "EKSFT (Ours)"}
"""The paper's row (``paper_tables.json``) for each of our variants. The paper has one EKSFT row; its numbers came
from the official code, and both of our EKSFT arms (paper equations, official code) are shown against it."""
REFERENCE_VARIANT = "sft"
"""The variant every other row's paired difference is taken against."""
EXPLORATORY = "expl."
"""Marks a Δ cell outside the declared primary comparisons (no test; read as exploratory)."""


@dataclass
class Row:
    """One method of one model: our value and the paper's (if any) per (column, metric)."""

    label: str
    """Display name (e.g. ``EKSFT (Ours)``)."""
    variant: str
    """Eval folder name (``base``, ``eksft``, ``eksft_rho0.1``)."""
    ours: dict[tuple[str, str], float | None] = field(default_factory=dict)
    """Mean in percent per (column, metric); None where an evaluation is missing."""
    paper: dict[tuple[str, str], float] = field(default_factory=dict)
    evaluations: dict[str, dict[int, dict]] = field(default_factory=dict)
    """Benchmark column → seed → that seed's ``metrics.json`` (``n``, ``correct_counts``)."""
    intervals: dict[tuple[str, str], Estimate] = field(default_factory=dict)
    """The 95% interval of each cell with a value, in percent."""
    delta: dict[tuple[str, str], Estimate] = field(default_factory=dict)
    """Paired difference to the block's reference row, in percent (empty for the reference row itself)."""
    per_seed: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    """Each seed's own mean over problems, in percent."""
    seed_intervals: dict[tuple[str, str], Estimate] = field(default_factory=dict)
    """The seed-level 95% t-interval over ``per_seed`` (:func:`eval.intervals.seed_t_interval`; two or more seeds)."""
    delta_seed: dict[tuple[str, str], Estimate] = field(default_factory=dict)
    """The seed-level 95% t-interval of the paired difference, over the per-seed differences (two or more seeds)."""
    delta_p: dict[tuple[str, str], float] = field(default_factory=dict)
    """Two-sided p of the paired t-test of Δ = 0 over the per-seed differences (two or more seeds), unadjusted."""
    primary: dict[tuple[str, str], float | None] = field(default_factory=dict)
    """The Δ cells of declared primary comparisons (:func:`mark_primary`) → Holm-adjusted p (None without a p)."""


@dataclass
class Block:
    """The rows of one model."""

    title: str
    rows: list[Row]


@dataclass
class ResultTable:
    """A paper-style table: blocks of rows over (column, metric) cells."""

    caption: str
    row_header: str
    """``Method`` (Table 1) or ``Method(+DAPO)`` (Table 2)."""
    columns: list[str]
    """Benchmark titles, then ``Avg``."""
    metrics: list[str]
    """``pass@1`` and ``pass@<table_k>``."""
    blocks: list[Block]
    reference: str = "SFT"
    """Title of the reference row in the ``Δ vs …`` lines."""
    primary_family: int = 0
    """How many primary comparisons with a p-value the Holm adjustment ran over (:func:`mark_primary`)."""
    extra_columns: list[str] = field(default_factory=list)
    """Benchmark columns shown after ``Avg`` and left out of it (``data.extra_benchmarks``)."""

    @property
    def averaged_columns(self) -> list[str]:
        """The benchmark columns the ``Avg`` column averages: every one but ``Avg`` and :attr:`extra_columns`."""
        return [column for column in self.columns if column != AVERAGE and column not in self.extra_columns]

    @property
    def cells(self) -> list[tuple[str, str]]:
        return [(column, metric) for column in self.columns for metric in self.metrics]

    @property
    def has_paper_values(self) -> bool:
        return any(row.paper for block in self.blocks for row in block.rows)


def _metric_k(metric: str) -> int:
    return int(metric.split("@")[1])


def _groups(rows: Sequence[Row], columns: Sequence[str], k: int) -> tuple[list[int], list[list[np.ndarray]]] | None:
    """The seeds all ``rows`` share in every column and, per row, one [seeds, problems] matrix per column on those
    seeds and the problems all rows share in that column; None when a row lacks a column or nothing is shared."""
    if any(not row.evaluations.get(column) for row in rows for column in columns):
        return None
    seeds = sorted(set.intersection(*(set(row.evaluations[column]) for row in rows for column in columns)))
    if not seeds:
        return None
    groups: list[list[np.ndarray]] = [[] for _ in rows]
    for column in columns:
        problems = sorted(set.intersection(*(set(common_problems(row.evaluations[column], seeds)) for row in rows)))
        if not problems:
            return None
        for group, row in zip(groups, rows):
            group.append(value_matrix(row.evaluations[column], seeds, problems, k))
    return seeds, groups


def fill_estimates(table: ResultTable, reference_variant: str = REFERENCE_VARIANT) -> None:
    """Fills each row's ``ours`` (means), ``intervals``, ``per_seed`` and, where the block has a row of
    ``reference_variant``, ``delta`` from its ``evaluations``; ``Avg`` over :attr:`ResultTable.averaged_columns`."""
    benchmark_columns = table.averaged_columns
    for block in table.blocks:
        reference = next((row for row in block.rows if row.variant == reference_variant), None)
        if reference is not None:
            table.reference = reference.label
        for row in block.rows:
            for column, metric in table.cells:
                columns = benchmark_columns if column == AVERAGE else [column]
                k = _metric_k(metric)
                found = _groups([row], columns, k)
                if found is None:
                    row.ours[(column, metric)] = None
                    continue
                seeds, (groups,) = found
                cell = estimate(groups).scaled(100)
                row.ours[(column, metric)], row.intervals[(column, metric)] = cell.mean, cell
                means = 100 * per_seed_means(groups)
                row.per_seed[(column, metric)] = {seed: float(value) for seed, value in zip(seeds, means)}
                if (seed_level := seed_t_interval(unit_means(means, seeds))) is not None:
                    row.seed_intervals[(column, metric)] = seed_level
                if reference is not None and row is not reference:
                    if (paired := paired_rows(row, reference, columns, k)) is not None:
                        row.delta[(column, metric)], seed_level, p_value = paired
                        if seed_level is not None:
                            row.delta_seed[(column, metric)], row.delta_p[(column, metric)] = seed_level, p_value


def unit_means(per_seed: np.ndarray, seeds: Sequence) -> np.ndarray:
    """The per-seed values averaged within each top-level unit (:func:`common.grid.top_level_unit`: the base seed
    under ``experiment.base_seeds``, else the seed itself), what the seed-level t-interval and t-test run over."""
    return top_level_means(per_seed, [top_level_unit(seed) for seed in seeds])


def paired_rows(row: Row, other: Row, columns: Sequence[str], k: int
                ) -> tuple[Estimate, Estimate | None, float | None] | None:
    """``row − other`` in points over ``columns`` at pass@``k``, on the seeds and problems both evaluated: the paired
    bootstrap difference (same resamples), its seed-level t-interval and t-test p (:func:`seed_level_difference`;
    None, None below two top-level units); None when the rows share nothing."""
    paired = _groups([row, other], columns, k)
    if paired is None:
        return None
    seeds, (mine, theirs) = paired
    return paired_difference(mine, theirs).scaled(100), *(seed_level_difference(seeds, mine, theirs) or (None, None))


def seed_level_difference(seeds: Sequence, groups: Sequence[np.ndarray],
                          reference: Sequence[np.ndarray]) -> tuple[Estimate, float | None] | None:
    """The seed-level t-interval and two-sided t-test p of the paired difference ``groups − reference`` in points,
    over its per-seed values averaged within each top-level unit (:func:`unit_means`); None below two units."""
    differences = unit_means(100 * (per_seed_means(groups) - per_seed_means(reference)), seeds)
    if (seed_level := seed_t_interval(differences)) is None:
        return None
    return seed_level, seed_t_test(differences)


def endpoint_cell(endpoint: str) -> tuple[str, str]:
    """``"Avg pass@1"`` → ``("Avg", "pass@1")``: a declared endpoint (``report.primary_endpoints``) as a table cell."""
    column, _, metric = endpoint.rpartition(" ")
    return column, metric


def holm_family(p_values: dict) -> dict:
    """Holm-adjusted p (:func:`eval.intervals.holm`) of every key with a p-value; None for keys without one. A
    comparison whose per-seed differences have no spread (:data:`eval.intervals.NO_SPREAD`) stays in the family as
    p = 1, so the family keeps its registered size and the others are adjusted no less, and keeps NO_SPREAD."""
    tested = [key for key, value in p_values.items() if value is not None]
    adjusted = dict(zip(tested, holm([1.0 if no_spread(p_values[key]) else p_values[key] for key in tested])))
    return {key: NO_SPREAD if no_spread(p_values.get(key)) else adjusted.get(key) for key in p_values}


def mark_primary(table: ResultTable, endpoints: Sequence[str], arms: set[str]) -> list[str]:
    """Marks the primary comparisons of ``table``: the ``Δ vs`` cells of the rows whose variant is in ``arms`` in the
    ``endpoints`` (``"Avg pass@1"``: column and metric), over every block; sets ``Row.primary`` to their
    Holm-adjusted p over that family (the cells with a t-test p) and ``table.primary_family`` to its size. Returns
    the endpoints this table has no cell for."""
    cells = [endpoint_cell(endpoint) for endpoint in endpoints]
    found = {(b, r, cell): row.delta_p.get(cell)
             for b, block in enumerate(table.blocks) for r, row in enumerate(block.rows)
             if row.variant in arms for cell in cells if cell in row.delta}
    for (b, r, cell), adjusted in holm_family(found).items():
        table.blocks[b].rows[r].primary[cell] = adjusted
    table.primary_family = sum(value is not None for value in found.values())
    return [endpoint for endpoint, cell in zip(endpoints, cells) if cell not in table.cells]


@dataclass(frozen=True)
class Gain:
    """What RL added to one arm: Table 2 − Table 1 of the same variant, in points of the ``Avg`` column."""

    label: str
    variant: str
    gain: Estimate
    """Paired on the arm's own seeds and problems (the RL run of seed s starts from the SFT model of seed s)."""
    versus_reference: Estimate | None
    """``gain`` − the reference arm's gain, paired on the seeds and problems all four evaluations share (a
    difference in differences); None for the reference itself or when it has no gain."""
    per_seed: dict[int, float]
    seed_interval: Estimate | None = None
    """The seed-level 95% t-interval of ``gain`` over ``per_seed`` (two or more seeds)."""
    versus_seed: Estimate | None = None
    """The seed-level 95% t-interval of ``versus_reference`` over the per-seed differences in differences."""
    versus_p: float | None = None
    """Two-sided p of the t-test of ``versus_reference`` = 0 over those per-seed values, unadjusted."""
    versus_control: Estimate | None = None
    """The arm's level after RL − the control's (Base + DAPO, ``experiment.rl_from_base``) in the same Avg cell of
    Table 2, paired on the seeds and problems both evaluated: does the arm end above RL from the base model? None for
    the control itself or without one."""
    versus_control_seed: Estimate | None = None
    """The seed-level 95% t-interval of ``versus_control`` over its per-seed differences."""
    versus_control_p: float | None = None
    """Two-sided p of the t-test of ``versus_control`` = 0 over those per-seed values, unadjusted (exploratory)."""


def rl_gains(before: ResultTable, after: ResultTable, metric: str, reference_variant: str = REFERENCE_VARIANT,
             control_variant: str = BASE_VARIANT) -> list[tuple[str, list[Gain]]]:
    """Per block (model): the :class:`Gain` in ``metric`` of every Table 2 row whose variant has a Table 1 row,
    in Table 2's order. Each bootstrap replicate is linear in the values, so a gain's replicates are those of the
    per-(seed, problem) differences ``after − before``."""
    columns = after.averaged_columns
    k = _metric_k(metric)
    result = []
    for block_before, block_after in zip(before.blocks, after.blocks):
        pre_rl = {row.variant: row for row in block_before.rows}
        pairs = [(row, pre_rl[row.variant]) for row in block_after.rows if row.variant in pre_rl]
        reference = next(((a, b) for a, b in pairs if a.variant == reference_variant), None)
        control = next((row for row in block_after.rows if row.variant == control_variant), None)
        gains = []
        for row_after, row_before in pairs:
            found = _groups([row_after, row_before], columns, k)
            if found is None:
                continue
            seeds, (after_groups, before_groups) = found
            differences = [a - b for a, b in zip(after_groups, before_groups)]
            per_seed = 100 * per_seed_means(differences)
            versus = versus_seed = versus_p = None
            if reference is not None and row_after is not reference[0]:
                shared = _groups([row_after, row_before, *reference], columns, k)
                if shared is not None:
                    mine_after, mine_before, theirs_after, theirs_before = shared[1]
                    mine = [a - b for a, b in zip(mine_after, mine_before)]
                    theirs = [a - b for a, b in zip(theirs_after, theirs_before)]
                    versus = paired_difference(mine, theirs).scaled(100)
                    versus_seed, versus_p = seed_level_difference(shared[0], mine, theirs) or (None, None)
            has_control = control is not None and row_after is not control
            ended = paired_rows(row_after, control, columns, k) if has_control else None
            versus_control, versus_control_seed, versus_control_p = ended or (None, None, None)
            gains.append(Gain(row_after.label, row_after.variant, estimate(differences).scaled(100), versus,
                              {seed: float(value) for seed, value in zip(seeds, per_seed)},
                              seed_t_interval(unit_means(per_seed, seeds)), versus_seed, versus_p,
                              versus_control, versus_control_seed, versus_control_p))
        result.append((block_after.title, gains))
    return result


def primary_gains(by_metric: dict[str, Sequence[tuple[str, Sequence[Gain]]]], endpoints: Sequence[str],
                  arms: set[str]) -> dict[tuple[str, str, str], float | None]:
    """The RL gains' primary comparisons, (block title, row label, metric) → Holm-adjusted p (None without a
    p-value): the ``Δ vs SFT`` of every arm whose variant is in ``arms``, in each metric whose ``Avg <metric>`` is
    among ``endpoints`` (``by_metric``: metric → :func:`rl_gains`), adjusted together (:func:`holm_family` of their
    ``versus_p``)."""
    return holm_family({(title, gain.label, metric): gain.versus_p for metric, blocks in by_metric.items()
                        if f"{AVERAGE} {metric}" in endpoints for title, block in blocks for gain in block
                        if gain.variant in arms and gain.versus_reference is not None})


def primary_gains_note(primary: dict[tuple[str, str, str], float | None], endpoints: Sequence[str]) -> str:
    """The line above the RL gain table that says which of its ``Δ vs SFT`` cells are primary (:func:`primary_gains`)
    and which came out at p(Holm) ≤ 0.05."""
    if not endpoints:
        return ("No primary endpoint is declared for the RL gain (`report.primary_endpoints.rl_gain`): every Δ is "
                "exploratory.")
    tested = sum(value is not None for value in primary.values())
    below = [f"{title} / {label} Avg {metric} (p(Holm) {p_value_text(adjusted)})"
             for (title, label, metric), adjusted in primary.items() if adjusted is not None and adjusted <= 0.05]
    return (f"Primary comparisons (`report.primary_endpoints.rl_gain`: {', '.join(endpoints)}; the primary arms' Δ "
            f"cells, marked p(Holm)): {len(primary)}, of which {tested} with a p-value (two or more seeds), "
            "Holm-adjusted over those; p from the t-test over the per-seed differences in differences (df = seeds − "
            f"1). Every other Δ cell is exploratory ({EXPLORATORY}). p(Holm) ≤ 0.05: "
            f"{'; '.join(below) if below else 'none'}.")


def primary_note(table: ResultTable, key: str, endpoints: Sequence[str], absent: Sequence[str]) -> str:
    """The line under a table that says which Δ cells are primary, how they were adjusted and which came out below
    0.05; ``key`` names the config entry (``report.primary_endpoints.sft``)."""
    if not endpoints:
        return f"No primary endpoint is declared for this table (`{key}`): every Δ cell is exploratory."
    found = [(block.title, row.label, cell, row.delta[cell].mean, adjusted) for block in table.blocks
             for row in block.rows for cell, adjusted in row.primary.items()]
    text = (f"Primary comparisons (`{key}`: {', '.join(endpoints)}; the primary arms' Δ cells, marked p(Holm)): "
            f"{len(found)}, of which {table.primary_family} with a p-value (two or more seeds), Holm-adjusted over "
            "those; p from the paired t-test over the per-seed differences (df = seeds − 1). Every other Δ cell is "
            f"exploratory ({EXPLORATORY}).")
    below = [f"{title} / {label} {' '.join(cell)} {_signed(mean)} (p(Holm) {p_value_text(adjusted)})"
             for title, label, cell, mean, adjusted in found if adjusted is not None and adjusted <= 0.05]
    text += f" p(Holm) ≤ 0.05: {'; '.join(below) if below else 'none'}."
    if absent:
        text += f" Declared endpoints this table has no cell for: {', '.join(absent)}."
    return text


def unjudged_note(table: ResultTable) -> str:
    """The line under a table that counts the samples left without a verdict: scored 0 because the scorer's time
    limit passed, also when judged once more with a longer limit (``time_limited_samples`` after re-judging,
    ``rejudged_samples`` in each ``metrics.json``; an evaluation written before re-judging existed has no
    ``rejudged_samples`` and was never re-judged)."""
    total = unjudged = rejudged = 0
    listed, never = [], []
    for block in table.blocks:
        for row in block.rows:
            for column, by_seed in row.evaluations.items():
                for seed, doc in by_seed.items():
                    samples, limited = doc["n"] * len(doc["correct_counts"]), doc.get("time_limited_samples", 0)
                    total, unjudged = total + samples, unjudged + limited
                    rejudged += doc.get("rejudged_samples", 0)
                    name = f"{block.title} / {row.label} / {column} / seed {seed}"
                    if limited:
                        listed.append(f"{name}: {limited} of {samples}")
                        if "rejudged_samples" not in doc:
                            never.append(name)
    text = (f"Unjudged samples (no verdict within the scorer's time limit, nor when judged once more with the longer "
            f"`eval.rejudge_timeout_s`; scored 0 above): {unjudged} of {total}; {rejudged} re-judged.")
    if listed:
        text += f" By evaluation: {'; '.join(listed)}."
    if never:
        text += (f" Never re-judged (evaluated before re-judging existed; `python -m pipeline.run "
                 f"force=[<eval command>]` samples and judges them again): {'; '.join(never)}.")
    return text


def load_paper_tables(path: Path = PAPER_TABLES) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["tables"]


def attach_paper_values(table: ResultTable, phase: str, paper_tables: dict) -> None:
    """Fills ``Row.paper`` for every cell the paper reports under the same model, row (:data:`PAPER_ROWS` of the
    row's variant), column and metric titles."""
    for block in table.blocks:
        for row in block.rows:
            paper_row = paper_tables.get(phase, {}).get(block.title, {}).get(PAPER_ROWS.get(row.variant), {})
            for column, metric in table.cells:
                value = paper_row.get(column, {}).get(metric)
                if value is not None:
                    row.paper[(column, metric)] = value


def rank_marks(values: Sequence[float | None]) -> list[str]:
    """``best`` / ``second`` / ``""`` per value, ranked on values rounded to one decimal (dense ranking); nothing is
    marked where fewer than two values are present (nothing to rank)."""
    rounded = [None if v is None else round(v, 1) for v in values]
    if sum(v is not None for v in rounded) < 2:
        return [""] * len(rounded)
    distinct = sorted({v for v in rounded if v is not None}, reverse=True)
    marks = {value: mark for value, mark in zip(distinct, ("best", "second"))}
    return [marks.get(v, "") if v is not None else "" for v in rounded]


def interval_marks(estimates: Sequence[Estimate | None]) -> list[str]:
    """``best`` / ``second`` / ``n.s.`` / ``""`` per cell of one column.

    The top printed value (:func:`rank_marks`) is ``best`` when it is one row whose interval lies above every
    other row's, else ``n.s.``. After a ``best``, the next value is ``second`` when it is one row whose interval
    lies above every row below it, else ``n.s.``; after an ``n.s.`` nothing else is marked. A column with fewer
    than two cells has nothing to rank: no mark.
    """
    ranks = rank_marks([None if e is None else e.mean for e in estimates])
    marks = [""] * len(estimates)
    present = {i for i, e in enumerate(estimates) if e is not None}
    outranked: set[int] = set()
    for level in ("best", "second"):
        leaders = [i for i, rank in enumerate(ranks) if rank == level]
        if not leaders:
            break
        outranked |= set(leaders)
        below = present - outranked
        separated = len(leaders) == 1 and all(estimates[leaders[0]].separated_from(estimates[j]) for j in below)
        for i in leaders:
            marks[i] = level if separated else NOT_SEPARATED
        if not separated:
            break
    return marks


def _marks(table: ResultTable) -> dict[tuple[int, int, tuple[str, str]], str]:
    marks = {}
    for b, block in enumerate(table.blocks):
        for cell in table.cells:
            for r, mark in enumerate(interval_marks([row.intervals.get(cell) for row in block.rows])):
                marks[(b, r, cell)] = mark
    return marks


def _number(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def _signed(value: float) -> str:
    """``+1.5`` / ``−1.5`` (a true minus sign); a value that rounds to zero is ``+0.0``."""
    text = f"{value:+.1f}"
    return "+0.0" if text == "-0.0" else text.replace("-", "−")


def _interval(estimate_: Estimate, signed: bool = False) -> str:
    show = _signed if signed else _number
    return f"[{show(estimate_.low)}, {show(estimate_.high)}]"


def signed_estimate(estimate_: Estimate, seed_level: Estimate | None = None) -> str:
    """A difference with its interval and, when given, its seed-level interval:
    ``+12.5 [+0.0, +25.0] ⟨−3.0, +28.0⟩``."""
    return f"{_signed(estimate_.mean)} {_interval(estimate_, signed=True)}{seed_interval_text(seed_level, signed=True)}"


def seed_interval_text(seed_level: Estimate | None, signed: bool = False) -> str:
    """`` ⟨low, high⟩``, the seed-level t-interval beside a bootstrap interval; empty without one (one seed)."""
    if seed_level is None:
        return ""
    show = _signed if signed else lambda value: _number(value).replace("-", "−")  # t-intervals may pass below 0
    return f" ⟨{show(seed_level.low)}, {show(seed_level.high)}⟩"


def p_value_text(p_value: float | None) -> str:
    """``0.031``; ``<0.001`` below that; ``n/a`` without a p-value (one seed); ``n/a (no spread)`` when every seed
    gave the same difference (:data:`eval.intervals.NO_SPREAD`: no t-test)."""
    if no_spread(p_value):
        return "n/a (no spread)"
    return "n/a" if p_value is None else "<0.001" if p_value < 0.001 else f"{p_value:.3f}"


def p_value_record(p_value: float | None) -> float | str | None:
    """A p-value as the CSV and the metrics record it: the number, None without one, ``"no spread"`` for
    :data:`eval.intervals.NO_SPREAD` (JSON has no NaN)."""
    return "no spread" if no_spread(p_value) else p_value


def comparison_text(primary: dict, cell) -> str:
    """What a Δ cell says of its test: `` p(Holm) 0.031`` for a primary comparison, `` expl.`` for any other."""
    return f" p(Holm) {p_value_text(primary[cell])}" if cell in primary else f" {EXPLORATORY}"


def delta_text(row: Row, cell: tuple[str, str]) -> str:
    """A ``Δ vs`` cell: the paired difference, its bootstrap and seed-level intervals, and its test
    (:func:`comparison_text`)."""
    return signed_estimate(row.delta[cell], row.delta_seed.get(cell)) + comparison_text(row.primary, cell)


def delta_label(table: ResultTable) -> str:
    return f"Δ vs {table.reference}"


def to_markdown(table: ResultTable) -> str:
    """GitHub Markdown: mean [95% bootstrap interval] ⟨seed-level t-interval⟩; bold best, ``<u>`` second, ``n.s.``
    where the bootstrap intervals overlap; the paper's value in parentheses; a ``Δ vs SFT`` line under each row with
    a paired difference, its test (:func:`comparison_text`)."""
    marks = _marks(table)
    header = [table.row_header] + [f"{column} {metric}" for column, metric in table.cells]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + [":---:"] * len(table.cells)) + "|"]
    for b, block in enumerate(table.blocks):
        lines.append("| " + " | ".join([f"***{block.title}***"] + [""] * len(table.cells)) + " |")
        for r, row in enumerate(block.rows):
            cells = []
            for cell in table.cells:
                text = _number(row.ours.get(cell))
                mark = marks[(b, r, cell)]
                text = f"**{text}**" if mark == "best" else f"<u>{text}</u>" if mark == "second" else text
                if cell in row.intervals:
                    text += f" {_interval(row.intervals[cell])}{seed_interval_text(row.seed_intervals.get(cell))}"
                if mark == NOT_SEPARATED:
                    text += f" {NOT_SEPARATED}"
                if cell in row.paper:
                    text += f" ({row.paper[cell]:.1f})"
                cells.append(text)
            lines.append("| " + " | ".join([row.label, *cells]) + " |")
            if row.delta:
                deltas = [delta_text(row, cell) if cell in row.delta else MISSING for cell in table.cells]
                lines.append("| " + " | ".join([f"<sub>{delta_label(table)}</sub>",
                                                *(f"<sub>{d}</sub>" for d in deltas)]) + " |")
    return "\n".join(lines) + "\n"


def to_csv(table: ResultTable) -> str:
    """Long format: one line per (model, method, column, metric): mean, 95% interval, mark, the paired difference
    to the reference row and its interval, the paper's value, the number of seeds, the seed-level t-intervals of the
    cell and of its difference, the difference's t-test p, its role (``primary`` / ``exploratory``) and Holm-adjusted
    p, and one column per seed."""
    seeds = sorted({seed for block in table.blocks for row in block.rows for values in row.per_seed.values()
                    for seed in values})
    header = ["model", "method", "variant", "column", "metric", "mean", "ci_low", "ci_high", "mark",
              "delta_reference", "delta", "delta_low", "delta_high", "paper", "num_seeds", "seed_t_low",
              "seed_t_high", "delta_seed_t_low", "delta_seed_t_high", "delta_p_t", "delta_role", "delta_p_holm",
              *(f"seed {seed}" for seed in seeds)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    marks = _marks(table)

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.4f}"

    def p_number(value: float | None) -> str:
        return "" if value is None else "no spread" if no_spread(value) else f"{value:.6g}"

    for b, block in enumerate(table.blocks):
        for r, row in enumerate(block.rows):
            for cell in table.cells:
                interval, delta = row.intervals.get(cell), row.delta.get(cell)
                seed_level, delta_seed = row.seed_intervals.get(cell), row.delta_seed.get(cell)
                per_seed = row.per_seed.get(cell, {})
                role = "" if delta is None else "primary" if cell in row.primary else "exploratory"
                writer.writerow([block.title, row.label, row.variant, *cell, number(row.ours.get(cell)),
                                 number(interval and interval.low), number(interval and interval.high),
                                 marks[(b, r, cell)], table.reference if delta else "",
                                 number(delta and delta.mean), number(delta and delta.low),
                                 number(delta and delta.high), number(row.paper.get(cell)), len(per_seed),
                                 number(seed_level and seed_level.low), number(seed_level and seed_level.high),
                                 number(delta_seed and delta_seed.low), number(delta_seed and delta_seed.high),
                                 p_number(row.delta_p.get(cell)), role, p_number(row.primary.get(cell)),
                                 *(number(per_seed.get(seed)) for seed in seeds)])
    return buffer.getvalue()


def _latex_escape(text: str) -> str:
    return text.replace("\\", "\\textbackslash{}").replace("&", "\\&").replace("%", "\\%").replace("_", "\\_") \
        .replace("#", "\\#")


def _latex_math(text: str) -> str:
    """The minus signs, angle brackets and less-than signs of a cell's text as LaTeX math."""
    return text.replace("−", "$-$").replace("⟨", "$\\langle$").replace("⟩", "$\\rangle$").replace("<", "$<$")


def to_latex(table: ResultTable) -> str:
    """The paper's tabular: grouped pass@1 / pass@k columns, a block title per model, \\textbf and \\underline
    where the intervals separate (``n.s.`` superscript where not), the intervals in \\scriptsize, and a
    ``Δ vs SFT`` line per row with its test."""
    marks = _marks(table)
    width = 1 + len(table.cells)
    per_column = len(table.metrics)
    # a rule after the column before Avg, and after Avg itself when extra columns follow it
    ruled = [i < len(table.columns) - 1 and AVERAGE in table.columns[i:i + 2] for i in range(len(table.columns))]
    spec = "l|" + "".join("c" * per_column + (" | " if rule else " ") for rule in ruled).rstrip()
    column_titles = [f"\\multicolumn{{{per_column}}}{{c{'|' if rule else ''}}}"
                     f"{{\\textbf{{{_latex_escape(column)}}}}}" for column, rule in zip(table.columns, ruled)]
    lines = ["\\begin{table*}[t]", "\\centering", "\\small", "\\resizebox{\\textwidth}{!}{%",
             f"\\begin{{tabular}}{{{spec}}}", "\\hline",
             f"\\multirow{{2}}{{*}}{{\\textbf{{{_latex_escape(table.row_header)}}}}} & "
             + " & ".join(column_titles) + " \\\\",
             " & " + " & ".join(metric for _, metric in table.cells) + " \\\\", "\\hline"]
    for b, block in enumerate(table.blocks):
        lines += [f"\\multicolumn{{{width}}}{{c}}{{\\textbf{{\\textit{{{_latex_escape(block.title)}}}}}}} \\\\",
                  "\\hline"]
        for r, row in enumerate(block.rows):
            cells = []
            for cell in table.cells:
                text = _number(row.ours.get(cell))
                mark = marks[(b, r, cell)]
                text = f"\\textbf{{{text}}}" if mark == "best" else f"\\underline{{{text}}}" if mark == "second" \
                    else text
                if mark == NOT_SEPARATED:
                    text += f"\\textsuperscript{{{NOT_SEPARATED}}}"
                if cell in row.intervals:
                    text += f" {{\\scriptsize {_interval(row.intervals[cell])}" \
                            f"{_latex_math(seed_interval_text(row.seed_intervals.get(cell)))}}}"
                if cell in row.paper:
                    text += f" {{\\scriptsize({row.paper[cell]:.1f})}}"
                cells.append(text)
            lines.append(" & ".join([_latex_escape(row.label), *cells]) + " \\\\")
            if row.delta:
                deltas = [f"{{\\scriptsize {_latex_math(delta_text(row, cell))}}}" if cell in row.delta else MISSING
                          for cell in table.cells]
                lines.append(" & ".join([f"{{\\scriptsize\\quad $\\Delta$ vs {_latex_escape(table.reference)}}}",
                                         *deltas]) + " \\\\")
        lines.append("\\hline")
    lines += ["\\end{tabular}%", "}", f"\\caption{{{_latex_escape(table.caption)}}}", "\\end{table*}"]
    return "\n".join(lines) + "\n"


TABLE_NOTE = ("Each cell: mean over seeds and problems [95% bootstrap interval: seeds, then problems, resampled "
              "2000 times with a fixed seed; docs/evaluation.md]. **Bold** / <u>underline</u>: best / second best "
              "whose interval lies above the other rows' (the second: above the rows below it); n.s.: the top value's "
              "interval overlaps another row's, so no rank is marked from there on. <sub>{delta}</sub>: the paired "
              "difference (same seeds, same problems, same resamples) in points; pairing removes the problems' shared "
              "difficulty, so a Δ interval can exclude 0 where the two cells' intervals overlap.")
"""The note under every table: what a cell, a mark and a Δ are."""
INTERVALS_LEGEND = ("[ ]: 95% bootstrap interval over seeds and problems (with few seeds it understates the "
                    "seed-to-seed spread); ⟨ ⟩: seed-level 95% t-interval over the per-seed means (df = seeds − 1; "
                    "docs/evaluation.md, \"Intervals with few seeds\"); p(Holm): a primary comparison's Holm-adjusted "
                    "p; expl.: exploratory, no test.")
"""The one-line legend under every table with both intervals."""
