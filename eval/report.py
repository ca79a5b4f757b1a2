"""The report stage: ``python -m eval.report experiment=<name> [profile=…]`` (the orchestrator's last stage).

Collects every ``metrics.json`` the eval stages wrote for the experiment's models (``profile.models``), variants
(``base`` and each of ``experiment.methods``) and benchmarks, and writes into ``report_dir(cfg)``:

* ``table1.{md,csv,tex}`` (phase sft) and ``table2.{md,csv,tex}`` (phase rl) in the paper's layout
  (:mod:`eval.tables`), the paper's own numbers in parentheses where the cell exists in the paper;
* ``plots/passk_<model>_<phase>_<benchmark>.png``: pass@k curves, one line per method (:mod:`eval.plots`);
* the analyses of ``eval.analysis.run`` (:mod:`eval.analyses`, :mod:`eval.sweep`), each skipped with a note in
  ``report.md`` when its inputs are missing: ``drift_<model>_<phase>.{json,csv}`` and ``plots/drift_*.png``
  (parameter drift of every SFT / RL export vs the base model), ``iou_<model>.{md,json}`` and ``plots/iou_*.png``
  (IoU(M_H, M_KL) and mask sizes over the SFT steps of each EKSFT run), ``case_study_<model>.{html,json}`` and
  ``plots/case_study_*.png`` (per-token probabilities of one SFT solution under each model), and
  ``sweep_<model>_<phase>_<method>_<fields>.{md,csv,tex}`` with ``plots/sweep_*.png`` (one per method evaluated
  with ≥ 2 labels);
* ``report.md`` linking the tables, plots and every eval manifest used; ``manifest.json``.

Missing evaluations show as "–" and are listed; a phase without any evaluation is left out.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path


from eval.analyses.case_study import read_case_study_row, token_probabilities, token_texts, write_case_study
from eval.analyses.drift import compare_checkpoints, fraction_above, plot_drift, write_drift
from eval.analyses.iou import iou_markdown, iou_series, plot_iou
from eval.plots import plot_pass_at_k
from eval.run import METRICS_FILE
from eval.sweep import Sweep, evaluated_labels, find_sweeps, format_values, plot_sweep
from eval.tables import (
    AVERAGE,
    Block,
    ResultTable,
    Row,
    add_averages,
    attach_paper_values,
    cell_values,
    load_paper_tables,
    to_csv,
    to_latex,
    to_markdown,
)
from pipeline.config import Config, compose, stage_main
from pipeline.manifest import Manifest, StageInputError, read_manifest, stage_run
from pipeline.models import local_model_dir
from pipeline.paths import (
    BASE_VARIANT,
    base_model_path,
    data_dir,
    eval_dir,
    hf_export_dir,
    method_label,
    report_dir,
    rl_dir,
    sft_dir,
    toy_base_dir,
)
from pipeline.tracking import progress

PHASES = {"sft": ("table1", "Method", "Table 1 (stage 1: without RL)"),
          "rl": ("table2", "Method(+DAPO)", "Table 2 (stage 2: after RL)")}
SFT_TOKENS_FILE = "sft_tokens.parquet"
"""The data stage's tokenised SFT split, ``data/<model>/sft_tokens.parquet``."""


def model_configs(cfg: Config) -> list[Config]:
    """``cfg`` once per model of ``profile.models`` (the command line's model keeps its overrides)."""
    configs = []
    for name in cfg.profile.models:
        model = cfg.model if name == cfg.model.name else \
            compose([f"profile={cfg.profile.name}", f"model={name}"]).model
        configs.append(replace(cfg, model=model))
    return configs


def variants(cfg: Config) -> list[str]:
    """``base`` then the label of each ``experiment.methods`` entry (the selected method keeps its overrides)."""
    labels = []
    for name in cfg.experiment.methods:
        method = cfg.sft.method if name == cfg.sft.method.name else compose([f"sft/method={name}"]).sft.method
        labels.append(method_label(method))
    return [BASE_VARIANT, *labels]


def row_label(cfg: Config, variant: str) -> str:
    """``eval.row_labels`` title of a variant; a sweep label ``eksft_rho0.1`` becomes ``EKSFT (Ours) (rho0.1)``."""
    titles = cfg.eval.row_labels
    if variant in titles:
        return titles[variant]
    name, _, suffix = variant.partition("_")
    return f"{titles[name]} ({suffix})" if name in titles and suffix else variant


def benchmarks(cfg: Config) -> list[str]:
    return list(cfg.eval.benchmarks) or list(cfg.data.benchmarks)


def collect(cfg: Config, phase: str, models: list[Config], labels: list[str]
            ) -> tuple[ResultTable, dict[str, Path], dict[tuple[str, str], dict]]:
    """The phase's table over ``models`` x ``labels``, the metrics files it read (by ``model/phase/variant/benchmark``),
    and pass@k curves.

    Curves map (model title, benchmark) to {row label: (correct counts, n)}.
    """
    name, header, stage = PHASES[phase]
    names = benchmarks(cfg)
    columns = [cfg.eval.benchmark_labels.get(b, b) for b in names]
    docs: dict[tuple[int, str, str], dict] = {}
    inputs: dict[str, Path] = {}
    for m, mcfg in enumerate(models):
        for variant in labels:
            for bench in names:
                path = eval_dir(mcfg, phase, variant, bench) / METRICS_FILE
                if path.exists():
                    docs[(m, variant, bench)] = json.loads(path.read_text(encoding="utf-8"))
                    inputs[f"{mcfg.model.name}/{phase}/{variant}/{bench}"] = path
    # The second column is pass@table_k unless some evaluation drew fewer samples than that.
    k = min([cfg.eval.table_k, *(doc["n"] for doc in docs.values())])
    metrics = ["pass@1", f"pass@{k}"]
    table = ResultTable(caption=f"{stage}: pass@1 (avg@n) and pass@{k} in percent",
                        row_header=header, columns=[*columns, AVERAGE], metrics=metrics, blocks=[])
    curves: dict[tuple[str, str], dict] = {}
    for m, mcfg in enumerate(models):
        title = model_title(mcfg)
        rows = []
        for variant in labels:
            row = Row(label=row_label(cfg, variant), variant=variant)
            for bench, column in zip(names, columns):
                doc = docs.get((m, variant, bench))
                values = cell_values(doc, k) if doc else dict.fromkeys(metrics)
                row.ours.update({(column, metric): value for metric, value in values.items()})
                if doc:
                    curves.setdefault((title, bench), {})[row.label] = (list(doc["correct_counts"].values()), doc["n"])
            add_averages(row, columns, table.metrics)
            rows.append(row)
        table.blocks.append(Block(title=title, rows=rows))
    attach_paper_values(table, phase, load_paper_tables())
    return table, inputs, curves


# ------------------------------------------------------------------------------------------------ analyses
def trained_exports(cfg: Config, phase: str, labels: list[str]) -> dict[str, Path]:
    """Variant → stage folder of every complete SFT (phase sft) or RL (phase rl) run of ``cfg.model`` with an HF
    export: ``labels`` first (in order), then any other run of the experiment (sweep points), sorted."""
    stage_of = (lambda variant: sft_dir(cfg, variant)) if phase == "sft" else (lambda variant: rl_dir(cfg, variant))
    root = stage_of(BASE_VARIANT).parent
    found = sorted(folder.name for folder in root.iterdir() if folder.is_dir()) if root.is_dir() else []
    exports = {}
    for variant in [v for v in labels if v in found] + [v for v in found if v not in labels]:
        manifest = read_manifest(stage_of(variant))
        if manifest is not None and manifest.complete and hf_export_dir(stage_of(variant)).is_dir():
            exports[variant] = stage_of(variant)
    return exports


def base_model_folder(cfg: Config) -> tuple[Path | None, Path | None]:
    """(HF folder of the base model, folder of its manifest) or None where there is no local safetensors copy."""
    if cfg.model.source == "toy":
        manifest = read_manifest(toy_base_dir(cfg))
        return (Path(base_model_path(cfg)), toy_base_dir(cfg)) if manifest and manifest.complete else (None, None)
    if cfg.model.source != "hub":
        return None, None
    try:
        return Path(local_model_dir(cfg.model.path)), None
    except Exception:  # neither a folder nor in the hub cache (offline machines): the analyses that need it skip
        return None, None


def analysis_inputs(cfg: Config, models: list[Config], labels: list[str]) -> dict[str, Path]:
    """Every file the analyses read that decides their outputs (manifests of the compared models, SFT metrics logs,
    the case-study split), so a changed upstream run re-renders the report."""
    analyses = cfg.eval.analysis.run
    inputs: dict[str, Path] = {}
    for mcfg in models:
        name = mcfg.model.name
        _, base_stage = base_model_folder(mcfg)
        if base_stage is not None and {"drift", "case_study"} & set(analyses):
            inputs[f"{name}/base_model"] = base_stage / "manifest.json"
        for phase in PHASES:
            if "drift" in analyses or ("case_study" in analyses and phase == "sft"):
                for variant, stage in trained_exports(mcfg, phase, labels).items():
                    inputs[f"{name}/{phase}_run/{variant}"] = stage / "manifest.json"
        if "iou" in analyses:
            for variant, stage in trained_exports(mcfg, "sft", labels).items():
                if (stage / "metrics.jsonl").exists():
                    inputs[f"{name}/sft_metrics/{variant}"] = stage / "metrics.jsonl"
        tokens = data_dir(mcfg) / name / SFT_TOKENS_FILE
        if "case_study" in analyses and tokens.exists():
            inputs[f"{name}/sft_tokens"] = tokens
    return inputs


def drift_section(cfg: Config, mcfg: Config, labels: list[str], out_dir: Path, run_) -> tuple[list[str], dict]:
    """Parameter drift of each phase's exports vs the base model: Markdown lines and {phase: {method: fraction}}."""
    title = model_title(mcfg)
    name = _slug(title)
    threshold = cfg.eval.analysis.drift_threshold
    lines, metrics = [f"### Parameter drift: {title}", ""], {}
    base, _ = base_model_folder(mcfg)
    if base is None:
        return lines + [f"Skipped: no local safetensors copy of the base model ({mcfg.model.path or 'toy'}).", ""], {}
    for phase in PHASES:
        exports = trained_exports(mcfg, phase, labels)
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


def iou_section(cfg: Config, mcfg: Config, labels: list[str], out_dir: Path, run_) -> tuple[list[str], dict]:
    """IoU(M_H, M_KL) over the SFT steps of every run that logged it: Markdown lines and {run: min/avg/max}."""
    title = model_title(mcfg)
    name = _slug(title)
    lines = [f"### IoU(M_H, M_KL) over SFT steps: {title}", ""]
    series = {}
    for variant, stage in trained_exports(mcfg, "sft", labels).items():
        if (stage / "metrics.jsonl").exists():
            found = iou_series(stage / "metrics.jsonl")
            if found is not None and found.iou:
                series[row_label(cfg, variant)] = found
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


def case_study_section(cfg: Config, mcfg: Config, labels: list[str], out_dir: Path, run_) -> list[str]:
    """Per-token probabilities of one SFT solution under the base model and each SFT export."""
    title = model_title(mcfg)
    name = _slug(title)
    analysis = cfg.eval.analysis
    lines = [f"### Token-probability case study: {title}", ""]
    base, _ = base_model_folder(mcfg)
    exports = trained_exports(mcfg, "sft", labels)
    tokens_path = data_dir(mcfg) / mcfg.model.name / SFT_TOKENS_FILE
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


def sweep_tables(cfg: Config, models: list[Config]) -> list[tuple[Config, str, Sweep, ResultTable, dict[str, Path]]]:
    """(model config, phase, sweep, table, metrics files) for every method evaluated with ≥ 2 labels."""
    found = []
    for mcfg in models:
        for phase in PHASES:
            phase_dir = eval_dir(mcfg, phase, BASE_VARIANT, "_").parents[1]
            for sweep in find_sweeps(evaluated_labels(phase_dir)):
                table, files, _ = collect(cfg, phase, [mcfg], [label for label, _ in sweep.points])
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
                  f"Files: [{stem}.md]({stem}.md), [{stem}.csv]({stem}.csv), [{stem}.tex]({stem}.tex); labels "
                  + ", ".join(f"`{label}`" for label, _ in sweep.points), ""]
    return lines


def run(cfg: Config) -> Manifest:
    """Writes the tables, plots, analyses and ``report.md`` of the experiment; skipped when no input changed."""
    out_dir = report_dir(cfg)
    models, labels = model_configs(cfg), variants(cfg)
    analyses = cfg.eval.analysis.run
    collected = {phase: collect(cfg, phase, models, labels) for phase in PHASES}
    collected = {phase: c for phase, c in collected.items() if c[1]}
    if not collected:
        raise StageInputError(f"no eval metrics found for experiment '{cfg.experiment.name}' "
                              f"(models {cfg.profile.models}, variants {labels}); run the eval stages first")
    sweeps = sweep_tables(cfg, models) if "sweep" in analyses else []
    inputs = {key: path for _, files, _ in collected.values() for key, path in files.items()}
    inputs.update({key: path for *_, files in sweeps for key, path in files.items()})
    inputs.update(analysis_inputs(cfg, models, labels))
    section = {"models": cfg.profile.models, "variants": labels, "benchmarks": benchmarks(cfg),
               "table_k": cfg.eval.table_k, "benchmark_labels": cfg.eval.benchmark_labels,
               "row_labels": cfg.eval.row_labels, "analysis": asdict(cfg.eval.analysis)}
    with stage_run(out_dir, stage="report", variant="", config=section, inputs=inputs) as run_:
        if run_ is None:
            return read_manifest(out_dir)
        lines = [f"# Report: experiment `{cfg.experiment.name}` (profile {cfg.profile.name})", ""]
        for phase, (table, files, curves) in collected.items():
            name, _, stage = PHASES[phase]
            for suffix, render in (("md", to_markdown), ("csv", to_csv), ("tex", to_latex)):
                (out_dir / f"{name}.{suffix}").write_text(render(table), encoding="utf-8")
                run_.add_output(f"{name}.{suffix}", f"{stage} ({suffix})")
            lines += [f"## {stage}", "", to_markdown(table)]
            lines.append("Numbers in parentheses are the paper's for the same cell." if table.has_paper_values else
                         "The paper has no numbers for these models and benchmarks, so only ours are shown.")
            lines += ["", f"Files: [{name}.md]({name}.md), [{name}.csv]({name}.csv), [{name}.tex]({name}.tex)", ""]
            missing = [f"{block.title} / {row.label}" for block in table.blocks for row in block.rows
                       if any(value is None for value in row.ours.values())]
            if missing:
                lines += [f"Missing evaluations (shown as –): {', '.join(missing)}", ""]
            lines += ["### pass@k curves", ""]
            for (title, bench), by_method in curves.items():
                relative = f"plots/passk_{_slug(title)}_{phase}_{bench}.png"
                column = cfg.eval.benchmark_labels.get(bench, bench)
                plot_pass_at_k(by_method, f"{title} · {column} · {stage}", out_dir / relative)
                run_.add_output(relative, f"pass@k curves, {title}, {bench}, phase {phase}")
                lines.append(f"![{title} {bench}]({relative})")
            lines += ["", "### Eval manifests", ""]
            for key, path in files.items():
                manifest = read_manifest(path.parent)
                status = manifest.status if manifest else "no manifest"
                lines.append(f"* [{key}]({os.path.relpath(path.parent / 'manifest.json', out_dir)}) ({status})")
            lines.append("")
        analysis_metrics: dict[str, dict] = {}
        if analyses:
            lines += ["## Analyses", ""]
        for mcfg in models:
            if "drift" in analyses:
                more, analysis_metrics[f"drift/{mcfg.model.name}"] = drift_section(cfg, mcfg, labels, out_dir, run_)
                lines += more
            if "iou" in analyses:
                more, analysis_metrics[f"iou/{mcfg.model.name}"] = iou_section(cfg, mcfg, labels, out_dir, run_)
                lines += more
            if "case_study" in analyses:
                lines += case_study_section(cfg, mcfg, labels, out_dir, run_)
        if "sweep" in analyses:
            lines += sweep_section(cfg, sweeps, out_dir, run_)
        (out_dir / "report.md").write_text("\n".join(lines), encoding="utf-8")
        run_.add_output("report.md", "tables, plots and links to every eval manifest")
        run_.manifest.metrics = {phase: {f"{block.title}/{row.label}": {f"{c} {m}": v for (c, m), v in row.ours.items()
                                                                         if c == AVERAGE}
                                         for block in table.blocks for row in block.rows}
                                 for phase, (table, _, _) in collected.items()}
        run_.manifest.metrics.update({key: value for key, value in analysis_metrics.items() if value})
        return run_.manifest


def model_title(mcfg: Config) -> str:
    """How a model is named in tables, plot titles and file names: ``model.display_name``, else ``model.name``."""
    return mcfg.model.display_name or mcfg.model.name


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


main = stage_main(run)


if __name__ == "__main__":
    main()
