"""Schema of the report stage (``report.*``): the tables' k and titles, the analyses beyond Tables 1-2, and which
``Δ vs SFT`` comparisons are primary. The report's identity holds them; no evaluation's does."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from common.config.common import ConfigError, check_choice, check_range

ANALYSES = ("drift", "iou", "case_study", "sweep")
"""Analyses the report stage can add next to the tables and pass@k curves."""
ENDPOINT_TABLES = ("sft", "rl", "rl_gain")
"""Where primary endpoints are declared: Table 1's and Table 2's ``Δ vs SFT`` lines, the RL gain's ``Δ vs SFT``."""
ENDPOINT = re.compile(r"\S(.*\S)? pass@[1-9][0-9]*")
"""An endpoint names a table cell: its column title and metric, ``Avg pass@1``."""
PAPER_ROW_LABELS = {"base": "Base", "sft": "SFT", "dft": "DFT", "iwsft": "IW-SFT", "psft": "PSFT",
                    "eksft": "EKSFT (paper eq.)", "eksft_compatofficial_code": "EKSFT (official code)",
                    "asft": "ASFT", "gem": "GEM", "sedsft": "SED-SFT", "eaft": "EAFT",
                    "highentropy": "CE on top-ρ H (ours)", "eksft_lambda_entropy0_lambda_kl0": "masking only (λ = 0)",
                    "eksft_lambda_entropy0": "EKSFT w/o entropy", "eksft_lambda_kl0": "EKSFT w/o KL",
                    "eksft_global_regularisationTrue": "EKSFT, global regularisation",
                    "eksft_compatofficial_code_mask_alignmentpaper": "EKSFT (official code, paper's alignment)",
                    "eksft_selectionrandom": "EKSFT, random mask (10%)",
                    "eksft_selectionrandom_matched": "EKSFT, random mask (EKSFT's size)",
                    "eksft_combineintersection": "EKSFT, M_H ∩ M_KL", "eksft_rho0.02": "EKSFT (paper eq.), ρ 0.02",
                    "eksft_rho0.05": "EKSFT (paper eq.), ρ 0.05", "eksft_rho0.1": "EKSFT (paper eq.), ρ 0.1",
                    "eksft_rho0.3": "EKSFT (paper eq.), ρ 0.3", "eksft_rho0.4": "EKSFT (paper eq.), ρ 0.4",
                    "profit": "ProFit", "pear_behaviourdata": "PEAR",
                    "pear": "PEAR, π_β = base model (variant)"}
"""Row titles by method label (``common.paths.method_label``): ``eksft`` is EKSFT as the paper's equations write it,
``eksft_compatofficial_code`` (``sft/method=eksft_official``) as the public code runs it (docs/methods.md), and
``eksft_lambda_entropy0_lambda_kl0`` (``sft/method=eksft_no_reg``) masks M from CE with no regulariser; the paper's
other ablations and presets (``conf/sft/method/``) by what they change; ``pear_behaviourdata`` (``sft/method=pear``)
is PEAR as its paper defines it, ``pear`` (``sft/method=pear_base_ref``) the variant with the base model as π_β."""


@dataclass
class AnalysisConfig:
    """The report's analyses (``report.run``): parameter drift, IoU(M_H, M_KL), token-probability case study, sweeps."""

    run: list[str] = field(default_factory=lambda: list(ANALYSES))
    """Analyses to produce, a subset of drift, iou, case_study, sweep (each is skipped with a note when its inputs are missing)."""
    drift_threshold: float = 1e-3
    """A weight counts as changed when |θ − θ₀| > drift_threshold · |θ₀| (the paper's fraction above the change threshold)."""
    case_study_row: int = 0
    """Row index of the tokenised SFT split (``data/<model>/sft_tokens.parquet``) whose response the case study scores."""
    case_study_max_tokens: int = 64
    """Score only the first N response tokens of that row."""
    case_study_device: str = ""
    """Device of the case-study forwards (cpu, cuda); empty = profile.device."""

    def validate(self) -> None:
        for name in self.run:
            check_choice("report.analysis.run[]", name, ANALYSES)
        check_range("report.analysis.drift_threshold", self.drift_threshold, 0.0)
        check_range("report.analysis.case_study_row", self.case_study_row, 0)
        check_range("report.analysis.case_study_max_tokens", self.case_study_max_tokens, 1)
        check_choice("report.analysis.case_study_device", self.case_study_device, ("", "cpu", "cuda"))


@dataclass
class ReportConfig:
    """The tables, analyses and primary comparisons of ``python -m report.run`` (docs/report.md)."""

    table_k: int = 32
    """k of the tables' second metric column (pass@k; the paper's pass@32), capped at a benchmark's sample count."""
    benchmark_labels: dict[str, str] = field(default_factory=dict)
    """Column titles of the tables by benchmark name (missing: the name itself)."""
    row_labels: dict[str, str] = field(default_factory=lambda: dict(PAPER_ROW_LABELS))
    """Row titles of the tables by variant / method name (missing: the label itself)."""
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    """The report stage's analyses beyond Tables 1-2 and the pass@k curves."""
    primary_endpoints: dict[str, list[str]] = field(default_factory=lambda: {
        "sft": ["Avg pass@1", "Avg pass@32"], "rl": ["Avg pass@1", "Avg pass@32"], "rl_gain": []})
    """The primary endpoints of the report's ``Δ vs SFT`` comparisons, by table: ``sft`` (Table 1), ``rl`` (Table 2),
    ``rl_gain`` (the RL gain minus SFT's; its column is Avg). Each is a cell, ``<column> <metric>``. Per table, the
    comparisons of the primary arms in these cells get Holm-adjusted p-values; every other Δ cell is exploratory."""
    primary_arms: list[str] = field(default_factory=list)
    """The arms (``experiment.methods`` entries) whose ``Δ vs SFT`` are primary comparisons; empty: every method but
    SFT itself (Base is never one)."""

    def validate(self) -> None:
        check_range("report.table_k", self.table_k, 1)
        for table, endpoints in self.primary_endpoints.items():
            check_choice("report.primary_endpoints (a table)", table, ENDPOINT_TABLES)
            for endpoint in endpoints:
                if not isinstance(endpoint, str) or not ENDPOINT.fullmatch(endpoint):
                    raise ConfigError(f"report.primary_endpoints.{table} has {endpoint!r}; an endpoint is a table "
                                      "cell, '<column title> pass@<k>' (e.g. 'Avg pass@1')")
                if table == "rl_gain" and not endpoint.startswith("Avg "):
                    raise ConfigError(f"report.primary_endpoints.rl_gain has {endpoint!r}; the RL gain is computed "
                                      "in the Avg column only (e.g. 'Avg pass@1')")
        if len(set(self.primary_arms)) != len(self.primary_arms):
            raise ConfigError(f"report.primary_arms has duplicates: {self.primary_arms}")
        self.analysis.validate()


MOVED_FROM_EVAL = ("table_k", "benchmark_labels", "row_labels", "analysis", "primary_endpoints", "primary_arms")
"""The ``eval.*`` keys that are now ``report.*`` keys (:func:`refuse_moved_keys`)."""


def refuse_moved_keys(overrides: list[str] | tuple[str, ...]) -> None:
    """Raises :class:`ConfigError` naming the new key of an override of a key that moved from ``eval`` to
    ``report`` (``eval.table_k=16`` is ``report.table_k=16``)."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        old, _, rest = key.partition(".")
        name = rest.split(".", 1)[0]
        if old == "eval" and name in MOVED_FROM_EVAL:
            raise ConfigError(f"{key} is now report.{rest} (the report's settings are report.* keys); write "
                              f"{override.replace('eval.', 'report.', 1)}")
