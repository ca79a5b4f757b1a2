"""Parameter drift of a trained model from its base model, tensor by tensor, straight from the safetensors files.

For every tensor θ (base θ₀): the relative change ‖θ − θ₀‖₂ / ‖θ₀‖₂ and the number of weights whose change exceeds
the threshold τ relative to their base value, |θᵢ − θ₀ᵢ| > τ·|θ₀ᵢ| (a weight that was 0 counts once it moved at
all). Per layer, the relative change is sqrt(Σ‖Δ‖²) / sqrt(Σ‖θ₀‖²) over the layer's tensors; the model's fraction
above the threshold is Σ count / Σ numel over all tensors (the paper's "fraction of parameters exceeding the change
threshold", App. "Parameters Drift").

Tensors are read one at a time (``safe_open``) and compared in chunks, so two Qwen3-8B checkpoints need about one
tensor pair of host memory. When the two files store a tensor in different dtypes, both are rounded to the coarser
one first, so that storage rounding (bf16 keeps 8 significant bits: up to 2⁻⁹ relative) is not counted as drift.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from report.analyses import AnalysisInputError, method_colour, pyplot, save_figure
from common.tracking import progress

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CHUNK_ELEMENTS = 1 << 24
"""Elements compared at once (64 MiB per fp32 temporary)."""
LAYER_PATTERN = re.compile(r"\.layers\.(\d+)\.")


@dataclass
class TensorDrift:
    """One tensor's change from the base model."""

    name: str
    numel: int
    base_norm: float
    """‖θ₀‖₂."""
    delta_norm: float
    """‖θ − θ₀‖₂."""
    above_threshold: int
    """Weights with |θᵢ − θ₀ᵢ| > τ·|θ₀ᵢ|."""

    @property
    def relative(self) -> float:
        """‖θ − θ₀‖ / ‖θ₀‖ (NaN for an all-zero base tensor)."""
        return self.delta_norm / self.base_norm if self.base_norm > 0 else math.nan

    @property
    def fraction_above(self) -> float:
        return self.above_threshold / self.numel if self.numel else 0.0


def tensor_files(folder: str | Path) -> dict[str, Path]:
    """Tensor name → safetensors file of an HF folder (single file or sharded with an index)."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise AnalysisInputError(f"{index}: not a safetensors index with a 'weight_map' ({exc})") from exc
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / SINGLE_FILE
    if not single.exists():
        raise AnalysisInputError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return {name: single for name in handle.keys()}


def compare_checkpoints(base_folder: str | Path, folder: str | Path, threshold: float,
                        show_progress: bool = False) -> list[TensorDrift]:
    """:class:`TensorDrift` of every tensor of ``folder`` against ``base_folder``, in the base's tensor order.

    Both must hold the same tensor names and shapes; the error names the first difference.
    """
    import torch
    from safetensors import safe_open

    base_files, files = tensor_files(base_folder), tensor_files(folder)
    if set(base_files) != set(files):
        missing = sorted(set(base_files) - set(files))
        extra = sorted(set(files) - set(base_files))
        raise AnalysisInputError(f"{folder} and base {base_folder} hold different tensors: missing {missing[:5]}, "
                                 f"extra {extra[:5]}")
    results = []
    with contextlib.ExitStack() as stack:
        handles: dict[Path, object] = {}

        def handle(path: Path):
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(str(path), framework="pt"))
            return handles[path]

        for name in progress(base_files, desc=f"drift {Path(folder).parent.name}", enabled=show_progress,
                             unit="tensor"):
            base = handle(base_files[name]).get_tensor(name)
            other = handle(files[name]).get_tensor(name)
            if base.shape != other.shape:
                raise AnalysisInputError(f"tensor {name}: shape {tuple(other.shape)} in {folder}, "
                                         f"{tuple(base.shape)} in base {base_folder}")
            if base.dtype != other.dtype and base.is_floating_point() and other.is_floating_point():
                coarser = max((base.dtype, other.dtype), key=lambda dtype: torch.finfo(dtype).eps)
                base, other = base.to(coarser), other.to(coarser)
            results.append(_tensor_drift(name, base.reshape(-1), other.reshape(-1), threshold))
    return results


def _tensor_drift(name: str, base, other, threshold: float) -> TensorDrift:
    import torch

    base_sq = delta_sq = 0.0
    above = 0
    for start in range(0, base.numel(), CHUNK_ELEMENTS):
        b = base[start:start + CHUNK_ELEMENTS].to(torch.float32)
        delta = other[start:start + CHUNK_ELEMENTS].to(torch.float32) - b
        base_sq += float(b.double().square().sum())
        delta_sq += float(delta.double().square().sum())
        above += int((delta.abs() > threshold * b.abs()).sum())
    return TensorDrift(name=name, numel=base.numel(), base_norm=math.sqrt(base_sq), delta_norm=math.sqrt(delta_sq),
                       above_threshold=above)


def layer_key(name: str) -> str:
    """``layer <i>`` for decoder-layer tensors; ``embed`` for embeddings; ``head`` for the rest (final norm, LM head)."""
    match = LAYER_PATTERN.search(name)
    if match:
        return f"layer {int(match.group(1))}"
    return "embed" if "embed" in name else "head"


def per_layer(drifts: list[TensorDrift]) -> dict[str, float]:
    """Relative change per :func:`layer_key` group, sqrt(Σ‖Δ‖²)/sqrt(Σ‖θ₀‖²), ordered embed, layer 0…, head."""
    sums: dict[str, list[float]] = {}
    for drift in drifts:
        total = sums.setdefault(layer_key(drift.name), [0.0, 0.0])
        total[0] += drift.delta_norm ** 2
        total[1] += drift.base_norm ** 2

    def order(key: str) -> tuple[int, int]:
        return (0, 0) if key == "embed" else (2, 0) if key == "head" else (1, int(key.split()[1]))

    return {key: math.sqrt(d) / math.sqrt(b) if b > 0 else math.nan
            for key, (d, b) in sorted(sums.items(), key=lambda item: order(item[0]))}


def fraction_above(drifts: list[TensorDrift]) -> float:
    """Σ weights above the threshold / Σ weights, over all tensors."""
    total = sum(d.numel for d in drifts)
    return sum(d.above_threshold for d in drifts) / total if total else 0.0


def write_drift(by_method: dict[str, list[TensorDrift]], threshold: float, json_path: Path, csv_path: Path) -> None:
    """Every tensor's numbers as CSV; per method the per-layer drift and fraction above the threshold as JSON."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    summary = {"threshold": threshold, "definition": "relative = ||theta - theta0|| / ||theta0||; above threshold: "
               "|theta_i - theta0_i| > threshold * |theta0_i|",
               "methods": {label: {"fraction_above_threshold": fraction_above(drifts),
                                   "relative_change": _total_relative(drifts), "per_layer": per_layer(drifts)}
                           for label, drifts in by_method.items()}}
    json_path.write_text(json.dumps(summary, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    with open(csv_path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["method", "tensor", "layer", "numel", "base_norm", "delta_norm", "relative",
                         "above_threshold", "fraction_above"])
        for label, drifts in by_method.items():
            for d in drifts:
                writer.writerow([label, d.name, layer_key(d.name), d.numel, f"{d.base_norm:.6g}",
                                 f"{d.delta_norm:.6g}", f"{d.relative:.6g}", d.above_threshold,
                                 f"{d.fraction_above:.6g}"])


def _total_relative(drifts: list[TensorDrift]) -> float:
    base = math.sqrt(sum(d.base_norm ** 2 for d in drifts))
    return math.sqrt(sum(d.delta_norm ** 2 for d in drifts)) / base if base > 0 else math.nan


def plot_drift(by_method: dict[str, list[TensorDrift]], threshold: float, title: str,
               layers_path: Path, fraction_path: Path) -> None:
    """Two figures, each titled by what it shows and then ``title`` (model, phase): relative change per layer (one
    line per method, log y) and the fraction above the threshold; methods in their colours
    (:func:`report.analyses.method_colour`)."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7.0, 3.6), dpi=100)
    keys: list[str] = []
    for label, drifts in by_method.items():
        layers = per_layer(drifts)
        keys = keys or list(layers)
        axes.plot(range(len(layers)), list(layers.values()), marker="o", markersize=3, label=label,
                  color=method_colour(label))
    axes.set_xticks(range(len(keys)), [k.replace("layer ", "") for k in keys],
                    rotation=90 if len(keys) > 20 else 0, fontsize=7 if len(keys) > 20 else 9)
    axes.set_xlabel("layer (embed, decoder layers, head)")
    axes.set_ylabel("‖θ − θ₀‖ / ‖θ₀‖")
    axes.set_yscale("log")
    axes.set_title(f"Parameter drift per layer · {title}", fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    save_figure(figure, layers_path)

    figure, axes = plt.subplots(figsize=(5.0, 3.6), dpi=100)
    labels = list(by_method)
    values = [100 * fraction_above(by_method[label]) for label in labels]
    bars = axes.bar(range(len(labels)), values, color=[method_colour(label) for label in labels])
    axes.bar_label(bars, fmt="%.1f", fontsize=8)
    axes.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    axes.set_ylabel(f"weights with |Δ| > {threshold:g}·|θ₀| (%)")
    axes.set_title(f"Weights changed by more than {threshold:g}·|θ₀| · {title}", fontsize=9)
    axes.grid(True, axis="y", alpha=0.3)
    save_figure(figure, fraction_path)

