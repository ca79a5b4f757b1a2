"""Per-token probabilities of one SFT solution under the base model and each SFT export
(:mod:`report.analyses.case_study`): the paper's token-probability case study."""
from __future__ import annotations

from pathlib import Path

from report.analyses.case_study import read_case_study_row, token_probabilities, token_texts, write_case_study
from report.collect import Collected, base_model_folder, model_title, row_label, trained_exports
from report.paper_figures import slug as _slug
from report.sections import Section
from common.config import Config
from common.grid import Grid, ModelGrid
from common.paths import BASE_VARIANT, hf_export_dir, sft_tokens_path
from common.tracking import progress


def render(grid: Grid, collected: Collected) -> Section:
    """One subsection per model (its first seed's exports)."""
    section = Section()
    for model in grid.models:
        section.lines += case_study_section(grid.cfg, model, collected.out_dir, section)
    return section


def case_study_section(cfg: Config, model: ModelGrid, out_dir: Path, section) -> list[str]:
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
        section.add_output(relative, f"token-probability case study ({text}), {title}")
    return lines + [f"p(ground-truth token | prefix) under teacher forcing, SFT row {analysis.case_study_row} "
                    f"(`{tokens.row_id}`); mean over the tokens: " +
                    ", ".join(f"{label} {sum(p) / len(p):.3f}" for label, p in probabilities.items()) + ".", "",
                    f"![case study](plots/{stem}.png)", "",
                    f"Interactive: [{stem}.html]({stem}.html); numbers: [{stem}.json]({stem}.json)", ""]
