"""RL headroom: Spearman's ρ, across RL arms and seeds, of pre-RL diagnostics (pass@1, pass@n, mixed groups, entropy,
held-out NLL) with the RL gain, with an interval that resamples arms (:func:`eval.intervals.cluster_spearman`)."""
from __future__ import annotations

import math
from typing import NamedTuple

from eval.intervals import ClusteredCorrelation, cluster_spearman, per_problem_values
from eval.metrics import MEAN_TOKEN_ENTROPY, mixed_group_rate
from report.collect import Collected, PhaseTable
from report.sections import Section
from report.tables import AVERAGE, Row, rl_gains
from common.grid import Grid, ModelGrid
from common.manifest import read_manifest
from common.paths import HELDOUT_NLL, heldout_nll_run


def render(grid: Grid, collected: Collected) -> Section:
    """``## RL headroom: what predicts the RL gain``; metrics ``headroom``."""
    more, metrics = headroom_section(collected.tables, heldout_nll_per_seed(grid.models, grid.rl_variants),
                                     grid.cfg.rl.rollout_n)
    return Section(["## RL headroom: what predicts the RL gain", "", *more], metrics={"headroom": metrics})


class HeadroomPoint(NamedTuple):
    """One RL arm and seed: its pre-RL diagnostics (None where not measured) and its RL gain in Avg pass@1 (points)."""

    model: str
    arm: str
    seed: int
    pass1: float
    pass_n: float
    n: int
    mixed_groups: float | None
    entropy: float | None
    heldout_nll: float | None
    gain: float


HEADROOM_DIAGNOSTICS = {
    "pass1": "Avg pass@1",
    "pass_n": "Avg pass@n (k = n, all samples)",
    "mixed_groups": "share of mixed groups of G = rl.rollout_n samples",
    "entropy": "mean sample entropy (nats/token)",
    "heldout_nll": "held-out NLL on a held-out slice of the SFT set",
}
"""HeadroomPoint field → the report's name of that pre-RL diagnostic."""


NOT_COMPUTED = {
    "mixed_groups": "not computed (fewer pre-RL samples per problem than rl.rollout_n)",
    "entropy": "not computed (no pre-RL samples with log-probabilities: hf backend, or sampled before)",
    "heldout_nll": "not computed (no held-out NLL run: data.num_heldout_rows=0, or not evaluated yet)",
}


def headroom_section(collected: dict[str, PhaseTable], heldout: dict[tuple[int, str], dict[int, float]], group_size: int
                     ) -> tuple[list[str], dict]:
    """Spearman correlation, across RL arms and seeds, of pre-RL diagnostics with the RL gain in Avg pass@1, each over
    the pairs that have it: the share of mixed groups (:func:`mixed_groups_per_seed` at ``group_size``), the entropy
    (pre-RL samples that all carry log-probabilities) and the held-out NLL (``heldout``: (model index, variant) →
    seed → NLL, :func:`heldout_nll_per_seed`). The gain is :func:`report.tables.rl_gains`' per seed: each RL arm
    paired with the Table 1 row of the same variant (Table 2 may hold fewer arms: ``experiment.rl_methods``) on the
    problems both evaluated."""
    if "sft" not in collected or "rl" not in collected:
        return ["Skipped: needs both Table 1 (before RL) and Table 2 (after RL) evaluations.", ""], {}
    before, after = collected["sft"][0], collected["rl"][0]
    columns = before.averaged_columns
    points = []
    for m, (block_before, (_, gains)) in enumerate(zip(before.blocks, rl_gains(before, after, "pass@1"))):
        pre_rl = {row.variant: row for row in block_before.rows}
        for gain in gains:
            row_before = pre_rl[gain.variant]
            nll = heldout.get((m, gain.variant), {})
            pass1 = row_before.per_seed.get((AVERAGE, "pass@1"), {})
            pass_n = pass_at_n_per_seed(row_before, columns)
            mixed = mixed_groups_per_seed(row_before, columns, group_size)
            entropy = entropy_per_seed(row_before, columns)
            for seed in sorted(set(pass1) & set(gain.per_seed) & set(pass_n)):
                points.append(HeadroomPoint(block_before.title, row_before.label, seed, pass1[seed], *pass_n[seed],
                                            mixed.get(seed), entropy.get(seed), nll.get(seed), gain.per_seed[seed]))
    if not points:
        return ["Skipped: no arm and seed has both its Table 1 and Table 2 evaluations on every benchmark.", ""], {}
    rho, rows = {}, []
    for field, name in HEADROOM_DIAGNOSTICS.items():
        having = [p for p in points if getattr(p, field) is not None]
        rho[field] = cluster_spearman([getattr(p, field) for p in having], [p.gain for p in having],
                                      [(p.model, p.arm) for p in having])
        value = rho_text(rho[field])
        if field in NOT_COMPUTED:
            value = f"{value} ({len(having)} of {len(points)} pairs)" if having else NOT_COMPUTED[field]
        rows.append(f"| {name} | {value} |")

    def show(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    arms = len({(p.model, p.arm) for p in points})
    lines = [f"{len(points)} (arm, seed) pairs of {arms} arms, every RL arm (Base included). RL gain = Table 2 Avg "
             "pass@1 − Table 1 Avg pass@1 of the same arm and seed (points); Spearman's ρ of each pre-RL diagnostic "
             "with it over the pairs, and its 95% interval from a bootstrap over arms: each of 2000 resamples (fixed "
             "seed) draws the arms with replacement, every drawn arm with all its seeds, so the seeds of one arm "
             "(one recipe) count as one unit, not as independent points (`eval.intervals.cluster_spearman`). With "
             "few arms the interval is coarse and, like any percentile bootstrap over K units, somewhat narrow.", "",
             "| pre-RL diagnostic | Spearman ρ with the RL gain [95% interval, arms resampled] |", "|---|:---:|",
             *rows, "",
             f"Mixed groups: the expected share of groups of G = {group_size} samples of a problem that get both "
             "verdicts, the groups DAPO's dynamic sampling keeps (unbiased from the pre-RL samples, "
             "`eval.metrics.mixed_group_rate`; mean over problems, then benchmarks). It reads the evaluation's "
             "sampling temperature, which may differ from the rollouts'.", "",
             "| model | arm | seed | pre-RL pass@1 | pre-RL pass@n (n) | pre-RL mixed groups | "
             "pre-RL entropy (nats/token) | pre-RL held-out NLL (nats/token) | RL gain |",
             "|---|---|:---:|:---:|:---:|:---:|:---:|:---:|:---:|",
             *(f"| {p.model} | {p.arm} | {p.seed} | {p.pass1:.1f} | {p.pass_n:.1f} ({p.n}) | "
               f"{show(p.mixed_groups, 3)} | {show(p.entropy, 3)} | {show(p.heldout_nll, 3)} | {p.gain:+.1f} |"
               for p in points), ""]
    return lines, {"points": len(points), "arms": arms,
                   **{f"spearman_{field}": None if math.isnan(value.estimate.mean) else value.estimate.mean
                      for field, value in rho.items()},
                   **{f"spearman_{field} 95% arms": [value.estimate.low, value.estimate.high]
                      for field, value in rho.items() if not math.isnan(value.estimate.low)}}


def rho_text(rho: ClusteredCorrelation) -> str:
    """``+0.42 [−0.10, +0.80]`` (the interval over arm resamples; those with a constant side are left out and
    counted), or why there is no ρ."""
    if math.isnan(rho.estimate.mean):
        return "n/a (fewer than 3 points, or a constant side)"
    if math.isnan(rho.estimate.low):
        return f"{rho.estimate.mean:+.2f} [n/a: every arm resample has a constant side]"
    text = f"{rho.estimate.mean:+.2f} [{rho.estimate.low:+.2f}, {rho.estimate.high:+.2f}]"
    return text + (f" ({rho.undefined} of the resamples had a constant side and are left out)" if rho.undefined else "")


def heldout_nll_per_seed(models: list[ModelGrid], labels: list[str]) -> dict[tuple[int, str], dict[int, float]]:
    """(model index, variant) → seed → pre-RL held-out NLL, from every complete held-out NLL run
    (:func:`common.paths.heldout_nll_run`) of ``labels``."""
    result: dict[tuple[int, str], dict[int, float]] = {}
    for m, model in enumerate(models):
        for seed, scfg in model.seeds.items():
            for variant in filter(model.has, labels):
                spec = heldout_nll_run(scfg, variant, model.arms[seed][variant].sft)
                manifest = read_manifest(spec.directory) if spec is not None else None
                if manifest is not None and manifest.complete and HELDOUT_NLL in manifest.metrics:
                    result.setdefault((m, variant), {})[seed] = manifest.metrics[HELDOUT_NLL]
    return result


def docs_per_seed(row: Row, columns: list[str]) -> dict[int, list[dict]]:
    """seed → its ``metrics.json`` on each of ``columns`` (in order), for the seeds evaluated on every column."""
    if any(column not in row.evaluations for column in columns):
        return {}
    seeds = set.intersection(*(set(row.evaluations[column]) for column in columns))
    return {seed: [row.evaluations[column][seed] for column in columns] for seed in sorted(seeds)}


def pass_at_n_per_seed(row: Row, columns: list[str]) -> dict[int, tuple[float, int]]:
    """seed → (mean over benchmarks of pass@n in percent, the smallest n) for the seeds evaluated on every column."""
    result = {}
    for seed, docs in docs_per_seed(row, columns).items():
        values = [per_problem_values(list(doc["correct_counts"].values()), doc["n"], doc["n"]).mean() for doc in docs]
        result[seed] = (100 * sum(values) / len(values), min(doc["n"] for doc in docs))
    return result


def mixed_groups_per_seed(row: Row, columns: list[str], group_size: int) -> dict[int, float]:
    """seed → mean over benchmarks of the per-problem mean :func:`eval.metrics.mixed_group_rate` at ``group_size``,
    for the seeds evaluated on every column with at least ``group_size`` samples per problem."""
    result = {}
    for seed, docs in docs_per_seed(row, columns).items():
        if all(doc["n"] >= group_size for doc in docs):
            per_benchmark = [[mixed_group_rate(doc["n"], c, group_size) for c in doc["correct_counts"].values()]
                             for doc in docs]
            result[seed] = sum(sum(rates) / len(rates) for rates in per_benchmark) / len(per_benchmark)
    return result


def entropy_per_seed(row: Row, columns: list[str]) -> dict[int, float]:
    """seed → mean over benchmarks of their ``mean_token_entropy_nats``, for the seeds that have it on every column."""
    result = {}
    for seed, docs in docs_per_seed(row, columns).items():
        values = [doc.get(MEAN_TOKEN_ENTROPY) for doc in docs]
        if None not in values:
            result[seed] = sum(values) / len(values)
    return result
