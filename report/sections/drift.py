"""Parameter drift of every SFT / RL export vs the base model (:mod:`report.analyses.drift`): the paper's appendix
"Parameters Drift"."""
from __future__ import annotations

from pathlib import Path

from report.analyses.drift import compare_checkpoints, fraction_above, plot_drift, write_drift
from report.collect import PHASE_MODELS, PHASES, Collected, base_model_folder, model_title, row_label, trained_exports
from report.paper_figures import slug as _slug
from report.sections import Section, per_model
from common.config import Config
from common.grid import Grid, ModelGrid
from common.paths import hf_export_dir


def render(grid: Grid, collected: Collected) -> Section:
    """One subsection per model; metrics ``drift/<model>``: {phase: {method: fraction above the threshold}}."""
    return per_model(grid, collected, "drift", drift_section)


def drift_section(cfg: Config, model: ModelGrid, out_dir: Path, section) -> tuple[list[str], dict]:
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
        plot_drift(by_method, threshold, f"{title} · {PHASE_MODELS[phase]}", out_dir / f"plots/{stem}_layers.png",
                   out_dir / f"plots/{stem}_fraction.png")
        for relative, text in ((f"{stem}.json", "per-layer drift and fraction above threshold"),
                               (f"{stem}.csv", "per-tensor drift"), (f"plots/{stem}_layers.png", "drift per layer"),
                               (f"plots/{stem}_fraction.png", "fraction of weights above the change threshold")):
            section.add_output(relative, f"{text}, {title}, phase {phase}")
        metrics[phase] = {label: fraction_above(drifts) for label, drifts in by_method.items()}
        lines += [f"Phase {phase} ({PHASE_MODELS[phase]}): ‖θ − θ₀‖/‖θ₀‖ per layer and the share of weights with "
                  f"|θᵢ − θ₀ᵢ| > {threshold:g}·|θ₀ᵢ|, against the base model.", "",
                  f"![drift per layer](plots/{stem}_layers.png) ![fraction above threshold](plots/{stem}_fraction.png)",
                  "", "| Method | weights above threshold (%) |", "|---|:---:|",
                  *(f"| {label} | {100 * value:.2f} |" for label, value in metrics[phase].items()), "",
                  f"Numbers: [{stem}.json]({stem}.json), per tensor [{stem}.csv]({stem}.csv)", ""]
    return lines, metrics
