"""Where each stage of a run reads and writes, derived from the config alone (no path arithmetic elsewhere).

    <run_root>/<experiment>/data/                                  sft.parquet, rl.parquet, benchmarks/, manifest.json
    <run_root>/cache/base/<toy-config-hash>/                       toy base model (shared across experiments)
    <run_root>/<experiment>/sft/<model>/<method-label>/            checkpoints/, hf/, metrics.jsonl, manifest.json
    <run_root>/<experiment>/rl/<model>/<variant>/                  verl checkpoints, hf/, metrics.jsonl, manifest.json
    <run_root>/<experiment>/eval/<model>/<phase>/<variant>/<benchmark>/   samples.jsonl, metrics.json, manifest.json
    <run_root>/<experiment>/report/                                tables, plots, report.md

``variant`` is ``base`` (the untrained base model) or an SFT method label; ``phase`` is ``sft`` (Table 1) or
``rl`` (Table 2).
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from pipeline.config import Config
from pipeline.config.sft import SFT_METHOD_SCHEMAS, SFTMethod
from pipeline.manifest import cache_dir, config_hash, stage_dir

BASE_VARIANT = "base"
"""Variant name of the untrained base model (the 'Base' rows of Tables 1 and 2)."""


def _format_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def method_label(method: SFTMethod) -> str:
    """Folder/table label of an SFT method: its name plus every field that differs from the schema default.

    ``eksft`` with the paper's values is ``eksft``; a sweep point with ρ=0.1 is ``eksft_rho0.1``, so sweep
    members and ablations never share a folder.
    """
    schema = SFT_METHOD_SCHEMAS[method.name]
    defaults = schema()
    parts = [method.name]
    for f in fields(schema):
        if f.name == "name":
            continue
        value = getattr(method, f.name)
        if value != getattr(defaults, f.name):
            parts.append(f"{f.name}{_format_value(value)}")
    return "_".join(parts)


def data_dir(cfg: Config) -> Path:
    return stage_dir(cfg.experiment.run_root, cfg.experiment.name, "data")


def toy_base_dir(cfg: Config) -> Path:
    """Cache folder of the toy base model, keyed by the settings it depends on (re-runs and other experiments reuse it)."""
    return cache_dir(cfg.experiment.run_root, "base", config_hash(cfg.toy.base_model_settings()))


def base_model_path(cfg: Config) -> str:
    """What ``from_pretrained`` gets for the base model: the toy cache's ``hf/`` folder, or the hub id / local folder."""
    if cfg.model.source == "toy":
        return str(toy_base_dir(cfg) / "hf")
    return cfg.model.path


def sft_dir(cfg: Config, label: str | None = None) -> Path:
    label = label or method_label(cfg.sft.method)
    return stage_dir(cfg.experiment.run_root, cfg.experiment.name, "sft", f"{cfg.model.name}/{label}")


def rl_dir(cfg: Config, variant: str) -> Path:
    return stage_dir(cfg.experiment.run_root, cfg.experiment.name, "rl", f"{cfg.model.name}/{variant}")


def eval_dir(cfg: Config, phase: str, variant: str, benchmark: str) -> Path:
    return stage_dir(cfg.experiment.run_root, cfg.experiment.name, "eval",
                     f"{cfg.model.name}/{phase}/{variant}/{benchmark}")


def report_dir(cfg: Config) -> Path:
    return stage_dir(cfg.experiment.run_root, cfg.experiment.name, "report")


def hf_export_dir(stage_directory: Path) -> Path:
    """The HF folder (safetensors + tokenizer + generation config) a training stage hands downstream."""
    return stage_directory / "hf"
