"""The report stage: ``python -m report.run experiment=<name> [profile=…]`` (the orchestrator's last stage).

Collects the ``metrics.json`` of the evaluations the current config names, for the experiment's models
(``profile.models``), arms (``base`` and each of ``experiment.methods``, with their SFT and RL runs:
:class:`common.paths.Arm`; then the sweep points), seeds (``cfg.run_seeds()``) and benchmarks; those runs, and no
others, are its inputs (:func:`common.paths.report_run`). It writes into ``report_dir(cfg)``:

* ``table1.{md,csv,tex}`` (phase sft) and ``table2.{md,csv,tex}`` (phase rl) in the paper's layout
  (:mod:`report.tables`): each cell the mean over seeds and problems with its 95% bootstrap interval
  (:mod:`eval.intervals`) and its seed-level t-interval, a paired ``Δ vs SFT`` line per row (Holm-adjusted p for
  the primary comparisons of ``report.primary_endpoints``, the rest exploratory), marks only where intervals
  separate, the paper's own numbers in parentheses where the cell exists in the paper, each seed's value in the
  CSV; under each table the count of samples left without a verdict by the scorer's time limit;
* ``plots/passk_<model>_<phase>_<benchmark>.png``: pass@k curves with 95% bands, one line per method
  (:mod:`report.plots`), and their numbers ``passk_<model>_<phase>_<benchmark>.csv`` (the paper's Figures 2-3 on the
  benchmark drawn 320 times, :mod:`report.paper_figures`); extra benchmarks (``data.extra_benchmarks``) are columns
  after Avg, never averaged;
* the paper's ablation tables that the evaluations hold arms for, ``tab_<label>.{md,csv,tex}``
  (:mod:`report.ablation_tables`), Figure 1 (``plots/fig_intro_*.png``, ``fig_intro_*.csv``: Base vs SFT), the IoU
  table ``tab_iou.{md,csv,tex}``, and at the top of ``report.md`` the map of the paper's tables and figures to these
  files (:func:`report.paper_figures.artefact_lines`);
* ``plots/curves_<model>_{sft,rl}.png``: training curves of the SFT and RL runs (:mod:`report.analyses.curves`), the
  RL gain of each arm with its intervals and minus SFT's (:func:`report.tables.rl_gains`), and the RL-headroom table
  (Spearman ρ of pre-RL pass@1 / pass@n / mean sample entropy / held-out NLL with the RL gain, across arms and
  seeds, with an interval that resamples arms);
* the analyses of ``report.analysis.run`` (:mod:`report.analyses`, :mod:`report.sweep`), each skipped with a note in
  ``report.md`` when its inputs are missing: ``drift_<model>_<phase>.{json,csv}`` and ``plots/drift_*.png``
  (parameter drift of every SFT / RL export vs the base model), ``iou_<model>.{md,json}`` and ``plots/iou_*.png``
  (IoU(M_H, M_KL) and mask sizes over the SFT steps of each EKSFT run), ``case_study_<model>.{html,json}`` and
  ``plots/case_study_*.png`` (per-token probabilities of one SFT solution under each model), and
  ``sweep_<model>_<phase>_<method>_<fields>.{md,csv,tex}`` with ``plots/sweep_*.png`` (one per method evaluated
  with ≥ 2 labels; a two-field sweep also gets ``plots/sweep_*_heatmap_*.png``);
* the commits, machines and run times the input runs' manifests record (:mod:`report.run_times`: ``report.md``'s
  "Runs" section and ``run_times.csv``);
* ``report.md`` linking the tables, plots and every eval manifest used; ``manifest.json``.

Missing evaluations show as "–" and are listed; a phase without any evaluation is left out.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple


from report.analyses.case_study import read_case_study_row, token_probabilities, token_texts, write_case_study
from report.analyses.drift import compare_checkpoints, fraction_above, plot_drift, write_drift
from report.analyses.iou import iou_markdown, iou_series, plot_iou, read_metrics_log
from report.analyses.curves import SFT_PANELS, logged_panels, plot_curves, read_runs, rl_panels
from report.bfcl import run as bfcl_report
from report.run_times import CSV_NAME, read_run_times, run_times_section
from eval.intervals import ClusteredCorrelation, cluster_spearman, per_problem_values
from eval.metrics import MEAN_TOKEN_ENTROPY, mixed_group_rate
from report.ablation_tables import ablation_tables
from report.paper_figures import (
    artefact_lines,
    base_vs_sft_lines,
    curve_benchmarks,
    iou_table,
    slug as _slug,
    write_base_vs_sft,
    write_passk_csv,
)
from report.plots import plot_heatmap, plot_pass_at_k
from report.sweep import Sweep, find_sweeps, format_values, plot_sweep
from report.tables import (
    AVERAGE,
    MISSING,
    REFERENCE_VARIANT,
    Block,
    ResultTable,
    Row,
    attach_paper_values,
    comparison_text,
    delta_label,
    fill_estimates,
    load_paper_tables,
    mark_primary,
    primary_gains,
    primary_gains_note,
    primary_note,
    rl_gains,
    signed_estimate,
    to_csv,
    to_latex,
    to_markdown,
    unjudged_note,
)
from common.config import Config, stage_main
from common.config.sft import SFTMethod
from common.manifest import Manifest, StageInputError, read_manifest, stage_run
from common.models import local_model_dir
from common.paths import (
    BASE_VARIANT,
    EVAL_METRICS_FILE,
    HELDOUT_NLL,
    RL_DISCARDED_GROUPS,
    RL_GROUPS_KEPT,
    TRAINING_METRICS_FILE,
    base_run,
    data_dir,
    eval_run,
    heldout_nll_run,
    hf_export_dir,
    report_benchmarks,
    report_dir,
    sft_tokens_path,
)
from common.grid import Arm, ModelGrid, experiment_grid, method_labels, report_run
from common.tracking import dapo_groups_kept, progress, start_wandb

PHASES = {"sft": ("table1", "Method", "Table 1 (stage 1: without RL)"),
          "rl": ("table2", "Method(+DAPO)", "Table 2 (stage 2: after RL)")}
TABLE_NOTE = ("Each cell: mean over seeds and problems [95% bootstrap interval: seeds, then problems, resampled "
              "2000 times with a fixed seed; docs/evaluation.md]. **Bold** / <u>underline</u>: best / second best "
              "whose interval lies above the other rows' (the second: above the rows below it); n.s.: the top value's "
              "interval overlaps another row's, so no rank is marked from there on. <sub>{delta}</sub>: the paired "
              "difference (same seeds, same problems, same resamples) in points; pairing removes the problems' shared "
              "difficulty, so a Δ interval can exclude 0 where the two cells' intervals overlap.")
"""The per-step log of an SFT run (``sft/trainer.py``) and of an RL run (``rl/train.py``)."""
INTERVALS_LEGEND = ("[ ]: 95% bootstrap interval over seeds and problems (with few seeds it understates the "
                    "seed-to-seed spread); ⟨ ⟩: seed-level 95% t-interval over the per-seed means (df = seeds − 1; "
                    "docs/evaluation.md, \"Intervals with few seeds\"); p(Holm): a primary comparison's Holm-adjusted "
                    "p; expl.: exploratory, no test.")
"""The one-line legend under every table with both intervals."""


def row_label(cfg: Config, variant: str) -> str:
    """``report.row_labels`` title of a variant; a sweep label ``eksft_rho0.1`` becomes ``EKSFT (paper eq.) (rho0.1)``."""
    titles = cfg.report.row_labels
    if variant in titles:
        return titles[variant]
    name, _, suffix = variant.partition("_")
    return f"{titles[name]} ({suffix})" if name in titles and suffix else variant


def metrics_path(cfg: Config, phase: str, a: Arm, benchmark: str) -> Path:
    """The ``metrics.json`` of arm ``a``'s evaluation in ``phase`` on ``benchmark`` (``cfg``: the model and seed)."""
    return eval_run(cfg, phase, a.variant, benchmark, a.model(phase)).directory / EVAL_METRICS_FILE


def collect(cfg: Config, phase: str, models: list[ModelGrid], labels: list[str]
            ) -> tuple[ResultTable, dict[str, Path], dict[tuple[str, str], dict]]:
    """The phase's table over ``models`` x ``labels`` x seeds (``cfg.run_seeds()``) with intervals and paired
    differences, the metrics files it read (by ``model/phase/variant/benchmark/seed<s>``), and pass@k curves.

    Curves map (model title, benchmark) to {row label: {seed: metrics.json}}.
    """
    name, header, stage = PHASES[phase]
    names = report_benchmarks(cfg)
    titles = {bench: cfg.report.benchmark_labels.get(bench, bench) for bench in names}
    extra_columns = [titles[bench] for bench in names if bench in cfg.data.extra_benchmarks]
    columns = [titles[bench] for bench in names if bench not in cfg.data.extra_benchmarks]
    docs: dict[tuple[int, str, str], dict[int, dict]] = {}
    inputs: dict[str, Path] = {}
    for m, model in enumerate(models):
        for seed, scfg in model.seeds.items():
            for variant in labels:
                if variant not in model.arms[seed]:
                    continue
                for bench in names:
                    path = metrics_path(scfg, phase, model.arms[seed][variant], bench)
                    if path.exists():
                        docs.setdefault((m, variant, bench), {})[seed] = json.loads(path.read_text(encoding="utf-8"))
                        inputs[f"{model.cfg.model.name}/{phase}/{variant}/{bench}/seed{seed}"] = path
    # The second column is pass@table_k unless some evaluation drew fewer samples than that.
    k = min([cfg.report.table_k, *(doc["n"] for by_seed in docs.values() for doc in by_seed.values())])
    present = sorted({seed for by_seed in docs.values() for seed in by_seed}) or cfg.run_seeds()
    table = ResultTable(caption=f"{stage}: pass@1 (avg@n) and pass@{k} in percent, mean [95% interval] over "
                                f"{_seeds_text(present)} and problems",
                        row_header=header, columns=[*columns, AVERAGE, *extra_columns],
                        metrics=["pass@1", f"pass@{k}"], blocks=[], extra_columns=extra_columns)
    curves: dict[tuple[str, str], dict] = {}
    for m, model in enumerate(models):
        title = model_title(model.cfg)
        rows = [Row(label=row_label(cfg, variant), variant=variant,
                    evaluations={titles[bench]: docs[(m, variant, bench)] for bench in names
                                 if (m, variant, bench) in docs})
                for variant in labels if model.has(variant)]
        for row in rows:
            for bench, column in titles.items():
                if column in row.evaluations:
                    curves.setdefault((title, bench), {})[row.label] = row.evaluations[column]
        table.blocks.append(Block(title=title, rows=rows))
    fill_estimates(table)
    attach_paper_values(table, phase, load_paper_tables())
    return table, inputs, curves


def _seeds_text(seeds: list[int]) -> str:
    """The seeds a table holds (every seed some evaluation of it has), as its caption names them."""
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"


def primary_arms(cfg: Config) -> set[str]:
    """The variants whose ``Δ vs SFT`` are primary comparisons: the labels of ``report.primary_arms`` among
    ``experiment.methods``, or (empty) of every method but SFT."""
    labels = dict(zip(cfg.experiment.methods, method_labels(cfg)))
    chosen = cfg.report.primary_arms or list(labels)
    return {labels[name] for name in chosen if name in labels} - {REFERENCE_VARIANT}


def missing_seeds(cfg: Config, table: ResultTable) -> list[str]:
    """``model / method / benchmark: seeds …`` for every evaluation some but not all seeds have."""
    expected = set(cfg.run_seeds())
    return [f"{block.title} / {row.label} / {column}: seed {', '.join(map(str, sorted(expected - set(by_seed))))}"
            for block in table.blocks for row in block.rows for column, by_seed in row.evaluations.items()
            if expected - set(by_seed)]


# ------------------------------------------------------------------------------------------------ analyses
def trained_exports(arms: dict[str, Arm], phase: str) -> dict[str, Path]:
    """Variant → run folder of every arm whose SFT (phase sft) or RL (phase rl) run is complete with an HF export."""
    exports = {}
    for variant, a in arms.items():
        folder = a.sft if phase == "sft" else a.rl
        manifest = read_manifest(folder) if folder is not None else None
        if manifest is not None and manifest.complete and hf_export_dir(folder).is_dir():
            exports[variant] = folder
    return exports


def base_model_folder(cfg: Config) -> tuple[Path | None, Path | None]:
    """(HF folder of the base model, folder of its manifest) or None where there is no local safetensors copy."""
    if (base := base_run(cfg)) is not None:  # a base model built by a stage of ours
        manifest = read_manifest(base.directory)
        return (hf_export_dir(base.directory), base.directory) if manifest and manifest.complete else (None, None)
    if cfg.model.source != "hub":
        return None, None
    try:
        return Path(local_model_dir(cfg.model.path)), None
    except Exception:  # neither a folder nor in the hub cache (offline machines): the analyses that need it skip
        return None, None


def drift_section(cfg: Config, model: ModelGrid, out_dir: Path, run_) -> tuple[list[str], dict]:
    """Parameter drift of each phase's exports (the first seed's) vs the base model: Markdown lines and
    {phase: {method: fraction}}."""
    mcfg = model.cfg
    title = model_title(mcfg)
    name = _slug(title)
    threshold = cfg.report.analysis.drift_threshold
    lines, metrics = [f"### Parameter drift: {title}", ""], {}
    base, _ = base_model_folder(mcfg)
    if base is None:
        return lines + [f"Skipped: no local safetensors copy of the base model ({mcfg.model.path or 'toy'}).", ""], {}
    for phase in PHASES:
        exports = trained_exports(model.first_seed, phase)
        if not exports:
            lines += [f"Phase {phase}: skipped, no complete {phase.upper()} export of this model yet.", ""]
            continue
        by_method = {row_label(cfg, variant): compare_checkpoints(base, hf_export_dir(stage), threshold,
                                                                  show_progress=cfg.logging.progress)
                     for variant, stage in exports.items()}
        stem = f"drift_{name}_{phase}"
        write_drift(by_method, threshold, out_dir / f"{stem}.json", out_dir / f"{stem}.csv")
        plot_drift(by_method, threshold, f"{title} · {PHASES[phase][2]}", out_dir / f"plots/{stem}_layers.png",
                   out_dir / f"plots/{stem}_fraction.png")
        for relative, text in ((f"{stem}.json", "per-layer drift and fraction above threshold"),
                               (f"{stem}.csv", "per-tensor drift"), (f"plots/{stem}_layers.png", "drift per layer"),
                               (f"plots/{stem}_fraction.png", "fraction of weights above the change threshold")):
            run_.add_output(relative, f"{text}, {title}, phase {phase}")
        metrics[phase] = {label: fraction_above(drifts) for label, drifts in by_method.items()}
        lines += [f"Phase {phase} ({PHASES[phase][2]}): ‖θ − θ₀‖/‖θ₀‖ per layer and the share of weights with "
                  f"|θᵢ − θ₀ᵢ| > {threshold:g}·|θ₀ᵢ|, against the base model.", "",
                  f"![drift per layer](plots/{stem}_layers.png) ![fraction above threshold](plots/{stem}_fraction.png)",
                  "", "| Method | weights above threshold (%) |", "|---|:---:|",
                  *(f"| {label} | {100 * value:.2f} |" for label, value in metrics[phase].items()), "",
                  f"Numbers: [{stem}.json]({stem}.json), per tensor [{stem}.csv]({stem}.csv)", ""]
    return lines, metrics


def iou_section(cfg: Config, model: ModelGrid, out_dir: Path, run_) -> tuple[list[str], dict]:
    """IoU(M_H, M_KL) over the SFT steps of every run that logged it, each seed's run on its own row (``<method>,
    seed <s>`` when there are several seeds): Markdown lines and {run: min/avg/max}."""
    title = model_title(model.cfg)
    name = _slug(title)
    lines = [f"### IoU(M_H, M_KL) over SFT steps: {title}", ""]
    series = {}
    seeds = model.arms
    for seed, arms in seeds.items():
        for variant, stage in trained_exports(arms, "sft").items():
            if (stage / TRAINING_METRICS_FILE).exists():
                found = iou_series(stage / TRAINING_METRICS_FILE)
                if found is not None and found.iou:
                    series[row_label(cfg, variant) + (f", seed {seed}" if len(seeds) > 1 else "")] = found
    if not series:
        return lines + ["Skipped: no complete SFT run of this model logged `stats/iou` (only EKSFT runs do).", ""], {}
    summaries = {label: s.summary() for label, s in series.items()}
    has_fractions = any(s.fractions["M"] for s in series.values())
    stem = f"iou_{name}"
    plot_iou(series, f"{title} · IoU(M_H, M_KL)", out_dir / f"plots/{stem}.png",
             out_dir / f"plots/{stem}_mask_fractions.png" if has_fractions else None)
    table = iou_markdown(summaries)
    (out_dir / f"{stem}.md").write_text(table, encoding="utf-8")
    (out_dir / f"{stem}.json").write_text(json.dumps(summaries, indent=1) + "\n", encoding="utf-8")
    run_.add_output(f"{stem}.md", f"IoU min/avg/max per EKSFT run, {title}")
    run_.add_output(f"{stem}.json", f"IoU min/avg/max per EKSFT run, {title}")
    run_.add_output(f"plots/{stem}.png", f"IoU vs step, {title}")
    skipped = sum(s["skipped_steps"] for s in summaries.values())
    lines += [table, "Steps where M_H or M_KL was empty (the first step: π_θ = π_ref, every KL is 0) are left out"
              f" ({skipped} in all). Paper (Qwen3, ρ = 0.2): min 0.09, avg 0.50, max 0.59.", "",
              f"![IoU]({f'plots/{stem}.png'})"]
    if has_fractions:
        run_.add_output(f"plots/{stem}_mask_fractions.png", f"|M_H|, |M_KL|, |M| over |T| vs step, {title}")
        lines.append(f"![mask fractions](plots/{stem}_mask_fractions.png)")
    return lines + ["", f"Files: [{stem}.md]({stem}.md), [{stem}.json]({stem}.json)", ""], summaries


def case_study_section(cfg: Config, model: ModelGrid, out_dir: Path, run_) -> list[str]:
    """Per-token probabilities of one SFT solution under the base model and each SFT export (the first seed's)."""
    mcfg = model.cfg
    title = model_title(mcfg)
    name = _slug(title)
    analysis = cfg.report.analysis
    lines = [f"### Token-probability case study: {title}", ""]
    base, _ = base_model_folder(mcfg)
    exports = trained_exports(model.first_seed, "sft")
    tokens_path = sft_tokens_path(mcfg)
    if base is None or not exports or not tokens_path.exists():
        missing = [what for what, ok in (("the base model", base is not None), ("an SFT export", bool(exports)),
                                         (str(tokens_path), tokens_path.exists())) if not ok]
        return lines + [f"Skipped: missing {', '.join(missing)}.", ""]
    tokens = read_case_study_row(tokens_path, analysis.case_study_row, analysis.case_study_max_tokens)
    device = analysis.case_study_device or cfg.profile.device
    dtype = "float32" if device == "cpu" else mcfg.model.dtype
    folders = {row_label(cfg, BASE_VARIANT): base,
               **{row_label(cfg, variant): hf_export_dir(stage) for variant, stage in exports.items()}}
    probabilities = {label: token_probabilities(folder, tokens, device, dtype)
                     for label, folder in progress(folders.items(), desc="case study", enabled=cfg.logging.progress,
                                                   unit="model")}
    stem = f"case_study_{name}"
    write_case_study(probabilities, token_texts(base, tokens),
                     f"{title} · SFT row {analysis.case_study_row} ({tokens.row_id}), first {len(tokens.positions)} "
                     "response tokens", out_dir / f"plots/{stem}.png", out_dir / f"{stem}.html", out_dir / f"{stem}.json")
    for relative, text in ((f"plots/{stem}.png", "heatmap"), (f"{stem}.html", "per-token colours with hover values"),
                           (f"{stem}.json", "token texts and probabilities")):
        run_.add_output(relative, f"token-probability case study ({text}), {title}")
    return lines + [f"p(ground-truth token | prefix) under teacher forcing, SFT row {analysis.case_study_row} "
                    f"(`{tokens.row_id}`); mean over the tokens: " +
                    ", ".join(f"{label} {sum(p) / len(p):.3f}" for label, p in probabilities.items()) + ".", "",
                    f"![case study](plots/{stem}.png)", "",
                    f"Interactive: [{stem}.html]({stem}.html); numbers: [{stem}.json]({stem}.json)", ""]


def paper_sft_sections(cfg: Config, sft: tuple[ResultTable, dict, dict], out_dir: Path, run_) -> list[str]:
    """The paper's ablation tables that Table 1's evaluations hold (:mod:`report.ablation_tables`) and its Figure 1
    (:func:`report.paper_figures.write_base_vs_sft`, on the curve benchmarks)."""
    table, _, curves = sft
    lines = []
    for spec, ablation in ablation_tables(cfg, table, load_paper_tables()):
        for suffix, render in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
            (out_dir / f"{spec.stem}.{suffix}").write_text(render(ablation), encoding="utf-8")
            run_.add_output(f"{spec.stem}.{suffix}", f"the paper's tab:{spec.key} ({suffix})")
        lines += [f"## {spec.caption} (paper: `tab:{spec.key}`)", "", f"{ablation.caption}.", "", to_markdown(ablation),
                  TABLE_NOTE.format(delta=delta_label(ablation)), "", INTERVALS_LEGEND,
                  "The ablation tables declare no primary comparison: every Δ is exploratory.",
                  "Numbers in parentheses are the paper's for the same cell." if ablation.has_paper_values else
                  "The paper has no numbers for these models and benchmarks, so only ours are shown.", "",
                  f"Files: [{spec.stem}.md]({spec.stem}.md), [{spec.stem}.csv]({spec.stem}.csv), "
                  f"[{spec.stem}.tex]({spec.stem}.tex)", ""]
    benchmarks = {bench: cfg.report.benchmark_labels.get(bench, bench) for bench in curve_benchmarks(curves)}
    figures = write_base_vs_sft(table, benchmarks, out_dir)
    for figure in figures:
        run_.add_output(figure.png, f"Base vs SFT pass@k (paper Figure 1), {figure.model}, {figure.benchmark}")
        run_.add_output(figure.csv, f"Base and SFT pass@k for every k, {figure.model}, {figure.benchmark}")
    return lines + base_vs_sft_lines(figures)


def paper_iou_section(runs: dict[str, dict[str, dict]], out_dir: Path, run_) -> list[str]:
    """The paper's IoU table (``tab:iou``) over every run that logged IoU (``runs``: model title → run label →
    summary)."""
    rendered = iou_table(runs, load_paper_tables()["iou"])
    for suffix, text in rendered.items():
        (out_dir / f"tab_iou.{suffix}").write_text(text, encoding="utf-8")
        run_.add_output(f"tab_iou.{suffix}", f"the paper's tab:iou ({suffix})")
    return ["### The paper's IoU table (`tab:iou`)", "", rendered["md"],
            "Each value over the run's SFT steps with M_H and M_KL non-empty (a statistic of one run, no interval); "
            "the paper's (Qwen3, ρ = 0.2) in the last column.", "",
            "Files: [tab_iou.md](tab_iou.md), [tab_iou.csv](tab_iou.csv), [tab_iou.tex](tab_iou.tex)", ""]


def curves_section(cfg: Config, model: ModelGrid, labels: list[str], out_dir: Path, run_) -> list[str]:
    """Training curves of the SFT runs and RL runs of ``labels`` (every seed), from their ``metrics.jsonl``."""
    title = model_title(model.cfg)
    lines = [f"### {title}", ""]
    rl_curves = rl_panels(cfg.rl.kept_groups_per_step)
    for phase, panels, what in (("sft", SFT_PANELS, "SFT"), ("rl", rl_curves, "RL (DAPO)")):
        paths = {}
        for variant in filter(model.has, labels):
            by_seed = {}
            for seed, arms in model.arms.items():
                folder = arms[variant].sft if phase == "sft" else arms[variant].rl
                if folder is not None and (folder / TRAINING_METRICS_FILE).exists():
                    by_seed[seed] = folder / TRAINING_METRICS_FILE
            if by_seed:
                paths[row_label(cfg, variant)] = by_seed
        runs = read_runs(paths)
        shown = logged_panels(runs, panels)
        if not shown:
            lines += [f"{what}: skipped, no {what} run of this model has a `{TRAINING_METRICS_FILE}` with these "
                      "quantities yet.", ""]
            continue
        relative = f"plots/curves_{_slug(title)}_{phase}.png"
        plot_curves(runs, shown, f"{title} · {what} training", out_dir / relative,
                    colour_order=[row_label(cfg, variant) for variant in labels])
        run_.add_output(relative, f"{what} training curves, {title}")
        left_out = [panel.title for panel in panels if panel not in shown]
        lines += [f"{what}: " + ", ".join(panel.title for panel in shown) + " over optimiser steps; one line per run "
                  f"and seed ({sum(len(s) for s in runs.values())} runs)."
                  + (f" Not logged by any run: {', '.join(left_out)}." if left_out else ""), "",
                  f"![{what} training curves]({relative})", ""]
    return lines


def rl_gain_section(collected: dict, kept: dict[tuple[int, str], dict[int, float]], endpoints: list[str],
                    arms: set[str]) -> tuple[list[str], dict]:
    """Per RL arm: Table 2 − Table 1 of the same arm in each Table 2 metric's Avg column, paired on seeds and
    problems, and that gain minus SFT's (:func:`report.tables.rl_gains`), each with its seed-level t-interval; the
    ``Δ vs SFT`` of ``arms`` in ``endpoints`` (``report.primary_endpoints.rl_gain``) are primary comparisons with
    Holm-adjusted p-values (:func:`report.tables.primary_gains`), the others exploratory; beside them the share of
    the prompt groups DAPO kept in the arm's RL runs (``kept``: (model index, variant) → seed → share,
    :func:`groups_kept_per_seed`)."""
    if "sft" not in collected or "rl" not in collected:
        return ["Skipped: needs both Table 1 (before RL) and Table 2 (after RL) evaluations.", ""], {}
    before, after = collected["sft"][0], collected["rl"][0]
    by_metric = {metric: rl_gains(before, after, metric) for metric in after.metrics}
    primary = primary_gains(by_metric, endpoints, arms)
    first = after.metrics[0]
    lines = [f"Table 2 − Table 1 of the same arm, Avg column, in points: mean [95% interval] over the seeds and "
             f"problems both evaluated, paired (same resamples); <sub>{delta_label(after)}</sub>: that gain minus "
             f"{after.reference}'s gain, paired on the seeds all four evaluations share.", "", INTERVALS_LEGEND, "",
             primary_gains_note(primary, endpoints), "",
             "| model | arm | seeds | " + " | ".join(f"RL gain in Avg {metric} | {delta_label(after)}"
                                                      for metric in after.metrics)
             + f" | {first} gain per seed | groups DAPO kept |",
             "|---|---|:---:|" + ":---:|:---:|" * len(after.metrics) + ":---:|:---:|"]
    metrics = {}
    for m, blocks in enumerate(zip(*by_metric.values())):  # one model: its (title, gains) under each metric
        title = blocks[0][0]
        for arm in zip(*(gains for _, gains in blocks)):  # one arm: its Gain under each metric
            cells = []
            for metric, gain in zip(after.metrics, arm):
                versus, key = gain.versus_reference, (title, gain.label, metric)
                cells += [signed_estimate(gain.gain, gain.seed_interval),
                          MISSING if versus is None else signed_estimate(versus, gain.versus_seed)
                          + comparison_text(primary, key)]
                metrics[f"{title}/{gain.label}/{metric}"] = {
                    "gain": gain.gain.mean, "low": gain.gain.low, "high": gain.gain.high,
                    "versus_reference": None if versus is None else versus.mean,
                    **({"seed_t": [gain.seed_interval.low, gain.seed_interval.high]} if gain.seed_interval else {}),
                    **({"versus_seed_t": [gain.versus_seed.low, gain.versus_seed.high], "versus_p_t": gain.versus_p}
                       if gain.versus_seed else {}),
                    **({"versus_p_holm": primary[key]} if key in primary else {})}
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


def headroom_section(collected: dict, heldout: dict[tuple[int, str], dict[int, float]], group_size: int
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


def sweep_heatmaps(sweep: Sweep, table: ResultTable, title: str, stem: str, out_dir: Path, run_) -> list[str]:
    """For a sweep over two numeric fields (the (λ_H, λ_KL) grid): one heatmap of the Avg per metric."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for _, values in sweep.points for v in values)
    if len(sweep.fields) != 2 or not numeric:
        return []
    xs = sorted({values[0] for _, values in sweep.points})
    ys = sorted({values[1] for _, values in sweep.points})
    links = []
    for metric in table.metrics:
        relative = f"plots/{stem}_heatmap_{metric.replace('@', '')}.png"
        cells = {values: row.ours.get((AVERAGE, metric))
                 for row, (_, values) in zip(table.blocks[0].rows, sweep.points)}
        plot_heatmap(xs, ys, cells, sweep.fields[0], sweep.fields[1], f"{AVERAGE} {metric} (%)",
                     f"{title} · {AVERAGE} {metric}", out_dir / relative)
        run_.add_output(relative, f"{AVERAGE} {metric} over {sweep.fields[0]} x {sweep.fields[1]}, {title}")
        links.append(f"![{metric} heatmap]({relative})")
    return [" ".join(links), ""]


def evaluated_methods(model: ModelGrid, phase: str, benchmarks: list[str]) -> dict[str, SFTMethod]:
    """Label → SFT method of every arm of ``model`` (the experiment's and the sweep points) with an evaluation in
    ``phase``; the method is the one its SFT run's manifest records."""
    return {variant: a.method for seed, scfg in model.seeds.items()
            for variant, a in model.arms[seed].items()
            if a.method is not None and any(metrics_path(scfg, phase, a, bench).exists() for bench in benchmarks)}


def sweep_tables(cfg: Config, models: list[ModelGrid]
                 ) -> list[tuple[Config, str, Sweep, ResultTable, dict[str, Path]]]:
    """(model config, phase, sweep, table, metrics files) for every method evaluated with ≥ 2 labels."""
    found = []
    for model in models:
        mcfg = model.cfg
        for phase in PHASES:
            for sweep in find_sweeps(evaluated_methods(model, phase, report_benchmarks(cfg))):
                table, files, _ = collect(cfg, phase, [model], [label for label, _ in sweep.points])
                for row, (_, values) in zip(table.blocks[0].rows, sweep.points):
                    row.label = format_values(values)
                table.row_header = ", ".join(sweep.fields)
                table.caption = (f"Sweep of {row_label(cfg, sweep.method)} over {table.row_header} "
                                 f"({PHASES[phase][2]}): pass@1 (avg@n) and {table.metrics[1]} in percent")
                found.append((mcfg, phase, sweep, table, files))
    return found


def sweep_section(cfg: Config, sweeps: list, out_dir: Path, run_) -> list[str]:
    lines = ["### Sweeps", ""]
    if not sweeps:
        return lines + ["Skipped: no method of this experiment was evaluated with two or more settings "
                        "(run a sweep, e.g. `python -m pipeline.run +sweep=eksft_rho ...`).", ""]
    for mcfg, phase, sweep, table, _ in sweeps:
        title = model_title(mcfg)
        stem = f"sweep_{_slug(title)}_{phase}_{sweep.name}"
        for suffix, render in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
            (out_dir / f"{stem}.{suffix}").write_text(render(table), encoding="utf-8")
            run_.add_output(f"{stem}.{suffix}", f"{table.caption} ({suffix})")
        plot_sweep(sweep, table, f"{title} · {row_label(cfg, sweep.method)} · {PHASES[phase][2]}",
                   out_dir / f"plots/{stem}.png")
        run_.add_output(f"plots/{stem}.png", f"metrics vs {table.row_header}, {title}, phase {phase}")
        lines += [f"#### {table.caption}", "", to_markdown(table), f"![sweep](plots/{stem}.png)", "",
                  *sweep_heatmaps(sweep, table, f"{title} · {row_label(cfg, sweep.method)} · {PHASES[phase][2]}",
                                  stem, out_dir, run_),
                  f"Files: [{stem}.md]({stem}.md), [{stem}.csv]({stem}.csv), [{stem}.tex]({stem}.tex); labels "
                  + ", ".join(f"`{label}`" for label, _ in sweep.points), ""]
    return lines


def run(cfg: Config) -> Manifest:
    """Writes the tables, plots, analyses and ``report.md`` of the experiment; skipped when no input changed."""
    if cfg.data.benchmark_source == "bfcl":  # a tool-use experiment: the BFCL appendix tables (docs/tool_use.md)
        return bfcl_report(cfg)
    out_dir = report_dir(cfg)
    grid = experiment_grid(cfg)
    models = grid.models
    labels = grid.variants
    analyses = cfg.report.analysis.run
    rows = {"sft": labels, "rl": grid.rl_variants}
    collected = {phase: collect(cfg, phase, models, rows[phase]) for phase in PHASES}
    collected = {phase: c for phase, c in collected.items() if c[1]}
    if not collected:
        raise StageInputError(f"no eval metrics found for experiment '{cfg.experiment.name}' "
                              f"(models {cfg.profile.models}, variants {labels}); run the eval stages first")
    endpoints = {phase: list(cfg.report.primary_endpoints.get(phase, [])) for phase in (*PHASES, "rl_gain")}
    absent = {phase: mark_primary(table, endpoints[phase], primary_arms(cfg))
              for phase, (table, _, _) in collected.items()}
    sweeps = sweep_tables(cfg, models) if "sweep" in analyses else []
    spec = report_run(cfg)
    with stage_run(out_dir, stage="report", variant="", config=spec.config, inputs=spec.inputs,
                   optional_inputs=True) as run_:
        if run_ is None:
            return read_manifest(out_dir)
        lines = [f"# Report: experiment `{cfg.experiment.name}` (profile {cfg.profile.name})", ""]
        for phase, (table, files, curves) in collected.items():
            name, _, stage = PHASES[phase]
            for suffix, render in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
                (out_dir / f"{name}.{suffix}").write_text(render(table), encoding="utf-8")
                run_.add_output(f"{name}.{suffix}", f"{stage} ({suffix})")
            lines += [f"## {stage}", "", f"{table.caption}.", "", to_markdown(table),
                      TABLE_NOTE.format(delta=delta_label(table)), "", INTERVALS_LEGEND, "",
                      primary_note(table, f"report.primary_endpoints.{phase}", endpoints[phase], absent[phase]), "",
                      unjudged_note(table), ""]
            lines.append("Numbers in parentheses are the paper's for the same cell." if table.has_paper_values else
                         "The paper has no numbers for these models and benchmarks, so only ours are shown.")
            lines += ["", f"Files: [{name}.md]({name}.md), [{name}.csv]({name}.csv) (with each seed's value), "
                          f"[{name}.tex]({name}.tex)", ""]
            missing = [f"{block.title} / {row.label}" for block in table.blocks for row in block.rows
                       if any(value is None for value in row.ours.values())]
            if missing:
                lines += [f"Missing evaluations (shown as –): {', '.join(missing)}", ""]
            partial = missing_seeds(cfg, table)
            if partial:
                lines += [f"Seeds missing (cells use the seeds present): {'; '.join(partial)}", ""]
            lines += ["### pass@k curves", ""]
            numbers = []
            for (title, bench), by_method in curves.items():
                stem = f"passk_{_slug(title)}_{phase}_{bench}"
                column = cfg.report.benchmark_labels.get(bench, bench)
                plot_pass_at_k(by_method, f"{title} · {column} · {stage}", out_dir / f"plots/{stem}.png")
                write_passk_csv(by_method, out_dir / f"{stem}.csv")
                run_.add_output(f"plots/{stem}.png", f"pass@k curves, {title}, {bench}, phase {phase}")
                run_.add_output(f"{stem}.csv", f"pass@k and its 95% band per method and k, {title}, {bench}, "
                                               f"phase {phase}")
                lines.append(f"![{title} {bench}](plots/{stem}.png)")
                numbers.append(f"[{stem}.csv]({stem}.csv)")
            lines += ["", f"Numbers behind the curves: {', '.join(numbers)}", "", "### Eval manifests", ""]
            for key, path in files.items():
                manifest = read_manifest(path.parent)
                status = manifest.status if manifest else "no manifest"
                lines.append(f"* [{key}]({os.path.relpath(path.parent / 'manifest.json', out_dir)}) ({status})")
            lines.append("")
        if "sft" in collected:
            lines += paper_sft_sections(cfg, collected["sft"], out_dir, run_)
        analysis_metrics: dict[str, dict] = {}
        if analyses:
            lines += ["## Analyses", ""]
        iou_runs = {}
        for model in models:
            name = model.cfg.model.name
            if "drift" in analyses:
                more, analysis_metrics[f"drift/{name}"] = drift_section(cfg, model, out_dir, run_)
                lines += more
            if "iou" in analyses:
                more, analysis_metrics[f"iou/{name}"] = iou_section(cfg, model, out_dir, run_)
                lines += more
                if analysis_metrics[f"iou/{name}"]:
                    iou_runs[model_title(model.cfg)] = analysis_metrics[f"iou/{name}"]
            if "case_study" in analyses:
                lines += case_study_section(cfg, model, out_dir, run_)
        if iou_runs:
            lines += paper_iou_section(iou_runs, out_dir, run_)
        if "sweep" in analyses:
            lines += sweep_section(cfg, sweeps, out_dir, run_)
        lines += ["## Training curves", ""]
        for model in models:
            lines += curves_section(cfg, model, labels, out_dir, run_)
        more, analysis_metrics["rl_gain"] = rl_gain_section(collected, groups_kept_per_seed(models, rows["rl"]),
                                                            endpoints["rl_gain"], primary_arms(cfg))
        lines += ["## RL gain per arm", "", *more]
        more, analysis_metrics["headroom"] = headroom_section(collected, heldout_nll_per_seed(models, rows["rl"]),
                                                             cfg.rl.rollout_n)
        lines += ["## RL headroom: what predicts the RL gain", "", *more]
        data = data_dir(cfg)
        more, analysis_metrics["runs"] = run_times_section(
            read_run_times({str(data.relative_to(cfg.experiment.run_root)): data, **spec.inputs}), out_dir)
        if analysis_metrics["runs"]:
            run_.add_output(CSV_NAME, "per run: stage, status, commit, machine, attempts, seconds of work")
        lines += ["## Runs", "", *more]
        curves = curve_benchmarks(collected["sft"][2]) if "sft" in collected else []
        lines[2:2] = artefact_lines(list(run_.manifest.outputs), [model_title(m.cfg) for m in models], curves)
        (out_dir / "report.md").write_text("\n".join(lines), encoding="utf-8")
        run_.add_output("report.md", "tables, plots and links to every eval manifest")
        run_.manifest.metrics = {phase: {f"{block.title}/{row.label}": average_metrics(row)
                                         for block in table.blocks for row in block.rows}
                                 for phase, (table, _, _) in collected.items()}
        run_.manifest.metrics.update({key: value for key, value in analysis_metrics.items() if value})
        log_to_wandb(cfg, run_.manifest, out_dir)
        return run_.manifest


def log_to_wandb(cfg: Config, manifest: Manifest, out_dir: Path) -> None:
    """Under ``logging.wandb_mode`` (nothing when disabled): one wandb run ``<experiment>/report`` in the experiment's
    group with every CSV output as a table (``table1``, ``table2``, sweeps, drift, ...: the CSV's rows and header),
    every PNG output as an image (key: its path without ``.png``), and the manifest's numeric metrics as scalars
    (``table1/<model>/<row>/Avg pass@1``, ...)."""
    tracker = start_wandb(cfg.logging.wandb_mode, project=cfg.logging.wandb_project, group=cfg.experiment.name,
                          name=cfg.logging.run_name or f"{cfg.experiment.name}/report",
                          config={"eval": asdict(cfg.eval), "report": asdict(cfg.report), "models": list(cfg.profile.models)}, directory=out_dir)
    if tracker is None:
        return
    import wandb

    logged: dict[str, Any] = {}
    for relative in manifest.outputs:
        path = out_dir / relative
        if relative.endswith(".csv"):
            header, *rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
            logged[relative.removesuffix(".csv")] = wandb.Table(columns=header, data=rows)
        elif relative.endswith(".png"):
            logged[relative.removesuffix(".png")] = wandb.Image(str(path))
    tables = {phase: name for phase, (name, _, _) in PHASES.items()}
    logged.update({f"{tables.get(group, group)}/{key}": value for group, values in manifest.metrics.items()
                   if isinstance(values, dict) for key, value in _numbers(values).items()})
    tracker.log(logged)
    tracker.finish()


def _numbers(values: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric leaves of nested metrics, keyed ``a/b/c``; a list [mean, low, high] or [low, high] gives
    ``<key>/0``, ``<key>/1``, ..."""
    flat: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_numbers(value, f"{name}/"))
        elif isinstance(value, list):
            flat.update({f"{name}/{i}": item for i, item in enumerate(value) if isinstance(item, (int, float))})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = value
    return flat


def average_metrics(row: Row) -> dict[str, float | list[float] | None]:
    """The row's Avg cells for the manifest: ``Avg pass@1`` (mean), ``Avg pass@1 95%`` ([low, high]),
    ``Avg pass@1 Δ vs reference`` ([mean, low, high]), the seed-level t-intervals of both (``… seed t 95%``) and,
    for a primary comparison, its Holm-adjusted p (``Avg pass@1 Δ vs reference p(Holm)``), where they exist."""
    metrics: dict[str, float | list[float] | None] = {}
    for (column, metric), value in row.ours.items():
        if column != AVERAGE:
            continue
        metrics[f"{column} {metric}"] = value
        if (column, metric) in row.intervals:
            interval = row.intervals[(column, metric)]
            metrics[f"{column} {metric} 95%"] = [interval.low, interval.high]
        if (column, metric) in row.delta:
            delta = row.delta[(column, metric)]
            metrics[f"{column} {metric} Δ vs reference"] = [delta.mean, delta.low, delta.high]
        for name, found in ((f"{column} {metric} seed t 95%", row.seed_intervals.get((column, metric))),
                            (f"{column} {metric} Δ vs reference seed t 95%", row.delta_seed.get((column, metric)))):
            if found is not None:
                metrics[name] = [found.low, found.high]
        if (column, metric) in row.primary:
            metrics[f"{column} {metric} Δ vs reference p(Holm)"] = row.primary[(column, metric)]
    return metrics


def model_title(mcfg: Config) -> str:
    """How a model is named in tables, plot titles and file names: ``model.display_name``, else ``model.name``."""
    return mcfg.model.display_name or mcfg.model.name


main = stage_main(run)


if __name__ == "__main__":
    main()
