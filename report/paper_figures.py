"""The paper's figures and its IoU table from the report's own runs, and the map from every table and figure of the
paper to the report file that reproduces it.

* pass@k numbers: beside every pass@k plot ``plots/passk_<model>_<phase>_<benchmark>.png`` the CSV
  ``passk_<model>_<phase>_<benchmark>.csv`` (:func:`write_passk_csv`): per method and k the plotted pass@k and its
  95% band. The paper profile draws 320 samples per AIME25 problem (``eval=passk320``), once, for the table's AIME25
  cells and this curve to k = 320: the paper's Figure 2 (Qwen3-8B) and Figure 3 (Qwen3-4B).
* Figure 1 (``fig:intro``, Base against SFT): :func:`write_base_vs_sft` for every model and every *curve
  benchmark* (the ones drawn with the most samples per problem: AIME25 on the paper profile, every toy benchmark),
  ``plots/fig_intro_<model>_<benchmark>.png`` with ``fig_intro_<model>_<benchmark>.csv`` (pass@k for every k from 1
  to n) and the smallest k from which Base's pass@k is at least SFT's (the paper: about 140, Qwen3-8B on AIME25).
* ``tab_iou.{md,csv,tex}`` (:func:`iou_table`): the paper's IoU table (max, min, avg over the SFT steps) for every
  run that logged IoU(M_H, M_KL), beside the paper's values.
* :func:`artefact_lines`: the report section naming, for each table and figure of the paper, the files of this
  report that reproduce it (docs/paper_index.md is the same map with the commands).
"""
from __future__ import annotations

import csv
import fnmatch
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.intervals import common_problems, value_matrix
from report.plots import pass_at_k_band, plot_pass_at_k
from report.tables import ResultTable

BASE_ROW, SFT_ROW = "base", "sft"
"""The variants Figure 1 compares."""


def slug(text: str) -> str:
    """A model title or benchmark as a file-name part (as :mod:`report.run` names its files)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


# ------------------------------------------------------------------------------------------------ pass@k numbers
def write_passk_csv(curves: dict[str, dict[int, dict]], path: Path) -> None:
    """One line per (method, k) of a pass@k plot (``curves``: method label → seed → ``metrics.json``): pass@k in
    percent and its 95% band (:func:`report.plots.pass_at_k_band`, the plotted values), seeds, problems and the
    samples per problem it is computed from."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["method", "k", "pass@k", "ci_low", "ci_high", "seeds", "problems", "n"])
    for label, by_seed in curves.items():
        seeds = sorted(by_seed)
        problems = len(common_problems(by_seed, seeds))
        n = min(by_seed[seed]["n"] for seed in seeds)
        for k, cell in zip(*pass_at_k_band(by_seed)):
            writer.writerow([label, k, f"{cell.mean:.4f}", f"{cell.low:.4f}", f"{cell.high:.4f}", len(seeds),
                             problems, n])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buffer.getvalue(), encoding="utf-8")


def curve_benchmarks(curves: dict[tuple[str, str], dict[str, dict[int, dict]]]) -> list[str]:
    """The benchmarks drawn with the most samples per problem (``curves``: (model, benchmark) → method → seed →
    ``metrics.json``), in order: the ones whose pass@k curve reaches furthest."""
    samples = {bench: max(doc["n"] for by_method in [methods] for by_seed in by_method.values()
                          for doc in by_seed.values())
               for (_, bench), methods in curves.items()}
    most = max(samples.values(), default=0)
    return list(dict.fromkeys(bench for bench, n in samples.items() if n == most))


# ------------------------------------------------------------------------------------------------------ Figure 1
def mean_pass_at_k(by_seed: dict[int, dict], ks: range) -> np.ndarray:
    """pass@k in percent, mean over seeds and the problems they share, for every k of ``ks``."""
    seeds = sorted(by_seed)
    problems = common_problems(by_seed, seeds)
    return np.array([100 * value_matrix(by_seed, seeds, problems, k).mean() for k in ks])


def crossover(base: np.ndarray, sft: np.ndarray) -> int | None:
    """The smallest k (``base[k - 1]``: pass@k) from which Base's pass@k is at least SFT's for every larger k, when
    SFT is ahead at k = 1; None when SFT is not ahead at k = 1 or stays ahead up to n."""
    if not sft[0] > base[0]:
        return None
    behind = np.nonzero(sft > base)[0]
    last = int(behind[-1]) + 1  # the largest k where SFT is still ahead
    return last + 1 if last < len(base) else None


@dataclass
class BaseVsSFT:
    """Figure 1 of one model and benchmark: its files and the crossover k (None: none up to n)."""

    model: str
    benchmark: str
    png: str
    csv: str
    n: int
    crossover: int | None
    base_at_n: float
    sft_at_n: float


def write_base_vs_sft(table: ResultTable, benchmarks: dict[str, str], out_dir: Path) -> list[BaseVsSFT]:
    """Figure 1 for every model block of Table 1 (``table``, phase sft) that has both the Base and the SFT row, on
    ``benchmarks`` (name → column title): the plot with bands and the CSV of pass@k for every k ≤ n."""
    written = []
    for block in table.blocks:
        rows = {row.variant: row for row in block.rows}
        if BASE_ROW not in rows or SFT_ROW not in rows:
            continue
        for bench, column in benchmarks.items():
            pair = {rows[v].label: rows[v].evaluations.get(column) for v in (BASE_ROW, SFT_ROW)}
            if not all(pair.values()):
                continue
            stem = f"fig_intro_{slug(block.title)}_{bench}"
            n = min(doc["n"] for by_seed in pair.values() for doc in by_seed.values())
            ks = range(1, n + 1)
            base, sft = (mean_pass_at_k(by_seed, ks) for by_seed in pair.values())
            plot_pass_at_k(pair, f"{block.title} · {column} · Base vs SFT (paper Figure 1)",
                           out_dir / f"plots/{stem}.png")
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            writer.writerow(["k", *pair])
            writer.writerows([k, f"{b:.4f}", f"{s:.4f}"] for k, b, s in zip(ks, base, sft))
            (out_dir / f"{stem}.csv").write_text(buffer.getvalue(), encoding="utf-8")
            written.append(BaseVsSFT(block.title, bench, f"plots/{stem}.png", f"{stem}.csv", n, crossover(base, sft),
                                     float(base[-1]), float(sft[-1])))
    return written


def base_vs_sft_lines(figures: list[BaseVsSFT]) -> list[str]:
    """The report's lines for Figure 1."""
    lines = ["## Figure 1 (paper: `fig:intro`): Base vs SFT, pass@k", ""]
    if not figures:
        return lines + ["Skipped: no model has both its Base and its SFT evaluation yet.", ""]
    for f in figures:
        where = (f"Base's pass@k is at least SFT's from k = {f.crossover} on" if f.crossover is not None else
                 "SFT stays ahead of Base up to k = n" if f.sft_at_n > f.base_at_n else "SFT is not ahead at k = 1")
        lines += [f"{f.model}, {f.benchmark} (n = {f.n}): {where} (pass@{f.n}: Base {f.base_at_n:.1f}, SFT "
                  f"{f.sft_at_n:.1f}); the paper: from k ≈ 140 on (Qwen3-8B, AIME25, n = 320).", "",
                  f"![Figure 1]({f.png})", "", f"Numbers (every k ≤ n): [{f.csv}]({f.csv})", ""]
    return lines


# ----------------------------------------------------------------------------------------------------- IoU table
IOU_STATISTICS = ("Max", "Min", "Avg")
"""The paper's rows, and the key of each in a run's summary (:meth:`report.analyses.iou.IoUSeries.summary`)."""


def iou_table(summaries: dict[str, dict[str, dict]], paper: dict[str, float]) -> dict[str, str]:
    """The paper's IoU table as ``{"md", "csv", "tex"}``: one row per statistic, one column per run (``summaries``:
    model title → run label → its summary), each value over the run's SFT steps with M_H and M_KL non-empty; the
    paper's value (Qwen3, ρ = 0.2) in the last column. A statistic over one run's steps, not an estimate over
    problems: no interval."""
    runs = [(model, label, summary) for model, by_run in summaries.items() for label, summary in by_run.items()]
    titles = [f"{model} · {label}" for model, label, _ in runs]
    values = {stat: [summary[stat.lower()] for _, _, summary in runs] for stat in IOU_STATISTICS}
    steps = [str(summary["steps"]) for _, _, summary in runs]
    md = ["| Statistic | " + " | ".join(titles) + " | paper |", "|---|" + ":---:|" * (len(runs) + 1),
          *(f"| {stat} | " + " | ".join(f"{v:.2f}" for v in values[stat]) + f" | {paper[stat]:.2f} |"
            for stat in IOU_STATISTICS),
          "| steps | " + " | ".join(steps) + " | – |"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["statistic", *titles, "paper"])
    writer.writerows([stat, *(f"{v:.4f}" for v in values[stat]), paper[stat]] for stat in IOU_STATISTICS)
    writer.writerow(["steps", *steps, ""])
    tex = ["\\begin{table}[h]", "\\centering", "\\small", "\\begin{tabular}{l" + "c" * (len(runs) + 1) + "}",
           "\\toprule", "\\textbf{Statistic} & " + " & ".join(_tex(t) for t in titles) + " & paper \\\\", "\\midrule",
           *(f"{stat} & " + " & ".join(f"{v:.2f}" for v in values[stat]) + f" & {paper[stat]:.2f} \\\\"
             for stat in IOU_STATISTICS),
           "\\bottomrule", "\\end{tabular}",
           "\\caption{IoU between $\\mathcal{M}_H$ and $\\mathcal{M}_{\\mathrm{KL}}$ over the SFT steps.}",
           "\\end{table}"]
    return {"md": "\n".join(md) + "\n", "csv": buffer.getvalue(), "tex": "\n".join(tex) + "\n"}


def _tex(text: str) -> str:
    return text.replace("\\", "\\textbackslash{}").replace("&", "\\&").replace("%", "\\%").replace("_", "\\_")


# ------------------------------------------------------------------------------------------------- the artefacts
@dataclass(frozen=True)
class Artefact:
    """One table or figure of the paper and the report files that reproduce it."""

    name: str
    """``Table 3``, ``Figure 2``, ... (the paper's numbering, in the order of its captions)."""
    label: str
    """Its ``\\label`` in the .tex."""
    what: str
    patterns: tuple[str, ...]
    """Globs over the report's outputs; ``{model}`` is the paper's model (every model when the report lacks it) and
    ``{curve}`` a curve benchmark."""
    model: str = ""
    """The paper's model for the artefact (empty: every model)."""


PAPER_ARTEFACTS = (
    Artefact("Table 1", "tab:stage1", "pass@1 / pass@32 after SFT", ("table1.md", "table1.csv", "table1.tex")),
    Artefact("Table 2", "tab:stage2", "pass@1 / pass@32 after DAPO", ("table2.md", "table2.csv", "table2.tex")),
    Artefact("Table 3", "tab:ablation", "ablation of the regularisers", ("tab_ablation.*",)),
    Artefact("Table 6", "tab:ablation_masking", "masking mechanism (global regularisation)",
             ("tab_ablation_masking.*",)),
    Artefact("Table 7", "tab:iou", "IoU(M_H, M_KL) over the SFT steps", ("tab_iou.*", "plots/iou_*.png")),
    Artefact("Table 8", "tab:ratio", "sensitivity to ρ", ("tab_ratio.*",)),
    Artefact("Table 9", "tab:random_mask", "random masking (10%)", ("tab_random_mask.*",)),
    Artefact("Figure 1", "fig:intro", "Base vs SFT, pass@k",
             ("plots/fig_intro_{model}_*.png", "fig_intro_{model}_*.csv"), "Qwen3-8B"),
    Artefact("Figure 2", "fig:passk", "pass@k to k = n of every method",
             ("plots/passk_{model}_sft_{curve}.png", "passk_{model}_sft_{curve}.csv"), "Qwen3-8B"),
    Artefact("Figure 3", "fig:passk_4B", "pass@k to k = n of every method",
             ("plots/passk_{model}_sft_{curve}.png", "passk_{model}_sft_{curve}.csv"), "Qwen3-4B"),
    Artefact("Figure 4", "fig:parameter_4B", "parameter drift vs the base model",
             ("plots/drift_{model}_sft_*.png", "drift_{model}_sft.*"), "Qwen3-4B"),
    Artefact("Figure 5", "fig:parameter_8B", "parameter drift vs the base model",
             ("plots/drift_{model}_sft_*.png", "drift_{model}_sft.*"), "Qwen3-8B"),
    Artefact("Figure 6", "fig:case_study", "token probabilities of one solution",
             ("plots/case_study_{model}.png", "case_study_{model}.*"), "Qwen3-4B"),
)
"""The paper's tables and figures a math report reproduces (Tables 4-5 are the hyperparameters, in the configs;
Tables 10-11 the BFCL report's: docs/paper_index.md)."""


def artefact_lines(outputs: list[str], models: list[str], curves: list[str]) -> list[str]:
    """The report section: per artefact of :data:`PAPER_ARTEFACTS`, the files among ``outputs`` that reproduce it
    (``models``: the report's model titles; ``curves``: the curve benchmarks), or a note that this run has none."""
    lines = ["## The paper's tables and figures in this report", "",
             "| paper | what | files here |", "|---|---|---|"]
    for artefact in PAPER_ARTEFACTS:
        shown = [artefact.model] if artefact.model in models else models
        patterns = [p.format(model=slug(m), curve=c) for p in artefact.patterns for m in shown for c in curves or ["*"]]
        files = [o for o in outputs if any(fnmatch.fnmatchcase(o, p) for p in patterns)]
        cell = ", ".join(f"[{f}]({f})" for f in files) if files else "not in this report (docs/paper_index.md)"
        lines.append(f"| {artefact.name} (`{artefact.label}`) | {artefact.what}"
                     f"{f', {artefact.model}' if artefact.model else ''} | {cell} |")
    return lines + [""]
