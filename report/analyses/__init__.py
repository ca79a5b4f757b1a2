"""The paper's analyses beyond Tables 1-2, rendered by the report stage (:mod:`report.run`):

* :mod:`report.analyses.drift`: relative parameter change of each trained model vs the base model;
* :mod:`report.analyses.iou`: IoU(M_H, M_KL) and the mask sizes over the SFT steps of each EKSFT run;
* :mod:`report.analyses.case_study`: the probability each model gives every ground-truth token of one solution.
* :mod:`report.analyses.curves`: training curves of the SFT and RL runs from their ``metrics.jsonl``.

Each reads other stages' files only (safetensors exports, ``metrics.jsonl``, the tokenised SFT split). Every figure of
the report colours a method by :func:`method_colour`, so a method has one colour in all of them.
"""
import zlib

METHOD_COLOURS = {"Base": "#7f7f7f", "SFT": "#1f77b4", "EKSFT (paper eq.)": "#d62728",
                  "EKSFT (official code)": "#ff7f0e", "DFT": "#2ca02c", "IW-SFT": "#9467bd", "PSFT": "#8c564b",
                  "ASFT": "#e377c2", "GEM": "#bcbd22", "SED-SFT": "#17becf"}
"""matplotlib's tab10, one colour per row of the paper's tables (their default ``report.row_labels`` titles)."""
OTHER_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
                 "#756bb1", "#636363", "#9c9ede", "#cedb9c", "#e7ba52", "#e7969c", "#de9ed6")
"""The colours of every other method (ablations, sweep points, renamed rows), none of them in :data:`METHOD_COLOURS`."""


class AnalysisInputError(ValueError):
    """An analysis input file is malformed; the message names the file (and line or tensor)."""


def method_colour(label: str) -> str:
    """The colour of the method titled ``label`` in every figure: its :data:`METHOD_COLOURS` entry, else the
    :data:`OTHER_COLOURS` entry its crc32 picks (the same in every figure and run, whatever else is plotted)."""
    return METHOD_COLOURS.get(label) or OTHER_COLOURS[zlib.crc32(label.encode("utf-8")) % len(OTHER_COLOURS)]


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path) -> None:
    """Tight layout, save (creating the folder), close."""
    from pathlib import Path

    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    pyplot().close(figure)
