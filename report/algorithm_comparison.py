"""Arms of different RL algorithms compared on one table: the cross-point comparison of an ``rl/algorithm`` sweep.

    python -m report.algorithm_comparison experiment=forking experiment.run_root=/work/runs \\
        'experiment.methods=[sft,eksft,eksft_official_aligned]' rl.ppo_mini_batch_size=4 \\
        rl.micro_batch_size_per_gpu=32 [--arms base+dapo sft+dapo sft+kl_cov ...] [--reference sft+dapo]

The algorithm is in an RL run's identity, so each point of ``rl/algorithm=a,b,…`` has its own RL runs, its own
phase-rl evaluations (``eval/<model>/rl/<variant>-<id>/<benchmark>/metrics.json``) and its own report
(``report[+<algorithm>]/``), which compares arms within the point only. An arm here is ``<start>+<algorithm>``:
the RL runs of ``algorithm`` started from ``start`` (``base`` or an ``experiment.methods`` entry). For every
algorithm named, the config is composed from the overrides given plus ``rl/algorithm=<algorithm>`` and the phase-rl
table of that point is read exactly as its report reads it (:func:`report.collect.collect`: the grid's seeds and
run folders, so only the evaluations of these overrides are read, never a run with other settings in the same run
root). The arms' evaluations then form one table, filled with the report's own code
(:func:`report.tables.fill_estimates`): per arm the final level of each metric (mean over seeds and problems, 95%
bootstrap interval, seed-level t-interval ⟨…⟩), and the paired difference to the reference arm (same seeds, same
problems: every point evaluates the same benchmarks with the same seeds). The endpoints' Δ cells of every arm but
the reference are the primary comparisons, Holm-adjusted together over the paired t-tests on the per-seed
differences (:func:`report.tables.mark_primary`). Prints that table, the list of primary comparisons and the
evaluations an arm lacks.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Sequence

from report.collect import collect, missing_seeds, row_label
from report.tables import (
    AVERAGE,
    Block,
    ResultTable,
    Row,
    endpoint_cell,
    fill_estimates,
    mark_primary,
    p_value_text,
    primary_note,
    signed_estimate,
    to_markdown,
)
from common.config import ConfigError, compose
from common.config.rl import ALGORITHM_TITLES
from common.errors import user_errors_in_one_line
from common.grid import experiment_grid, experiment_method_names, method_labels
from common.paths import BASE_VARIANT

DEFAULT_ARMS = ("base+dapo", "sft+dapo", "sft+entropy_bonus", "sft+kl_cov", "sft+clip_cov", "eksft+dapo",
                "eksft_official_aligned+dapo")
"""The arms of docs/results/2026-11-27-rl-entropy-comparison-prereg.md."""
DEFAULT_REFERENCE = "sft+dapo"


@dataclass(frozen=True)
class ArmSpec:
    """``<start>+<algorithm>``: the RL runs of ``algorithm`` that start from ``start``."""

    start: str
    """``base`` or an ``experiment.methods`` entry."""
    algorithm: str
    """An ``rl/algorithm`` preset."""

    @property
    def name(self) -> str:
        return f"{self.start}+{self.algorithm}"


def parse_arm(text: str) -> ArmSpec:
    """``sft+kl_cov`` → ArmSpec("sft", "kl_cov"); an unknown algorithm is refused listing the choices."""
    start, plus, algorithm = text.rpartition("+")
    if not plus or not start:
        raise ConfigError(f"arm {text!r} is not <start>+<algorithm> (e.g. sft+kl_cov, base+dapo)")
    if algorithm not in ALGORITHM_TITLES:
        raise ConfigError(f"arm {text!r} names the RL algorithm {algorithm!r}; choices: {', '.join(ALGORITHM_TITLES)}")
    return ArmSpec(start, algorithm)


@dataclass
class Comparison:
    """The arms' table, its primary comparisons and what it lacks."""

    table: ResultTable
    endpoints: list[str]
    missing: list[str]
    """``model / arm / benchmark: seed …`` for every evaluation an arm lacks."""


def compare_arms(overrides: Sequence[str], arms: Sequence[ArmSpec], reference: ArmSpec,
                 endpoints: Sequence[str] = ()) -> Comparison:
    """The module docstring's table of ``arms`` (``reference`` among them) under ``overrides``; ``endpoints``
    (``"Avg pass@1"``; default: ``Avg`` of both metrics) are the primary comparisons' cells."""
    if reference not in arms:
        raise ConfigError(f"the reference arm {reference.name} is not among the arms {[a.name for a in arms]}")
    if any(o.lstrip("+~").startswith(("rl/algorithm=", "rl.algorithm=")) for o in overrides):
        raise ConfigError("the overrides set rl/algorithm; each arm names its own (<start>+<algorithm>)")
    tables: dict[str, ResultTable] = {}
    configs = {}
    for algorithm in dict.fromkeys(a.algorithm for a in arms):
        cfg = compose([*overrides, f"rl/algorithm={algorithm}"])
        labels = dict(zip(experiment_method_names(cfg), method_labels(cfg)), **{BASE_VARIANT: BASE_VARIANT})
        for a in arms:
            if a.algorithm == algorithm and a.start not in labels:
                raise ConfigError(f"arm {a.name}: {a.start!r} is neither base nor an experiment.methods entry "
                                  f"({', '.join(labels)}); add it to experiment.methods")
        starts = [labels[a.start] for a in arms if a.algorithm == algorithm]
        tables[algorithm], *_ = collect(cfg, "rl", experiment_grid(cfg, sweep_points=False).models, starts)
        configs[algorithm] = (cfg, labels)
    first = tables[reference.algorithm]
    if any(t.metrics != first.metrics or t.columns != first.columns for t in tables.values()):
        raise ConfigError("the points evaluated different benchmarks or sample counts: "
                          + "; ".join(f"{alg}: {t.columns} {t.metrics}" for alg, t in tables.items()))
    blocks = []
    for b, block in enumerate(first.blocks):
        rows = []
        for a in arms:
            cfg, labels = configs[a.algorithm]
            found = {row.variant: row for row in tables[a.algorithm].blocks[b].rows}
            if labels[a.start] in found:
                rows.append(Row(label=f"{row_label(cfg, labels[a.start])} + {ALGORITHM_TITLES[a.algorithm]}",
                                variant=a.name, evaluations=found[labels[a.start]].evaluations))
        blocks.append(Block(block.title, rows))
    table = ResultTable(caption=f"RL algorithms compared across the points of rl/algorithm: final levels after RL, "
                                f"pass@1 (avg@n) and {first.metrics[1]} in percent, mean [95% bootstrap interval] "
                                f"⟨seed-level t-interval⟩; Δ vs {reference.name} paired on seeds and problems",
                        row_header="Arm", columns=first.columns, metrics=first.metrics, blocks=blocks,
                        extra_columns=first.extra_columns)
    fill_estimates(table, reference_variant=reference.name)
    endpoints = list(endpoints) or [f"{AVERAGE} {metric}" for metric in first.metrics]
    absent = mark_primary(table, endpoints, {a.name for a in arms} - {reference.name})
    if absent:
        raise ConfigError(f"endpoints {absent} are no cell of the table (columns {first.columns}, metrics "
                          f"{first.metrics}); name them as '<column> <metric>', e.g. '{AVERAGE} pass@1'")
    cfg = configs[reference.algorithm][0]
    missing = missing_seeds(cfg, table) + [f"{block.title} / {row.label} / {column}: every seed"
                                           for block in table.blocks for row in block.rows
                                           for column in table.averaged_columns if not row.evaluations.get(column)]
    return Comparison(table, endpoints, missing)


def primary_lines(comparison: Comparison) -> list[str]:
    """One Markdown row per primary comparison: arm, endpoint, Δ with both intervals, p and Holm-adjusted p."""
    table = comparison.table
    lines = [f"| model | arm | endpoint | Δ vs {table.reference} [bootstrap] ⟨seed t⟩ | p (t) | p (Holm) |",
             "|---|---|---|:---:|:---:|:---:|"]
    for block in table.blocks:
        for row in block.rows:
            for endpoint in comparison.endpoints:
                cell = endpoint_cell(endpoint)
                if cell in row.primary:
                    lines.append(f"| {block.title} | {row.label} | {endpoint} | "
                                 f"{signed_estimate(row.delta[cell], row.delta_seed.get(cell))} | "
                                 f"{p_value_text(row.delta_p.get(cell))} | {p_value_text(row.primary[cell])} |")
    return lines


def render(comparison: Comparison) -> str:
    """The table, the note on its primary comparisons, their list and the missing evaluations, as Markdown."""
    table = comparison.table
    lines = [f"{table.caption}.", "", to_markdown(table),
             primary_note(table, "--endpoints", comparison.endpoints, []), "", *primary_lines(comparison), ""]
    if comparison.missing:
        lines += ["Missing evaluations:", *(f"- {item}" for item in comparison.missing), ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="the pipeline's overrides, without rl/algorithm")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), help="<start>+<algorithm> ...")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, help="the arm every Δ is taken against")
    parser.add_argument("--endpoints", nargs="+", default=[],
                        help="primary cells, '<column> <metric>' (default: Avg of both metrics)")
    args = parser.parse_args(argv)
    with user_errors_in_one_line():
        arms = [parse_arm(text) for text in args.arms]
        print(render(compare_arms(args.overrides, arms, parse_arm(args.reference), args.endpoints)))


if __name__ == "__main__":
    main(sys.argv[1:])
