"""The report of a tool-use experiment (``data.benchmark_source=bfcl``): the paper's two appendix tables (BFCL live and
Irrelevance Detection per model, Base and every SFT method) with our numbers, their 95% intervals and the paper's.

    python -m report.bfcl experiment=bfcl profile=paper       (also the report stage of experiment=bfcl)

Cells, from the evaluation stage's per-category ``metrics.json`` (:mod:`eval.bfcl.evaluate`; ``correct_counts`` are the
per-question verdicts, 0/1)::

    BFCL live         = Σ_c correct(c) / Σ_c total(c)  over the live AST categories present
                        (BFCL's count-weighted live accuracy, :func:`eval.bfcl.checker.live_overall`)
    Irrelevance Det.  = accuracy on live_irrelevance (:data:`eval.bfcl.checker.DEFAULT_IRRELEVANCE`)

each with the 95% bootstrap interval over questions of :func:`eval.intervals.estimate` (the live cell pools the
verdicts of its categories, so its mean is the count-weighted accuracy). The paper's numbers are
``paper_tables.json``'s ``bfcl`` tables, matched by model title and :data:`report.tables.PAPER_ROWS`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from eval.bfcl.checker import DEFAULT_IRRELEVANCE
from eval.intervals import Estimate, estimate
from report.tables import MISSING, PAPER_ROWS, load_paper_tables
from common.config import Config, stage_main
from common.config.data import LIVE_CATEGORIES
from common.manifest import Manifest, read_manifest, stage_run
from common.paths import EVAL_METRICS_FILE, eval_run, report_benchmarks, report_dir
from common.grid import Arm, ModelGrid, experiment_grid, report_run

COLUMNS = ("BFCL live", "Irrelevance Det.")
"""The paper's two columns (``paper_tables.json`` titles)."""
REPORT_FILE = "bfcl.md"


def read_category(cfg: Config, a: Arm, category: str) -> dict[str, Any] | None:
    """A category's ``metrics.json`` from the evaluation of arm ``a`` after SFT, or None when it is not there."""
    path = eval_run(cfg, "sft", a.variant, category, a.sft).directory / EVAL_METRICS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def categories(cfg: Config) -> list[str]:
    """The evaluated BFCL categories: ``eval.benchmarks``, else every one in ``data.benchmarks``."""
    return report_benchmarks(cfg)


def cell(verdicts: list[int]) -> Estimate | None:
    """Accuracy in percent of 0/1 verdicts with its bootstrap interval over questions; None without verdicts."""
    if not verdicts:
        return None
    return estimate([np.asarray([verdicts], dtype=float)]).scaled(100)


def variant_cells(cfg: Config, a: Arm) -> tuple[dict[str, Estimate | None], dict[str, int]]:
    """The two cells of arm ``a``'s row and the number of questions behind each (live: every live category
    present)."""
    selected = categories(cfg)
    live = [read_category(cfg, a, c) for c in LIVE_CATEGORIES if c in selected]
    live_verdicts = [v for m in live if m is not None for v in m["correct_counts"].values()]
    irrelevance = read_category(cfg, a, DEFAULT_IRRELEVANCE) if DEFAULT_IRRELEVANCE in selected else None
    irrelevance_verdicts = list(irrelevance["correct_counts"].values()) if irrelevance is not None else []
    if any(m is None for m in live):  # a missing live category would change what the live column means
        live_verdicts = []
    return ({COLUMNS[0]: cell(live_verdicts), COLUMNS[1]: cell(irrelevance_verdicts)},
            {COLUMNS[0]: len(live_verdicts), COLUMNS[1]: len(irrelevance_verdicts)})


def model_table(cfg: Config, model: ModelGrid, paper: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """One appendix table (markdown lines) for one model of the grid (its experiment's arms, first seed), and its
    numbers for the manifest."""
    mcfg, seed = model.cfg, next(iter(model.seeds))
    title = mcfg.model.display_name or mcfg.model.name
    lines = [f"| Method ({title}) | {COLUMNS[0]} | 95% CI | paper | {COLUMNS[1]} | 95% CI | paper |",
             "|---|---|---|---|---|---|---|"]
    numbers: dict[str, Any] = {}
    for a in model.experiment_arms(seed):
        variant = a.variant
        cells, counts = variant_cells(model.seeds[seed], a)
        paper_row = paper.get(title, {}).get(PAPER_ROWS.get(variant), {})
        shown = []
        for column in COLUMNS:
            value = cells[column]
            published = paper_row.get(column, {}).get("accuracy")
            shown += [MISSING if value is None else f"{value.mean:.1f}",
                      MISSING if value is None else f"[{value.low:.1f}, {value.high:.1f}]",
                      MISSING if published is None else f"{published:.1f}"]
        label = cfg.report.row_labels.get(variant, variant)
        lines.append(f"| {label} | " + " | ".join(shown) + " |")
        numbers[f"{title}/{label}"] = {column: None if cells[column] is None else
                                       {"accuracy": cells[column].mean, "interval": [cells[column].low,
                                                                                     cells[column].high],
                                        "questions": counts[column]} for column in COLUMNS}
    return lines, numbers


def caption(cfg: Config) -> str:
    """What the cells are: the categories, the irrelevance set, the protocol, the subset when one was taken."""
    live = [c for c in LIVE_CATEGORIES if c in categories(cfg)]
    subset = f"the first {cfg.eval.max_problems} questions of each category" if cfg.eval.max_problems else \
        "every question"
    return (f"BFCL after SFT on {cfg.data.source}: {COLUMNS[0]} is BFCL's count-weighted accuracy over "
            f"{', '.join(live)}; {COLUMNS[1]} is the accuracy on **{DEFAULT_IRRELEVANCE}** (BFCL live's 884 "
            "irrelevance questions; the paper does not say which irrelevance set it used). One greedy completion per "
            f"question ({subset}, at most {cfg.eval.max_tokens} tokens), judged by BFCL's own checker "
            "(bfcl-eval, `make bfcl-env`). 95% CI: bootstrap over questions. paper: the paper's Tables "
            "tab:bfcl_4b / tab:bfcl_8b (its one EKSFT row is shown against both of our EKSFT arms; – where the "
            "paper has no number)")


def render(cfg: Config) -> tuple[str, dict[str, Any]]:
    """The markdown of both appendix tables (one per model of ``profile.models``) and their numbers."""
    paper = load_paper_tables().get("bfcl", {})
    lines = [f"## BFCL (experiment `{cfg.experiment.name}`, profile {cfg.profile.name})", "", f"{caption(cfg)}.", ""]
    numbers: dict[str, Any] = {}
    for model in experiment_grid(cfg, sweep_points=False).models:
        table, found = model_table(cfg, model, paper)
        lines += [*table, ""]
        numbers.update(found)
    return "\n".join(lines), numbers


def run(cfg: Config) -> Manifest:
    """Writes ``bfcl.md`` and ``report.md`` into the experiment's report folder under the run contract."""
    out_dir: Path = report_dir(cfg)
    spec = report_run(cfg)
    with stage_run(out_dir, stage="report", variant="", config=spec.config, inputs=spec.inputs,
                   optional_inputs=True) as run_:
        if run_ is None:
            return read_manifest(out_dir)
        text, numbers = render(cfg)
        (out_dir / REPORT_FILE).write_text(text, encoding="utf-8")
        (out_dir / "report.md").write_text(f"# Report: experiment `{cfg.experiment.name}`\n\n{text}",
                                           encoding="utf-8")
        run_.add_output(REPORT_FILE, "the paper's BFCL appendix tables with ours, intervals and the paper's numbers")
        run_.add_output("report.md", "the report")
        run_.manifest.metrics = {"bfcl": numbers}
        print(text)
        return run_.manifest


main = stage_main(run)


if __name__ == "__main__":
    main()
