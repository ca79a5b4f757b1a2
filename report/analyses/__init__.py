"""The paper's analyses beyond Tables 1-2, rendered by the report stage (:mod:`report.run`):

* :mod:`report.analyses.drift`: relative parameter change of each trained model vs the base model;
* :mod:`report.analyses.iou`: IoU(M_H, M_KL) and the mask sizes over the SFT steps of each EKSFT run;
* :mod:`report.analyses.case_study`: the probability each model gives every ground-truth token of one solution.
* :mod:`report.analyses.curves`: training curves of the SFT and RL runs from their ``metrics.jsonl``.

Each reads other stages' files only (safetensors exports, ``metrics.jsonl``, the tokenised SFT split).
"""


class AnalysisInputError(ValueError):
    """An analysis input file is malformed; the message names the file (and line or tensor)."""


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
