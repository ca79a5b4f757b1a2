"""The trainer's speed and memory options against the eager trainer they replace (CPU, tiny shapes): the compiled
statistics pass (``sft.compile_statistics``) and the online one (``sft.online_statistics``), the compiled gradient
pass (``sft.compile_pass_b``), pass A's logits kept for pass B (``sft.kept_logits_chunks``), fused AdamW
(``sft.adam_implementation``), frozen models stored in bf16 (``sft.frozen_dtype``), released trainers, and where
compiled decoder layers go (``sft.compile_layers``; their numbers: tests/e2e, a minute's compile on 2 cores)."""
from __future__ import annotations

import argparse
import gc
import weakref

import pytest
import torch

from bench.sft_step_time import (build_trainer, parse_args, random_micro_batches, release,
                                 static_bytes_per_parameter)
from bench.tiny_model import random_qwen3
from common.config.sft import SFT_METHOD_SCHEMAS, EKSFTMethod, SFTMethod
from sft.distributed import close_distributed, init_distributed
from sft.losses import build_loss
from sft.policy import compile_decoder_layers
from sft.token_stats import chunked_loss
from sft.trainer import train_step
from sft_helpers import step_zero_kl

pytestmark = pytest.mark.integration

LABELS = torch.tensor([[-100, -100, 4, 7, 1, 9, 2, 3], [-100, 5, 6, 0, 8, -100, -100, -100]])
"""14 prediction rows with prompt masks and right padding (chunk 5: the last chunk is padded when compiled)."""
VOCAB, HIDDEN = 13, 6
METHOD_CONFIGS = [schema() for schema in SFT_METHOD_SCHEMAS.values()] + [
    EKSFTMethod(compat="official_code"), EKSFTMethod(compat="official_code", stats_dtype="fp32")]
STATISTICS_CONFIGS = list({(build_loss(cfg).stats, repr(build_loss(cfg).term_options)): cfg
                           for cfg in METHOD_CONFIGS if build_loss(cfg).stats}.values())
"""One method config per distinct (statistics, term options) of the registry: each compiles its own pass."""


def head_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 8, HIDDEN, generator=generator)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator)
    return {"hidden": hidden, "weight": weight,
            "ref_hidden": hidden + 0.5 * torch.randn(2, 8, HIDDEN, generator=generator),
            "ref_weight": weight + 0.2 * torch.randn(VOCAB, HIDDEN, generator=generator),
            "old_hidden": hidden + 0.2 * torch.randn(2, 8, HIDDEN, generator=generator)}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-12)).item()


@pytest.fixture(autouse=True)
def fresh_dynamo_cache():
    torch._dynamo.reset()  # each config compiles its own kernels, never the recompile limit's eager fallback
    yield


def test_compiled_statistics_pass_equals_the_eager_pass_for_eksft():
    """The paper's EKSFT here; every other loss's statistics in tests/e2e/test_sft_compile.py (each set compiles for
    5-30 s on 2 cores)."""
    check_compiled_head(EKSFTMethod(), compile_statistics=True)


def test_compiled_online_statistics_pass_equals_the_eager_pass_for_eksft():
    """``sft.online_statistics`` under ``sft.compile_statistics``: the online log-sum-exp pass, compiled."""
    check_compiled_head(EKSFTMethod(), compile_statistics=True, online_statistics=True)


def test_compiled_pass_b_equals_the_eager_pass_b_for_eksft():
    """``sft.compile_pass_b``: EKSFT's objective and closed-form gradient per chunk, compiled; every other loss in
    tests/e2e/test_sft_compile.py."""
    check_compiled_head(EKSFTMethod(), compile_pass_b=True)


def test_every_chunk_kept_from_the_compiled_padded_pass_a_equals_the_eager_head():
    """``sft.kept_logits_chunks`` with both passes compiled: pass B takes the logits of all three chunks from pass A,
    the last one's product padded to the compiled shape (5 rows, 4 of them real)."""
    check_compiled_head(EKSFTMethod(), compile_statistics=True, online_statistics=True, compile_pass_b=True,
                        kept_logits_chunks=3)


def test_compiled_pass_b_compiles_no_new_graph_for_new_masked_row_counts():
    """The reference rows' count differs from chunk to chunk; once it has taken two values above 1 Dynamo has made it
    symbolic, so a new count compiles nothing (no compile per count, no eager fallback at the recompile limit).
    14 rows at chunk 7: the first chunk's masked rows are 1, 4 and 7 at rho 0.1, 0.3 and 0.6, then 6 and 3."""
    inputs = head_inputs()

    def graphs_after(rho: float) -> int:
        h = inputs["hidden"].clone().requires_grad_()
        chunked_loss(build_loss(EKSFTMethod(rho=rho)), h, inputs["weight"], LABELS, chunk_size=7, compile_pass_b=True,
                     ref_hidden=inputs["ref_hidden"], ref_head_weight=inputs["ref_weight"]).loss.backward()
        return torch._dynamo.utils.counters["stats"]["unique_graphs"]

    for rho in (0.1, 0.3, 0.6):
        warm = graphs_after(rho)
    assert graphs_after(0.45) == graphs_after(0.2) == warm
    assert not torch._dynamo.utils.counters["recompile_limit"]


def check_compiled_head(cfg, **options) -> None:
    """Loss, metrics and both gradients of the chunked head with ``options`` (``chunked_loss``'s
    ``compile_statistics``, ``online_statistics``, ``compile_pass_b``, ``kept_logits_chunks``) equal the eager
    default head's (fp32, 1e-6); chunk 5 of 14 prediction rows pads the last chunk to the compiled shape."""
    inputs = head_inputs()
    loss = build_loss(cfg)
    results = {}
    for compiled in (False, True):
        h, w = inputs["hidden"].clone().requires_grad_(), inputs["weight"].clone().requires_grad_()
        frozen = {}
        if loss.needs_reference:
            frozen = {"ref_hidden": inputs["ref_hidden"], "ref_head_weight": inputs["ref_weight"]}
        if loss.needs_old_policy:
            frozen = {"old_hidden": inputs["old_hidden"], "old_head_weight": inputs["weight"]}
        result = chunked_loss(loss, h, w, LABELS, chunk_size=5, **(options if compiled else {}), **frozen)
        result.loss.backward()
        results[compiled] = (result, h.grad, w.grad)
    (eager, eager_h, eager_w), (fused, fused_h, fused_w) = results[False], results[True]
    assert relative_error(fused.loss.detach(), eager.loss.detach()) < 1e-6
    assert relative_error(fused_h, eager_h) < 1e-6
    assert relative_error(fused_w, eager_w) < 1e-6
    assert eager.metrics.keys() == fused.metrics.keys()
    for name, value in eager.metrics.items():
        assert relative_error(fused.metrics[name], value) < 1e-6, name


def tiny_args(**options) -> argparse.Namespace:
    flags = ["--frozen-dtype", options.get("frozen_dtype", "fp32"), "--mixed-precision", "fp32", "--seq-len", "16",
             "--micro-batch-size", "2", "--grad-accum", "1", "--chunk-size", "8",
             "--adam-implementation", options.get("adam_implementation", "default"),
             "--kept-logits-chunks", str(options.get("kept_logits_chunks", 1))]
    return parse_args(flags + (["--compile-layers"] if options.get("compile_layers") else []))


def test_fused_adamw_steps_the_sharded_policy_as_the_default_adamw():
    """``sft.adam_implementation=fused`` on FSDP2's DTensor parameters (one gloo rank): three SFT steps make the
    default AdamW's update to fp32 round-off, and the optimiser is the fused one. (SFT: EKSFT's top-ρ masks can
    flip on a round-off difference after the first step, and then the updates differ by design.)"""
    env = init_distributed("cpu")
    try:
        updates = {}
        for implementation in ("default", "fused"):
            args = tiny_args(adam_implementation=implementation)
            root, optimizer, sft = build_trainer(SFTMethod(), args, env)
            assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)
            before = [param.full_tensor().clone() for param in root.policy.parameters()]
            batches = random_micro_batches(args, root.policy.config.vocab_size, env.device)
            for _ in range(3):
                train_step(root, optimizer, batches, sft=sft, env=env)
            updates[implementation] = torch.cat([(param.full_tensor() - start).flatten()
                                                 for param, start in zip(root.policy.parameters(), before)])
            release(env)
            del root, optimizer
        default, fused = updates["default"], updates["fused"]
        assert default.abs().max() > 1e-6  # the steps moved the weights
        assert ((fused - default).norm() / default.norm()).item() < 1e-4
    finally:
        close_distributed(env)


def test_an_eksft_trainer_keeping_every_chunks_logits_steps_as_the_default_one():
    """``sft.kept_logits_chunks`` reaches the trainer's head through ``sft.train.root_from_base``: one EKSFT step
    (2 × 16 tokens at chunk 8: at most 4 chunks a micro-batch, all kept) gives the default trainer's loss and update to
    fp32 round-off."""
    env = init_distributed("cpu")
    try:
        runs = {}
        for kept in (1, 4):
            args = tiny_args(kept_logits_chunks=kept)
            root, optimizer, sft = build_trainer(EKSFTMethod(), args, env)
            assert root.kept_logits_chunks == kept and sft.kept_logits_chunks == kept
            before = [param.full_tensor().clone() for param in root.policy.parameters()]
            result = train_step(root, optimizer, random_micro_batches(args, root.policy.config.vocab_size, env.device),
                                sft=sft, env=env)
            update = torch.cat([(param.full_tensor() - start).flatten()
                                for param, start in zip(root.policy.parameters(), before)])
            runs[kept] = (result.loss, update)
            release(env)
            del root, optimizer
        (default_loss, default_update), (kept_loss, kept_update) = runs[1], runs[4]
        assert default_update.abs().max() > 1e-6
        assert abs(kept_loss - default_loss) <= 1e-6 * abs(default_loss)
        assert ((kept_update - default_update).norm() / default_update.norm()).item() < 1e-4
    finally:
        close_distributed(env)


def test_an_eksft_trainer_with_a_bf16_reference_holds_14_bytes_per_parameter():
    """fp32 policy (4) + AdamW moments (8) + the frozen reference (4 in fp32, 2 in bf16), per parameter."""
    env = init_distributed("cpu")
    try:
        assert static_bytes_per_parameter(tiny_args(frozen_dtype="fp32"), env) == pytest.approx(16.0)
        assert static_bytes_per_parameter(tiny_args(frozen_dtype="bf16"), env) == pytest.approx(14.0)
    finally:
        close_distributed(env)


def test_a_bf16_reference_is_not_the_fp32_policy_at_step_0_on_a_cpu():
    """``sft.frozen_dtype=bf16`` changes no number on a GPU, where FSDP2 computes the policy from bf16 casts of its
    weights too; on a CPU the fp32 policy computes with weights the bf16 reference does not hold, so EKSFT's KL at
    step 0 is rounding and its KL mask picks tokens by it. An fp32 reference gives exactly 0 and an empty KL mask."""
    env = init_distributed("cpu")
    try:
        kl = {dtype: step_zero_kl(tiny_args(frozen_dtype=dtype), env) for dtype in ("fp32", "bf16")}
        assert kl["fp32"] == (0.0, 0.0)
        assert 0 < kl["bf16"][0] < 1e-3 and kl["bf16"][1] > 0
    finally:
        close_distributed(env)


def test_a_released_trainer_is_freed_before_the_next_is_built():
    """An FSDP2 root sits in reference cycles: after ``del`` its reference model lives until ``release`` collects it
    (the GPU smoke's second trainer used to add to the first's memory)."""
    env = init_distributed("cpu")
    try:
        gc.disable()  # collections only where the test calls them
        root, optimizer, sft = build_trainer(EKSFTMethod(), tiny_args(), env)
        reference = weakref.ref(root.reference)
        del root, optimizer, sft
        assert reference() is not None  # the cycle keeps it
        release(env)
        assert reference() is None
    finally:
        gc.enable()
        close_distributed(env)


def test_compile_decoder_layers_compiles_each_layer_forward_in_place():
    model = random_qwen3(vocab_size=64, hidden_size=64, num_layers=2, seed=0)
    names = [name for name, _ in model.named_parameters()]
    compile_decoder_layers(model)
    assert [name for name, _ in model.named_parameters()] == names
    assert all(hasattr(layer.forward, "_torchdynamo_orig_callable") or "compile" in repr(layer.forward).lower()
               for layer in model.get_decoder().layers)


def test_the_sft_config_keys_are_validated_and_join_the_identity_only_when_set():
    from common.config import ConfigError, compose
    from common.config.common import computation_config

    default = compose([])
    assert {"compile_layers", "compile_statistics", "online_statistics", "compile_pass_b", "adam_implementation",
            "frozen_dtype"}.isdisjoint(computation_config(default.sft))
    changed = compose(["sft.frozen_dtype=bf16", "sft.compile_statistics=true", "sft.online_statistics=true",
                       "sft.compile_pass_b=true", "sft.adam_implementation=fused"])
    assert computation_config(changed.sft)["frozen_dtype"] == "bf16"
    assert computation_config(changed.sft)["compile_statistics"] is True
    assert computation_config(changed.sft)["online_statistics"] is True
    assert computation_config(changed.sft)["compile_pass_b"] is True
    assert computation_config(changed.sft)["adam_implementation"] == "fused"
    with pytest.raises(ConfigError, match="sft.frozen_dtype"):
        compose(["sft.frozen_dtype=fp16"])
    with pytest.raises(ConfigError, match="sft.adam_implementation"):
        compose(["sft.adam_implementation=apex"])


@pytest.mark.parametrize("online", [True, False], ids=["online", "row_terms"])
def test_the_compiled_passes_keep_small_kls_to_their_last_digits(online):
    """KLs of 1e-12 to 2e-3 (bf16 logits, a reference 1e-3 and 0.05 away) within 1e-4 of themselves, compiled: the
    top-ρ ranking of early training reads them. Inductor's CPU ``expm1`` is ``exp − 1``, which left the compiled
    ``expm1(y) − y`` with no correct digit below ``|y|`` ~ 1e-3 (KL errors of 1e-10 at KLs of 1e-12)."""
    from sft.token_stats import compiled_chunk_statistics, compiled_online_chunk_statistics, row_terms

    statistics = compiled_online_chunk_statistics() if online else compiled_chunk_statistics()
    generator = torch.Generator().manual_seed(0)
    logits = (5.0 * torch.randn(16, 40_000, generator=generator)).bfloat16()
    targets = torch.randint(0, 40_000, (16,), generator=generator)
    for scale in (1e-3, 0.05):
        ref = (logits.float() + scale * torch.randn(logits.shape, generator=generator)).bfloat16()
        exact = row_terms(logits.double(), targets, ("kl",), ref_logits=ref.double())["kl"]
        kl = statistics(logits, targets, ("kl",), torch.float32, ref_logits=ref)["kl"]
        assert ((kl.double() - exact).abs() / exact).max() < 1e-4, scale
