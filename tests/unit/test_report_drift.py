"""Parameter drift from two hand-made safetensors checkpoints, checked against hand-computed values."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from report.analyses import AnalysisInputError
from report.analyses.drift import compare_checkpoints, fraction_above, per_layer, write_drift


def _checkpoint(folder, tensors):
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def pair(tmp_path):
    base = _checkpoint(tmp_path / "base", {"model.embed_tokens.weight": torch.tensor([[3.0, 4.0]]),
                                           "model.layers.0.mlp.weight": torch.tensor([1.0, 2.0, -4.0, 0.0])})
    trained = _checkpoint(tmp_path / "trained", {"model.embed_tokens.weight": torch.tensor([[3.0, 4.25]]),
                                                 "model.layers.0.mlp.weight": torch.tensor([1.0, 2.5, -4.0, 0.5])})
    return base, trained


def test_relative_change_and_weights_above_threshold(pair):
    drifts = {d.name: d for d in compare_checkpoints(*pair, threshold=0.1)}
    embed, mlp = drifts["model.embed_tokens.weight"], drifts["model.layers.0.mlp.weight"]
    # embed: Δ = [0, 0.25], ‖θ₀‖ = 5 → 0.05; 0.25 > 0.1·4 is false → 0 above.
    assert (embed.relative, embed.above_threshold, embed.numel) == (pytest.approx(0.05), 0, 2)
    # mlp: Δ = [0, 0.5, 0, 0.5], ‖θ₀‖ = √21 → √0.5/√21; above: 0.5 > 0.2 and 0.5 > 0 (base 0) → 2.
    assert mlp.relative == pytest.approx(math.sqrt(0.5 / 21))
    assert mlp.above_threshold == 2
    assert fraction_above(list(drifts.values())) == pytest.approx(2 / 6)
    assert per_layer(list(drifts.values())) == {"embed": pytest.approx(0.05),
                                                "layer 0": pytest.approx(math.sqrt(0.5 / 21))}


def test_a_tighter_threshold_counts_more_weights(pair):
    drifts = compare_checkpoints(*pair, threshold=0.01)
    assert sum(d.above_threshold for d in drifts) == 3  # now 0.25 > 0.04 counts too


def test_storage_rounding_is_not_drift(tmp_path):
    value = torch.tensor([1.001, -3.0])  # bf16 keeps 8 bits: 1.001 rounds to 1.0
    base = _checkpoint(tmp_path / "base", {"w": value})
    trained = _checkpoint(tmp_path / "trained", {"w": value.to(torch.bfloat16)})
    assert compare_checkpoints(base, trained, threshold=1e-4)[0].delta_norm == 0.0


def test_sharded_checkpoint_is_read_through_its_index(tmp_path, pair):
    base, _ = pair
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    save_file({"model.embed_tokens.weight": torch.tensor([[3.0, 4.25]])}, str(sharded / "a.safetensors"))
    save_file({"model.layers.0.mlp.weight": torch.tensor([1.0, 2.0, -4.0, 0.0])}, str(sharded / "b.safetensors"))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "a.safetensors", "model.layers.0.mlp.weight": "b.safetensors"}}))
    drifts = {d.name: d.relative for d in compare_checkpoints(base, sharded, threshold=0.1)}
    assert drifts == {"model.embed_tokens.weight": pytest.approx(0.05), "model.layers.0.mlp.weight": 0.0}


def test_mismatched_checkpoints_name_the_tensor(tmp_path, pair):
    base, _ = pair
    other = _checkpoint(tmp_path / "other", {"model.embed_tokens.weight": torch.zeros(1, 3),
                                             "model.layers.0.mlp.weight": torch.zeros(4)})
    with pytest.raises(AnalysisInputError, match=r"tensor model.embed_tokens.weight: shape \(1, 3\)"):
        compare_checkpoints(base, other, threshold=0.1)
    fewer = _checkpoint(tmp_path / "fewer", {"model.embed_tokens.weight": torch.zeros(1, 2)})
    with pytest.raises(AnalysisInputError, match="missing \\['model.layers.0.mlp.weight'\\]"):
        compare_checkpoints(base, fewer, threshold=0.1)
    with pytest.raises(AnalysisInputError, match="no model.safetensors"):
        compare_checkpoints(base, tmp_path, threshold=0.1)


def test_written_numbers(tmp_path, pair):
    drifts = compare_checkpoints(*pair, threshold=0.1)
    write_drift({"SFT": drifts}, 0.1, tmp_path / "d.json", tmp_path / "d.csv")
    summary = json.loads((tmp_path / "d.json").read_text())["methods"]["SFT"]
    # Whole model: √(0.0625 + 0.5) / √(25 + 21).
    assert summary["relative_change"] == pytest.approx(math.sqrt(0.5625 / 46))
    assert summary["fraction_above_threshold"] == pytest.approx(1 / 3)
    rows = (tmp_path / "d.csv").read_text().splitlines()
    assert rows[1] == "SFT,model.embed_tokens.weight,embed,2,5,0.25,0.05,0,0"
