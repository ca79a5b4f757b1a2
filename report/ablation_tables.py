"""The paper's ablation tables in its layout, each beside the paper's numbers: Table 3 (``tab:ablation``), the
masking-mechanism table (``tab:ablation_masking``), the masking-ratio table (``tab:ratio``) and the random-masking
table (``tab:random_mask``), from the Table 1 evaluations the report collected (phase sft).

Each :class:`PaperTable` names its rows by ``conf/sft/method`` preset (the row's variant is that preset's method
label) and the paper's row title for it, and the paper's benchmarks. A table is built per model block of Table 1
(the first model's only, for the tables the paper ran on Qwen3-4B alone) from the rows Table 1 has, with:

* columns: the paper's benchmarks among the report's own (all of the report's when it has none of them: the toy
  world), then the extra benchmarks (``data.extra_benchmarks``); no Avg column, as in the paper;
* cells as in Table 1 (mean [95% interval] over seeds and problems, marks only where intervals separate) and a
  ``Δ vs EKSFT (paper eq.)`` line under each row, the paired difference to the ``eksft`` arm, the paper's own
  reference row in these tables;
* the paper's value in parentheses where ``report/paper_tables.json`` has the same model, row, column and metric.

The ratio table's ρ = 0 row is the ``sft`` arm and its ρ = 0.2 row the ``eksft`` arm: EKSFT at k = 0 is plain CE
bit for bit (``tests/unit/test_losses.py``), and the paper's ρ = 0.0 and 0.2 rows repeat its SFT and EKSFT rows of
Table 1. A table is written only when one of its own arms (a row other than ``sft`` and ``eksft``) was evaluated.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from common.config import Config, compose
from common.paths import method_label
from report.tables import AVERAGE, Block, ResultTable, Row, fill_estimates

REFERENCE_PRESET = "eksft"
"""The arm every other row's paired difference is taken against: EKSFT with the paper's equations."""
SHARED_PRESETS = ("sft", "eksft")
"""Arms Table 1 has too; a table made of these alone is not written."""


@dataclass(frozen=True)
class PaperTable:
    """One ablation table of the paper."""

    key: str
    """``tab:<key>`` in the .tex, the table's entry in ``paper_tables.json`` and its file stem (``tab_<key>``)."""
    caption: str
    row_header: str
    rows: tuple[tuple[str, str, str], ...]
    """(``conf/sft/method`` preset, our row title, the paper's row title) in the paper's order."""
    benchmarks: tuple[str, ...]
    """The paper's benchmark columns, by benchmark name."""
    first_model_only: bool = False
    """The paper ran it on Qwen3-4B alone: only the first model's block."""

    @property
    def stem(self) -> str:
        return f"tab_{self.key}"


PAPER_BENCHMARKS = ("aime24", "aime25", "amc", "hmmt25")
EKSFT_ROW = ("eksft", "EKSFT (paper eq.)", "EKSFT")
ABLATION_TABLES = (
    PaperTable("ablation", "Table 3: ablation of the regularisers (EKSFT, paper eq., λ_H and λ_KL set to 0)", "Model",
               (EKSFT_ROW,
                ("eksft_no_entropy", "w/o entropy regularisation (λ_H = 0)", "w/o Entropy Regularization"),
                ("eksft_no_kl", "w/o KL regularisation (λ_KL = 0)", "w/o KL Regularization"),
                ("eksft_no_reg", "w/o entropy & KL regularisation (λ = 0)", "w/o Entropy & KL Regularization")),
               PAPER_BENCHMARKS),
    PaperTable("ablation_masking",
               "Table 6: ablation of the masking mechanism (CE and both regularisers on every token)", "Model",
               (EKSFT_ROW,
                ("eksft_global_reg", "SFT w/ entropy & KL regularisation (global)",
                 "SFT w/ Entropy & KL Regularization")),
               PAPER_BENCHMARKS),
    PaperTable("ratio", "Table 8: sensitivity to the masking ratio ρ (ρ = 0 is the SFT run, ρ = 0.2 the EKSFT run)",
               "ρ",
               (("sft", "0.0 (SFT)", "0.0"), ("eksft_rho01", "0.1", "0.1"), ("eksft", "0.2 (EKSFT, paper eq.)", "0.2"),
                ("eksft_rho03", "0.3", "0.3"), ("eksft_rho04", "0.4", "0.4")),
               PAPER_BENCHMARKS[:3], first_model_only=True),
    PaperTable("random_mask", "Table 9: comparison with random masking (10% of the tokens, regularised like M)",
               "Method",
               (("eksft", "EKSFT (paper eq.)", "EKSFT (Ours)"),
                ("eksft_random_mask", "Random masking (10%)", "Random Masking (10%)")),
               PAPER_BENCHMARKS[:3], first_model_only=True),
)
"""The paper's ablation tables in the order of its pages (numbered as its captions are: Table 3 in the main text,
Tables 6, 8 and 9 in the appendix)."""


@functools.lru_cache(maxsize=None)
def preset_label(preset: str) -> str:
    """The method label (the variant) of a ``conf/sft/method`` preset."""
    return method_label(compose([f"sft/method={preset}"]).sft.method)


def table_columns(cfg: Config, table1: ResultTable, spec: PaperTable) -> list[str]:
    """The paper's benchmark columns Table 1 has (all of its averaged columns when it has none), then its extra
    columns."""
    titles = [cfg.report.benchmark_labels.get(name, name) for name in spec.benchmarks]
    paper = [column for column in table1.averaged_columns if column in titles]
    return [*(paper or table1.averaged_columns), *table1.extra_columns]


def ablation_table(cfg: Config, table1: ResultTable, spec: PaperTable, paper_tables: dict) -> ResultTable | None:
    """``spec`` built from Table 1's rows (``table1``, phase sft, filled by :func:`report.tables.fill_estimates`),
    with intervals, the paired ``Δ vs EKSFT`` and the paper's values; None when none of its own arms was evaluated."""
    columns = table_columns(cfg, table1, spec)
    blocks = table1.blocks[:1] if spec.first_model_only else table1.blocks
    own = {preset_label(preset) for preset, _, _ in spec.rows if preset not in SHARED_PRESETS}
    table = ResultTable(caption=spec.caption + f": pass@1 (avg@n) and {table1.metrics[1]} in percent, mean [95% "
                                               "interval] over seeds and problems",
                        row_header=spec.row_header, columns=columns, metrics=list(table1.metrics), blocks=[],
                        extra_columns=list(table1.extra_columns))
    found = False
    for block in blocks:
        ours = {row.variant: row for row in block.rows}
        paper = paper_tables.get(spec.key, {}).get(block.title, {})
        rows = []
        for preset, title, paper_title in spec.rows:
            row = ours.get(preset_label(preset))
            if row is None:
                continue
            found |= row.variant in own and bool(row.evaluations)
            copy = Row(label=title, variant=row.variant,
                       evaluations={column: row.evaluations[column] for column in columns
                                    if column in row.evaluations})
            copy.paper = {(column, metric): value for column, by_metric in paper.get(paper_title, {}).items()
                          for metric, value in by_metric.items() if column in columns and column != AVERAGE}
            rows.append(copy)
        if rows:
            table.blocks.append(Block(title=block.title, rows=rows))
    if not found:
        return None
    fill_estimates(table, reference_variant=preset_label(REFERENCE_PRESET))
    return table


def ablation_tables(cfg: Config, table1: ResultTable, paper_tables: dict) -> list[tuple[PaperTable, ResultTable]]:
    """Every table of :data:`ABLATION_TABLES` the report's evaluations hold one of its own arms for."""
    built = [(spec, ablation_table(cfg, table1, spec, paper_tables)) for spec in ABLATION_TABLES]
    return [(spec, table) for spec, table in built if table is not None]
