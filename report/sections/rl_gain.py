"""The RL gain of every RL arm (Table 2 − Table 1, paired), that gain minus SFT's, its level after RL against Base +
DAPO's (the control), and the share of the prompt groups DAPO kept (:func:`report.tables.rl_gains`,
:func:`common.tracking.dapo_groups_kept`)."""
from __future__ import annotations

from report.analyses.iou import read_metrics_log
from report.collect import Collected, PhaseTable
from report.sections import Section
from report.tables import (
    AVERAGE,
    INTERVALS_LEGEND,
    MISSING,
    ResultTable,
    comparison_text,
    delta_label,
    p_value_record,
    primary_gains,
    primary_gains_note,
    rl_gains,
    signed_estimate,
)
from common.grid import Grid, ModelGrid
from common.paths import BASE_VARIANT, RL_DISCARDED_GROUPS, RL_GROUPS_KEPT, TRAINING_METRICS_FILE
from common.tracking import dapo_groups_kept


def render(grid: Grid, collected: Collected) -> Section:
    """``## RL gain per arm``; metrics ``rl_gain``."""
    more, metrics = rl_gain_section(collected.tables, groups_kept_per_seed(grid.models, grid.rl_variants),
                                    collected.endpoints["rl_gain"], collected.primary)
    return Section(["## RL gain per arm", "", *more], metrics={"rl_gain": metrics})


def rl_gain_section(collected: dict[str, PhaseTable], kept: dict[tuple[int, str], dict[int, float]],
                    endpoints: list[str], arms: set[str]) -> tuple[list[str], dict]:
    """Per RL arm: Table 2 − Table 1 of the same arm in each Table 2 metric's Avg column, paired on seeds and
    problems, and that gain minus SFT's (:func:`report.tables.rl_gains`), each with its seed-level t-interval; the
    ``Δ vs SFT`` of ``arms`` in ``endpoints`` (``report.primary_endpoints.rl_gain``) are primary comparisons with
    Holm-adjusted p-values (:func:`report.tables.primary_gains`), the others exploratory. Each gain stands beside the
    arm's levels before and after RL (its Avg cells in Table 1 and Table 2: a gain alone hides where it ends) and,
    where the grid runs DAPO from the base model, the level after RL minus that control's (exploratory). Beside them
    the share of the prompt groups DAPO kept in the arm's RL runs (``kept``: (model index, variant) → seed → share,
    :func:`groups_kept_per_seed`)."""
    if "sft" not in collected or "rl" not in collected:
        return ["Skipped: needs both Table 1 (before RL) and Table 2 (after RL) evaluations.", ""], {}
    before, after = collected["sft"][0], collected["rl"][0]
    by_metric = {metric: rl_gains(before, after, metric) for metric in after.metrics}
    primary = primary_gains(by_metric, endpoints, arms)
    first = after.metrics[0]
    controls = {gain.label for blocks in by_metric.values() for _, gains in blocks for gain in gains
                if gain.variant == BASE_VARIANT}
    control = f"Δ after RL vs {' / '.join(sorted(controls))} + DAPO" if controls else None
    lines = [f"Table 2 − Table 1 of the same arm, Avg column, in points: mean [95% interval] over the seeds and "
             f"problems both evaluated, paired (same resamples); <sub>{delta_label(after)}</sub>: that gain minus "
             f"{after.reference}'s gain, paired on the seeds all four evaluations share.", "", INTERVALS_LEGEND, "",
             *([f"{control} (the control, exploratory): the arm's Table 2 level minus RL from the base model's, "
                "paired on the seeds both evaluated; a larger gain from a lower start can still end below it.", ""]
               if control else []),
             primary_gains_note(primary, endpoints), "",
             "| model | arm | seeds | " + " | ".join(f"Avg {metric} before → after RL | RL gain in Avg {metric} | "
                                                      f"{delta_label(after)}" + (f" | {control}" if control else "")
                                                      for metric in after.metrics)
             + f" | {first} gain per seed | groups DAPO kept |",
             "|---|---|:---:|" + (":---:|" * (4 if control else 3)) * len(after.metrics) + ":---:|:---:|"]
    metrics = {}
    for m, blocks in enumerate(zip(*by_metric.values())):  # one model: its (title, gains) under each metric
        title = blocks[0][0]
        for arm in zip(*(gains for _, gains in blocks)):  # one arm: its Gain under each metric
            cells = []
            for metric, gain in zip(after.metrics, arm):
                versus, key = gain.versus_reference, (title, gain.label, metric)
                levels = [average_level(table, title, gain.variant, metric) for table in (before, after)]
                cells += [" → ".join(MISSING if level is None else f"{level:.1f}" for level in levels),
                          signed_estimate(gain.gain, gain.seed_interval),
                          MISSING if versus is None else signed_estimate(versus, gain.versus_seed)
                          + comparison_text(primary, key)]
                if control:
                    cells.append(MISSING if gain.versus_control is None else
                                 signed_estimate(gain.versus_control, gain.versus_control_seed))
                metrics[f"{title}/{gain.label}/{metric}"] = {
                    "before": levels[0], "after": levels[1],
                    "gain": gain.gain.mean, "low": gain.gain.low, "high": gain.gain.high,
                    "versus_reference": None if versus is None else versus.mean,
                    **({"seed_t": [gain.seed_interval.low, gain.seed_interval.high]} if gain.seed_interval else {}),
                    **({"versus_seed_t": [gain.versus_seed.low, gain.versus_seed.high], "versus_p_t": p_value_record(gain.versus_p)}
                       if gain.versus_seed else {}),
                    **({"versus_p_holm": p_value_record(primary[key])} if key in primary else {}),
                    **({"versus_control": gain.versus_control.mean,
                        "versus_control_interval": [gain.versus_control.low, gain.versus_control.high]}
                       if gain.versus_control else {}),
                    **({"versus_control_seed_t": [gain.versus_control_seed.low, gain.versus_control_seed.high],
                        "versus_control_p_t": p_value_record(gain.versus_control_p)}
                       if gain.versus_control_seed else {})}
            per_seed = ", ".join(f"{seed}: {value:+.1f}" for seed, value in arm[0].per_seed.items())
            shares = list(kept.get((m, arm[0].variant), {}).values())
            share = f"{100 * sum(shares) / len(shares):.1f}%" if shares else MISSING
            if shares:
                metrics[f"{title}/{arm[0].label}/{RL_GROUPS_KEPT}"] = sum(shares) / len(shares)
            lines.append(f"| {title} | {arm[0].label} | {len(arm[0].per_seed)} | {' | '.join(cells)} | {per_seed} "
                         f"| {share} |")
    return lines + ["", "Groups DAPO kept: of the prompt groups DAPO's dynamic sampling judged, the share it trained "
                        "on, mean over the arm's RL runs. It discards a group whose rollouts all got one verdict "
                        "(all right or all wrong: no group-relative advantage), counted per step as "
                        f"`{RL_DISCARDED_GROUPS}` in each run's `{TRAINING_METRICS_FILE}`.", ""], metrics


def average_level(table: ResultTable, title: str, variant: str, metric: str) -> float | None:
    """The ``Avg <metric>`` cell of ``variant``'s row in ``table``'s block ``title`` (None where it has none)."""
    rows = [row for block in table.blocks if block.title == title for row in block.rows if row.variant == variant]
    return rows[0].ours.get((AVERAGE, metric)) if rows else None


def groups_kept_per_seed(models: list[ModelGrid], labels: list[str]) -> dict[tuple[int, str], dict[int, float]]:
    """(model index, variant) → seed → share of the prompt groups DAPO kept (:func:`common.tracking.dapo_groups_kept`)
    in every RL run of ``labels`` with group filtering that logged a step."""
    result: dict[tuple[int, str], dict[int, float]] = {}
    for m, model in enumerate(models):
        kept_per_step = model.cfg.rl.kept_groups_per_step
        if kept_per_step is None:
            continue
        for seed, arms in model.arms.items():
            for variant in filter(model.has, labels):
                share = dapo_groups_kept(read_metrics_log(arms[variant].rl / TRAINING_METRICS_FILE), kept_per_step)
                if share is not None:
                    result.setdefault((m, variant), {})[seed] = share
    return result
