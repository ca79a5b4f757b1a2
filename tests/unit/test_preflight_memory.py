"""The preflight's SFT memory estimate (``common.preflight.estimate_sft_memory``) pinned on a Qwen3-8B-shaped
config.json, and its check: a GPU too small is refused with the keys that make the run fit; no GPU, nothing refused.
The estimate against a measured step: tests/integration/test_sft_memory_estimate.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import yaml

from common import preflight
from common.config import compose
from common.preflight import MemoryEstimate

P_8B = 8_190_427_136
"""Qwen3-8B's parameters as :func:`common.preflight.model_parameters` counts them: untied 151,936 × 4,096 embeddings
and head, 36 layers of W = 192,937,984 (q/o 4,096², k/v 4,096 × 1,024, MLP 3 × 4,096 × 12,288)."""
A_8B = 43_646_976
"""Its LoRA adapter, r 16 on all seven linear layers: 36 × 16 × 75,776 (Σ in + out)."""
GIB = 2 ** 30


@pytest.fixture(scope="module")
def qwen3_8b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_8b")
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False}))
    return folder


def paper_8b(folder, *overrides: str):
    """The paper profile (bf16, activation checkpointing, chunk 1,024, frozen models in bf16, one sequence per
    micro-batch) on the Qwen3-8B shape, 4,096 tokens; plain SFT unless ``overrides`` name a method. Composed once
    per method; the other ``key=value`` overrides are set on a copy (``preflight.with_key``), as YAML values."""
    method = next((o for o in overrides if o.startswith("sft/method=")), "sft/method=sft")
    cfg = compose(["profile=paper", f"model.path={folder}", "data.max_length=4096", method])
    for key, value in (o.split("=") for o in overrides if not o.startswith("sft/method=")):
        cfg = preflight.with_key(cfg, key, yaml.safe_load(value))
    return cfg


def estimate(folder, *overrides: str) -> MemoryEstimate:
    return preflight.estimate_sft_memory(paper_8b(folder, *overrides))


def test_memory_estimate_of_the_qwen3_8b_shape_pins_every_term(qwen3_8b):
    """Full SFT on one GPU, b = f = 2, T = 4,096, C = 1,024, V·d = 622,329,856, W = 192,937,984:
    S = 16·P; U = 2·(2·V·d + 2·W) + 6·W; H = 4·6·C·V + 6·V·d; a = 4·13,312 + 2·80,896 = 215,040 per token and
    layer, X = T·(36·2·4,096 + a + 12·4,096); O = 4·P. EKSFT adds its bf16 reference (2·P, a second root and two
    layers gathered, its final hidden states 4·4,096 per token); LoRA trains A = 43,646,976 parameters beside the bf16
    base, with the reference the base itself (no second copy), the head frozen (no head gradient) and 2·16 bytes per
    token per adapted layer."""
    assert preflight.model_parameters(paper_8b(qwen3_8b)) == P_8B
    assert preflight.lora_parameters(paper_8b(qwen3_8b, "sft.lora.enabled=true")) == A_8B
    sft_full = MemoryEstimate(state=16 * P_8B, unsharded=4_418_699_264, loss_head=7_467_958_272,
                              activations=4096 * (36 * 2 * 4096 + 215_040 + 12 * 4096), optimizer_step=4 * P_8B)
    assert estimate(qwen3_8b, "profile.nproc_per_node=1") == sft_full
    assert estimate(qwen3_8b, "profile.nproc_per_node=1", "sft/method=eksft") == MemoryEstimate(
        state=18 * P_8B, unsharded=7_679_770_624, loss_head=7_467_958_272, activations=2_357_198_848,
        optimizer_step=4 * P_8B)
    lora = MemoryEstimate(state=16 * A_8B + 2 * P_8B, unsharded=3_261_071_360, loss_head=3_733_979_136,
                          activations=2_291_007_488, optimizer_step=4 * A_8B)
    assert estimate(qwen3_8b, "profile.nproc_per_node=1", "sft.lora.enabled=true") == lora
    assert sft_full.peak == 20 * P_8B and lora.peak == 26_365_263_872  # AdamW's step: 152.6 GiB; LoRA: 24.6 GiB


def test_lora_keeps_no_second_copy_for_the_reference_and_full_fine_tuning_does(qwen3_8b):
    """EKSFT's reference: with LoRA the base under disable_adapter (nothing added), in full fine-tuning a bf16 copy
    (2·P), or with ``sft.reference_cache`` its head alone (2·V·d); PSFT's old policy likewise a copy, or an adapter."""
    def state(*overrides):
        return estimate(qwen3_8b, "profile.nproc_per_node=1", *overrides).state

    assert state("sft/method=eksft", "sft.lora.enabled=true") == state("sft.lora.enabled=true")
    assert state("sft/method=eksft") - state() == 2 * P_8B
    assert state("sft/method=eksft", "sft.reference_cache=true") - state() == 2 * 151936 * 4096
    assert state("sft/method=eksft", "sft.frozen_dtype=fp32") - state("sft.frozen_dtype=fp32") == 4 * P_8B
    assert state("sft/method=psft", "sft.lora.enabled=true") - state("sft.lora.enabled=true") == 2 * A_8B
    assert state("sft/method=pear") == state()  # PEAR's paper preset reads behaviour log-probs, not the reference


def test_gpus_shard_the_state_and_not_the_activations(qwen3_8b):
    one, eight = estimate(qwen3_8b, "profile.nproc_per_node=1"), estimate(qwen3_8b, "profile.nproc_per_node=8")
    assert (eight.state, eight.optimizer_step) == (one.state // 8, one.optimizer_step // 8)
    assert (eight.unsharded, eight.loss_head, eight.activations) == (one.unsharded, one.loss_head, one.activations)
    assert estimate(qwen3_8b, "profile.nproc_per_node=4", "profile.nnodes=2") == eight


def test_activation_checkpointing_keeps_each_layer_input_instead_of_its_activations(qwen3_8b):
    """Without it every layer keeps a = 215,040 bytes per token (and one layer's gradients are in flight)."""
    off = estimate(qwen3_8b, "sft.gradient_checkpointing=false")
    assert off.activations == 4096 * (37 * 215_040 + 12 * 4096)
    assert estimate(qwen3_8b, "sft.gradient_checkpointing=false", "data.max_length=2048").activations * 2 \
        == off.activations
    assert estimate(qwen3_8b, "sft.chunk_size=256").loss_head == 4 * 6 * 256 * 151936 + 6 * 151936 * 4096


def test_selective_checkpointing_also_keeps_each_layers_matmul_and_attention_outputs(qwen3_8b):
    """Per layer and token b·(3d + 2q + 2k + 2I) = 2·(3·4096 + 2·4096 + 2·1024 + 2·12288) = 94,208 bytes (the input,
    the seven projections' outputs and the attention's) instead of the input's 8,192."""
    assert estimate(qwen3_8b).activations == 4096 * (36 * 8192 + 215_040 + 12 * 4096)
    assert estimate(qwen3_8b, "sft.gradient_checkpointing_policy=selective").activations \
        == 4096 * (36 * 94_208 + 215_040 + 12 * 4096)


def test_kept_logits_chunks_add_their_policy_and_reference_logits_up_to_the_micro_batchs_chunks(qwen3_8b):
    """``sft.kept_logits_chunks`` k: k − 1 chunks more than the default of the policy's bf16 logits C·V (and EKSFT's
    reference's), at most the micro-batch's ⌈4,096 / 1,024⌉ = 4."""
    chunk = 2 * 1024 * 151936
    for method, logits in (("sft", 1), ("eksft", 2)):
        default = estimate(qwen3_8b, f"sft/method={method}").loss_head
        assert estimate(qwen3_8b, f"sft/method={method}", "sft.kept_logits_chunks=3").loss_head \
            == default + 2 * logits * chunk
        assert estimate(qwen3_8b, f"sft/method={method}", "sft.kept_logits_chunks=64").loss_head \
            == default + 3 * logits * chunk


def test_no_estimate_without_the_models_config_json(qwen3_8b, tmp_path):
    assert preflight.estimate_sft_memory(paper_8b(qwen3_8b, f"model.path={tmp_path}")) is None


def test_every_method_schema_declares_the_reference_its_loss_keeps():
    from common.config.sft import SFT_METHOD_SCHEMAS, PEARMethod
    from sft.losses import build_loss

    for method in [schema() for schema in SFT_METHOD_SCHEMAS.values()] + [PEARMethod(behaviour="data")]:
        assert method.keeps_reference() == build_loss(method).needs_reference, method


def gpus(monkeypatch, count: int, gib: float, name: str = "NVIDIA H100 80GB HBM3") -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(total_memory=int(gib * GIB), name=name))


def test_a_gpu_too_small_is_refused_with_the_keys_that_make_the_run_fit(qwen3_8b, monkeypatch):
    gpus(monkeypatch, 1, 79.2)
    cfg = paper_8b(qwen3_8b, "profile.nproc_per_node=1", "sft/method=eksft")
    problem, = [p for p in preflight.stage_problems(cfg, "sft") if p.check == "memory"]
    assert "SFT needs about 167.8 GiB per GPU = max(state 137.3 + " in problem.message
    assert "GPU 0 (NVIDIA H100 80GB HBM3) has 79.2 GiB" in problem.message
    assert problem.fix == ("sft.lora.enabled=true (24.6 GiB); or 4 GPUs (profile.nproc_per_node x profile.nnodes; "
                           "50.6 GiB)")
    assert "\n" not in problem.message
    gpus(monkeypatch, 8, 79.2)
    assert preflight.check_memory(paper_8b(qwen3_8b, "profile.nproc_per_node=8", "sft/method=eksft")) == []


def test_a_long_sequence_is_refused_with_a_shorter_max_length(qwen3_8b, monkeypatch):
    gpus(monkeypatch, 8, 79.2)
    cfg = paper_8b(qwen3_8b, "sft.lora.enabled=true", "sft.gradient_checkpointing=false", "data.max_length=32768")
    problem, = preflight.check_memory(cfg)
    assert problem.fix.startswith("sft.gradient_checkpointing=true (")
    assert "data.max_length=8192 (" in problem.fix and "sft.lora" not in problem.fix


def test_selective_checkpointing_too_large_is_refused_with_full_checkpointing(qwen3_8b, monkeypatch):
    gpus(monkeypatch, 8, 79.2)
    cfg = paper_8b(qwen3_8b, "sft.gradient_checkpointing_policy=selective", "data.max_length=32768")
    problem, = preflight.check_memory(cfg)
    assert problem.fix.startswith("sft.gradient_checkpointing_policy=full (")


def test_kept_logits_too_large_are_refused_with_the_default(qwen3_8b, monkeypatch):
    """EKSFT on 8 GPUs at 20,480 tokens: 42.2 GiB a GPU by default, 53.3 with all 20 chunks' logits kept."""
    gpus(monkeypatch, 8, 48.0)
    cfg = paper_8b(qwen3_8b, "sft/method=eksft", "data.max_length=20480", "sft.kept_logits_chunks=20")
    problem, = preflight.check_memory(cfg)
    assert "sft.kept_logits_chunks=1 (42.2 GiB)" in problem.fix


def test_without_a_gpu_nothing_is_refused(qwen3_8b, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert preflight.check_memory(paper_8b(qwen3_8b, "profile.nproc_per_node=1")) == []
    gpus(monkeypatch, 0, 0)
    assert preflight.check_memory(paper_8b(qwen3_8b, "profile.nproc_per_node=1")) == []
    gpus(monkeypatch, 1, 1)
    assert preflight.check_memory(preflight.with_key(paper_8b(qwen3_8b), "profile.device", "cpu")) == []


def test_the_plan_prints_the_largest_pending_sft_runs_estimate(qwen3_8b):
    commands = [SimpleNamespace(stage=stage, name=name, config=paper_8b(qwen3_8b, *overrides))
                for stage, name, overrides in (("sft", "sft/qwen3_8b/sft", ["sft.lora.enabled=true"]),
                                               ("sft", "sft/qwen3_8b/eksft", ["sft/method=eksft"]),
                                               ("rl", "rl/qwen3_8b/eksft", []))]
    line = preflight.memory_line(commands)
    assert line.startswith("memory: sft/qwen3_8b/eksft needs about 33.5 GiB per GPU = max(state 17.2 + ")
    assert "common.preflight.estimate_sft_memory" in line
    assert preflight.memory_line(commands[2:]) is None


def test_the_dry_run_prints_the_memory_estimate_of_a_cached_models_sft_runs(qwen3_8b, tmp_path, monkeypatch, capsys):
    """The base model's config.json from the HF cache: the paper dry run on one GPU (20,000 tokens) names its largest
    SFT run, one that keeps a reference."""
    from pipeline.run import run, stage_overrides

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((qwen3_8b / "config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    overrides = ["experiment=table1", "profile=paper", f"experiment.run_root={tmp_path / 'runs'}", "dry_run=true",
                 "profile.models=[qwen3_8b]", "profile.nproc_per_node=1", "experiment.methods=[sft,eksft]"]
    run(compose(overrides), stage_overrides(overrides))
    assert ("memory: sft/qwen3_8b/eksft needs about 167.8 GiB per GPU = max(state 137.3 + unsharded 7.2 + loss head "
            "7.0 + activations 10.7, state + AdamW step 30.5)") in capsys.readouterr().out
