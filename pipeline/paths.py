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

import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

from pipeline.config import Config, ConfigError
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


def parse_method_label(label: str) -> SFTMethod:
    """Inverse of :func:`method_label`: ``eksft_rho0.1`` → ``EKSFTMethod(rho=0.1)``, ``eksft`` → the defaults.

    Field names may contain underscores and prefix each other (``dynamic_lambda``, ``dynamic_lambda_factor``), so
    every split into fields (in schema order) and typed values is tried; the first whose :func:`method_label` is
    ``label`` again wins. Raises ``ValueError`` naming the label when none does (e.g. ``my_model``).
    """
    name, _, rest = label.partition("_")
    if name not in SFT_METHOD_SCHEMAS:
        raise ValueError(f"label {label!r} does not start with an SFT method name ({sorted(SFT_METHOD_SCHEMAS)})")
    schema = SFT_METHOD_SCHEMAS[name]
    types = typing.get_type_hints(schema)
    names = [f.name for f in fields(schema) if f.name != "name"]
    for values in _field_splits(rest, names, types):
        method = schema(**values)
        try:
            method.validate()
        except ConfigError:
            continue
        if method_label(method) == label:
            return method
    raise ValueError(f"label {label!r} is not a label of method {name} (fields {names})")


def _field_splits(text: str, names: list[str], types: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every way to read ``text`` as ``<field><value>_<field><value>...`` with fields in the order of ``names``."""
    if not text:
        yield {}
        return
    for index, name in enumerate(names):
        if not text.startswith(name):
            continue
        tail = text[len(name):]
        for end in [*(i for i, ch in enumerate(tail) if ch == "_"), len(tail)]:
            value = _typed_value(tail[:end], types[name])
            if value is _NOT_A_VALUE:
                continue
            rest = tail[end + 1:] if end < len(tail) else ""
            for values in _field_splits(rest, names[index + 1:], types):
                yield {name: value, **values}


_NOT_A_VALUE = object()


def _typed_value(text: str, annotation: Any) -> Any:
    """``text`` as written by :func:`_format_value` for a field of type ``annotation``, or ``_NOT_A_VALUE``."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else (annotation,)
    if type(None) in options and text == "None":
        return None
    for kind in options:
        if kind is bool and text in ("True", "False"):
            return text == "True"
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                continue
        if kind is str:
            return text
    return _NOT_A_VALUE


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
