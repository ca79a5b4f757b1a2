"""The report stage: ``python -m eval.report experiment=<name> [profile=…]`` (the orchestrator's last stage).

Collects every ``metrics.json`` the eval stages wrote for the experiment's models (``profile.models``), variants
(``base`` and each of ``experiment.methods``) and benchmarks, and writes into ``report_dir(cfg)``:

* ``table1.{md,csv,tex}`` (phase sft) and ``table2.{md,csv,tex}`` (phase rl) in the paper's layout
  (:mod:`eval.tables`), the paper's own numbers in parentheses where the cell exists in the paper;
* ``plots/passk_<model>_<phase>_<benchmark>.png``: pass@k curves, one line per method (:mod:`eval.plots`);
* ``report.md`` linking the tables, plots and every eval manifest used; ``manifest.json``.

Missing evaluations show as "–" and are listed; a phase without any evaluation is left out.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import hydra
from omegaconf import DictConfig

from eval.plots import plot_pass_at_k
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
from pipeline.config import CONF_DIR, Config, compose, to_config
from pipeline.manifest import Manifest, StageInputError, read_manifest, stage_run
from pipeline.paths import BASE_VARIANT, eval_dir, method_label, report_dir

PHASES = {"sft": ("table1", "Method", "Table 1 (stage 1: without RL)"),
          "rl": ("table2", "Method(+DAPO)", "Table 2 (stage 2: after RL)")}


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
                path = eval_dir(mcfg, phase, variant, bench) / "metrics.json"
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
        title = mcfg.model.display_name or mcfg.model.name
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


def run(cfg: Config) -> Manifest:
    """Writes the tables, plots and ``report.md`` of the experiment; skipped when no metrics file changed."""
    out_dir = report_dir(cfg)
    models, labels = model_configs(cfg), variants(cfg)
    collected = {phase: collect(cfg, phase, models, labels) for phase in PHASES}
    collected = {phase: c for phase, c in collected.items() if c[1]}
    if not collected:
        raise StageInputError(f"no eval metrics found for experiment '{cfg.experiment.name}' "
                              f"(models {cfg.profile.models}, variants {labels}); run the eval stages first")
    inputs = {key: path for _, files, _ in collected.values() for key, path in files.items()}
    section = {"models": cfg.profile.models, "variants": labels, "benchmarks": benchmarks(cfg),
               "table_k": cfg.eval.table_k, "benchmark_labels": cfg.eval.benchmark_labels,
               "row_labels": cfg.eval.row_labels}
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
            for (model_title, bench), by_method in curves.items():
                relative = f"plots/passk_{_slug(model_title)}_{phase}_{bench}.png"
                column = cfg.eval.benchmark_labels.get(bench, bench)
                plot_pass_at_k(by_method, f"{model_title} · {column} · {stage}", out_dir / relative)
                run_.add_output(relative, f"pass@k curves, {model_title}, {bench}, phase {phase}")
                lines.append(f"![{model_title} {bench}]({relative})")
            lines += ["", "### Eval manifests", ""]
            for key, path in files.items():
                manifest = read_manifest(path.parent)
                status = manifest.status if manifest else "no manifest"
                lines.append(f"* [{key}]({os.path.relpath(path.parent / 'manifest.json', out_dir)}) ({status})")
            lines.append("")
        (out_dir / "report.md").write_text("\n".join(lines), encoding="utf-8")
        run_.add_output("report.md", "tables, plots and links to every eval manifest")
        run_.manifest.metrics = {phase: {f"{block.title}/{row.label}": {f"{c} {m}": v for (c, m), v in row.ours.items()
                                                                         if c == AVERAGE}
                                         for block in table.blocks for row in block.rows}
                                 for phase, (table, _, _) in collected.items()}
        return run_.manifest


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    run(to_config(cfg))


if __name__ == "__main__":
    main()
