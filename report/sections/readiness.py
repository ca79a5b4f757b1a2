"""RL readiness: which start RL can work with, read from Table 1 before any RL step.

Per Table 1 row (the base model and every SFT arm), from its pre-RL evaluations at the rollout group size
G = ``rl.rollout_n``, unbiased per problem (c of n correct), then the mean over problems and over benchmarks (Avg):

* coverage: pass@G = 1 − C(n−c, G)/C(n, G), against the base model's (paired on seeds and problems,
  :func:`report.tables.fill_estimates` with the base row as reference);
* the predicted shares of the groups of G rollouts DAPO's dynamic sampling would see: all wrong C(n−c, G)/C(n, G)
  = 1 − pass@G, mixed (both verdicts: the groups it trains on, :func:`report.sections.headroom.mixed_groups_per_seed`)
  and all right = 1 − all wrong − mixed.

When RL arms have Table 2 evaluations too: Spearman's ρ, over their (arm, seed) pairs, of the predicted mixed share
and of the coverage against the base with the measured RL gain in Avg pass@1 (:func:`report.tables.rl_gains`), with
the interval of the bootstrap over arms (:func:`eval.intervals.cluster_spearman`), beside each arm the share of
groups DAPO kept in its runs (the predictor's calibration), and per model a scatter plot of those points.
"""
from __future__ import annotations

import math
from pathlib import Path
from statistics import fmean
from typing import NamedTuple

from eval.intervals import cluster_spearman
from report.analyses import method_colour, pyplot, save_figure
from report.collect import Collected, PhaseTable
from report.paper_figures import slug
from report.sections import Section
from report.sections.headroom import mixed_groups_per_seed, rho_text
from report.sections.rl_gain import groups_kept_per_seed
from report.tables import (
    AVERAGE,
    MISSING,
    Block,
    ResultTable,
    Row,
    fill_estimates,
    rl_gains,
    seed_interval_text,
    signed_estimate,
)
from common.grid import Grid
from common.paths import BASE_VARIANT


class ReadinessPoint(NamedTuple):
    """One RL arm and seed: its predictors (percent; coverage against the base: None without a base row) and its RL
    gain in Avg pass@1 (points)."""

    model: str
    arm: str
    seed: int
    mixed: float
    coverage_vs_base: float | None
    gain: float


def render(grid: Grid, collected: Collected) -> Section:
    """``## RL readiness``, with one scatter plot per model of its (arm, seed) points; metrics ``readiness``."""
    lines, metrics, points = readiness_section(collected.tables, grid.cfg.rl.rollout_n,
                                               groups_kept_per_seed(grid.models, grid.rl_variants))
    section = Section(["## RL readiness: what Table 1 predicts for RL", "", *lines], metrics={"readiness": metrics})
    for model in dict.fromkeys(point.model for point in points):
        relative = f"plots/readiness_{slug(model)}.png"
        plot_readiness([point for point in points if point.model == model], f"{model} · RL readiness",
                       collected.out_dir / relative)
        section.add_output(relative, f"predicted mixed share against the RL gain per arm and seed, {model}")
        section.lines += [f"![RL readiness, {model}]({relative})", ""]
    return section


def plot_readiness(points: list[ReadinessPoint], title: str, path: Path) -> None:
    """The predicted mixed share (x) against the measured RL gain (y), one point per (arm, seed), one colour per
    arm (:func:`report.analyses.method_colour`)."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(5.6, 3.8), dpi=100)
    for arm in dict.fromkeys(point.arm for point in points):
        mine = [point for point in points if point.arm == arm]
        axes.scatter([p.mixed for p in mine], [p.gain for p in mine], label=arm, color=method_colour(arm), s=24)
    axes.axhline(0.0, color="grey", linewidth=0.8)
    axes.set_xlabel("predicted mixed groups before RL (%)")
    axes.set_ylabel("RL gain in Avg pass@1 (points)")
    axes.set_title(title, fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7)
    save_figure(figure, path)


def coverage_table(before: ResultTable, group_size: int) -> ResultTable:
    """Table 1's rows with the single metric pass@G (G = ``group_size``), filled with Δ against the base row."""
    table = ResultTable(caption="", row_header=before.row_header, columns=before.columns,
                        metrics=[f"pass@{group_size}"], extra_columns=before.extra_columns,
                        blocks=[Block(block.title, [Row(row.label, row.variant, evaluations=row.evaluations)
                                                    for row in block.rows]) for block in before.blocks])
    fill_estimates(table, reference_variant=BASE_VARIANT)
    return table


def readiness_section(collected: dict[str, PhaseTable], group_size: int,
                      kept: dict[tuple[int, str], dict[int, float]]) -> tuple[list[str], dict, list[ReadinessPoint]]:
    """The module docstring's table and correlations, and the (arm, seed) points they are computed over. ``kept``:
    (model index, variant) → seed → share of groups DAPO kept (:func:`report.sections.rl_gain.groups_kept_per_seed`)."""
    if "sft" not in collected:
        return ["Skipped: needs Table 1 (before RL) evaluations.", ""], {}, []
    before = collected["sft"][0]
    if any(doc["n"] < group_size for block in before.blocks for row in block.rows
           for by_seed in row.evaluations.values() for doc in by_seed.values()):
        return [f"Skipped: some Table 1 evaluation drew fewer samples per problem than the rollout group size "
                f"G = {group_size} (rl.rollout_n).", ""], {}, []
    coverage = coverage_table(before, group_size)
    cell = (AVERAGE, f"pass@{group_size}")
    gains = ({(m, gain.variant): gain.per_seed
              for m, (_, block) in enumerate(rl_gains(before, collected["rl"][0], "pass@1")) for gain in block}
             if "rl" in collected else {})
    lines = [f"Per start, from its Table 1 samples at the rollout group size G = {group_size}, unbiased per problem, "
             "mean over problems then benchmarks, in percent: coverage = pass@G, Δ vs the base model paired on seeds "
             "and problems (mean [95% interval] ⟨seed-level t-interval⟩); the predicted shares of groups of G "
             "rollouts that are all wrong (1 − pass@G), mixed (both verdicts: the groups DAPO's dynamic sampling "
             "trains on) and all right, mean over seeds. The benchmark problems stand in for the RL prompts, at the "
             "evaluation's temperature. Beside them, for the RL arms: the share of groups DAPO kept in training, "
             "and the RL gain in Avg pass@1 (Table 2 − Table 1, mean over seeds).", "",
             f"| model | start | seeds | coverage pass@{group_size} | Δ vs base | all wrong | mixed | all right | "
             "groups DAPO kept | RL gain in Avg pass@1 |",
             "|---|---|:---:|:---:|:---:|:---:|:---:|:---:|:---:|:---:|"]
    metrics: dict = {}
    points: list[ReadinessPoint] = []
    for m, block in enumerate(coverage.blocks):
        rows_before = {row.variant: row for row in before.blocks[m].rows}
        base = next((row for row in block.rows if row.variant == BASE_VARIANT), None)
        for row in block.rows:
            if cell not in row.per_seed:
                continue
            covered = row.per_seed[cell]
            mixed = {seed: 100 * share for seed, share in
                     mixed_groups_per_seed(rows_before[row.variant], before.averaged_columns, group_size).items()}
            wrong = {seed: 100 - value for seed, value in covered.items()}
            right = {seed: 100 - wrong[seed] - mixed[seed] for seed in mixed if seed in wrong}
            shares = list(kept.get((m, row.variant), {}).values())
            gain = gains.get((m, row.variant), {})
            level = {"coverage": row.ours[cell], "all_wrong": fmean(wrong.values()), "mixed": fmean(mixed.values()),
                     "all_right": fmean(right.values()),
                     **({"coverage_vs_base": [row.delta[cell].mean, row.delta[cell].low, row.delta[cell].high]}
                        if cell in row.delta else {}),
                     **({"groups_kept": 100 * fmean(shares)} if shares else {}),
                     **({"rl_gain": fmean(gain.values())} if gain else {})}
            metrics[f"{block.title}/{row.label}"] = level
            versus = signed_estimate(row.delta[cell], row.delta_seed.get(cell)) if cell in row.delta else MISSING
            kept_text = f"{level['groups_kept']:.1f}" if shares else MISSING
            gain_text = f"{level['rl_gain']:+.1f}" if gain else MISSING
            lines.append(f"| {block.title} | {row.label} | {len(covered)} | {level['coverage']:.1f}"
                         f"{seed_interval_text(row.seed_intervals.get(cell))} | {versus} | {level['all_wrong']:.1f} | "
                         f"{level['mixed']:.1f} | {level['all_right']:.1f} | {kept_text} | {gain_text} |")
            for seed in sorted(set(gain) & set(mixed)):
                versus_base = (covered[seed] - base.per_seed[cell][seed]
                               if base is not None and seed in base.per_seed.get(cell, {}) else None)
                points.append(ReadinessPoint(block.title, row.label, seed, mixed[seed], versus_base, gain[seed]))
    lines.append("")
    if not gains:
        return lines + ["The correlation with the RL gain needs Table 2 (after RL) evaluations.", ""], metrics, []
    correlations = {}
    for name in ("mixed", "coverage_vs_base"):
        having = [p for p in points if getattr(p, name) is not None]
        correlations[name] = cluster_spearman([getattr(p, name) for p in having], [p.gain for p in having],
                                              [(p.model, p.arm) for p in having])
    arms = len({(p.model, p.arm) for p in points})
    lines += [f"Spearman's ρ with the RL gain in Avg pass@1 over {len(points)} (arm, seed) pairs of {arms} RL arms "
              "[95% interval, arms resampled with all their seeds, `eval.intervals.cluster_spearman`]: "
              f"predicted mixed share {rho_text(correlations['mixed'])}; coverage against the base "
              f"{rho_text(correlations['coverage_vs_base'])}.", ""]
    for name, rho in correlations.items():
        if not math.isnan(rho.estimate.mean):
            metrics[f"spearman_{name}"] = rho.estimate.mean
        if not math.isnan(rho.estimate.low):
            metrics[f"spearman_{name} 95% arms"] = [rho.estimate.low, rho.estimate.high]
    metrics["points"], metrics["arms"] = len(points), arms
    return lines, metrics, points
