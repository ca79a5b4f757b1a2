"""Report figures (matplotlib, Agg): pass@k curves with 95% bands, and the 2-D heatmap of a two-field sweep.

pass@k: the unbiased estimator for every k = 1, 2, 4, …, n, averaged over problems and seeds; the band at each k is
the bootstrap interval of :mod:`eval.intervals` (the same resampled seeds and problems at every k).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from report.analyses import method_colour, pyplot, save_figure
from eval.intervals import Draws, Estimate, common_problems, estimate, value_matrix
from eval.metrics import k_values


def pass_at_k_band(by_seed: dict[int, dict]) -> tuple[list[int], list[Estimate]]:
    """(k, pass@k in percent with its 95% interval) for k in :func:`eval.metrics.k_values` of the smallest n, over
    the seeds of ``by_seed`` (seed → ``metrics.json``) and the problems they share."""
    seeds = sorted(by_seed)
    problems = common_problems(by_seed, seeds)
    ks = k_values(min(by_seed[seed]["n"] for seed in seeds))
    draws = Draws.generate(len(seeds), [len(problems)])
    return ks, [estimate([value_matrix(by_seed, seeds, problems, k)], draws).scaled(100) for k in ks]


def plot_pass_at_k(curves: dict[str, dict[int, dict]], title: str, path: Path) -> Path:
    """Writes one figure: ``curves`` maps a method label to {seed: metrics.json}; one line and band per method, in
    the method's colour (:func:`report.analyses.method_colour`)."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(5.6, 3.8), dpi=100)
    all_ks: set[int] = set()
    for label, by_seed in curves.items():
        ks, estimates = pass_at_k_band(by_seed)
        all_ks.update(ks)
        axes.plot(ks, [e.mean for e in estimates], marker="o", markersize=3, label=label, color=method_colour(label))
        axes.fill_between(ks, [e.low for e in estimates], [e.high for e in estimates], color=method_colour(label),
                          alpha=0.15, linewidth=0)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(all_ks), [str(k) for k in sorted(all_ks)])
    axes.minorticks_off()
    axes.set_xlabel("k")
    axes.set_ylabel("pass@k (%), 95% band")
    axes.set_title(title, fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    save_figure(figure, path)
    return path


def plot_heatmap(x_values: Sequence, y_values: Sequence, cells: dict[tuple, float | None], x_label: str,
                 y_label: str, value_label: str, title: str, path: Path) -> Path:
    """A grid of ``cells[(x, y)]`` (missing: blank), each cell annotated with its value."""
    import numpy as np

    plt = pyplot()
    grid = np.full((len(y_values), len(x_values)), np.nan)
    for (x, y), value in cells.items():
        if value is not None:
            grid[list(y_values).index(y), list(x_values).index(x)] = value
    figure, axes = plt.subplots(figsize=(1.2 * len(x_values) + 2.2, 0.9 * len(y_values) + 1.6), dpi=100)
    image = axes.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
    for i in range(len(y_values)):
        for j in range(len(x_values)):
            if not np.isnan(grid[i, j]):
                axes.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=8,
                          color="white" if grid[i, j] < np.nanmean(grid) else "black")
    axes.set_xticks(range(len(x_values)), [f"{v:g}" if isinstance(v, float) else str(v) for v in x_values])
    axes.set_yticks(range(len(y_values)), [f"{v:g}" if isinstance(v, float) else str(v) for v in y_values])
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, label=value_label)
    save_figure(figure, path)
    return path
