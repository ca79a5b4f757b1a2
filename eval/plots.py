"""pass@k curves (unbiased estimator, every k = 1, 2, 4, …, n) as PNG, one line per method (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from eval.metrics import k_values, pass_at_k


def pass_at_k_curve(correct_counts: Sequence[int], n: int) -> tuple[list[int], list[float]]:
    """(k, mean pass@k in percent) for k in :func:`eval.metrics.k_values`."""
    ks = k_values(n)
    return ks, [100 * sum(pass_at_k(n, c, k) for c in correct_counts) / len(correct_counts) for k in ks]


def plot_pass_at_k(curves: dict[str, tuple[Sequence[int], int]], title: str, path: Path) -> Path:
    """Writes one figure: ``curves`` maps a method label to (per-problem correct counts, n)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5.0, 3.6), dpi=100)
    for label, (counts, n) in curves.items():
        ks, values = pass_at_k_curve(counts, n)
        axes.plot(ks, values, marker="o", markersize=3, label=label)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("k")
    axes.set_ylabel("pass@k (%)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
