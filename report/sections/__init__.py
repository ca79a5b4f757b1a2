"""The sections of ``report.md``, one module each, one shape: ``render(grid, collected) -> Section`` reads the
experiment's grid (:func:`common.grid.experiment_grid`) and what the report collected
(:class:`report.collect.Collected`), writes its files into the report folder and returns its lines, those files and
its manifest metrics.
``report.run.SECTIONS`` lists them in the order ``report.md`` shows them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Section:
    """What a section adds to the report."""

    lines: list[str] = field(default_factory=list)
    """Its Markdown lines in ``report.md``."""
    files: dict[str, str] = field(default_factory=dict)
    """The files it wrote (path relative to the report folder → description), in order: the manifest's outputs."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Its numbers for the manifest, by top-level key (an empty value is left out of the manifest)."""

    def add_output(self, relative: str, description: str) -> None:
        """Records a file the section wrote."""
        self.files[relative] = description

    def extend(self, other: "Section") -> None:
        """Appends ``other``'s lines, files and metrics."""
        self.lines += other.lines
        self.files.update(other.files)
        self.metrics.update(other.metrics)


def per_model(grid: Any, collected: Any, name: str, model_section: Callable[..., tuple[list[str], Any]]) -> Section:
    """One subsection per model of ``grid``: ``model_section(cfg, model, out_dir, section) -> (lines, metrics)`` adds
    its files to ``section``; its metrics go under ``<name>/<model name>``."""
    section = Section()
    for model in grid.models:
        lines, metrics = model_section(grid.cfg, model, collected.out_dir, section)
        section.lines += lines
        section.metrics[f"{name}/{model.cfg.model.name}"] = metrics
    return section
