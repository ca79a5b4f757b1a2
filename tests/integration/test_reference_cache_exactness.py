"""``sft.reference_cache`` on the tiny random Qwen3 (CPU, gloo FSDP2): the cached reference gives the live
reference's losses and gradients for every loss that needs a reference, bitwise with one sequence per micro-batch;
the cache is built once and reused; a 2-rank run with the cache matches a 1-rank run with the live reference."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from common.config import compose
from common.config.sft import SFT_METHOD_SCHEMAS
from common.manifest import read_manifest
from common.paths import TRAINING_METRICS_FILE, sft_dir
from common.tracking import read_metrics
from sft import train
from sft.data import DataOrder, collate, read_sft_tokens
from sft.losses import build_loss
from sft.policy import autocast_context
from sft_helpers import build_tiny_model, one_rank, prepare_run, run_torchrun  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

REFERENCE_METHODS = sorted("pear_base_ref" if name == "pear" else name for name, schema in SFT_METHOD_SCHEMAS.items()
                           if build_loss(schema()).needs_reference)
"""The ``sft/method`` presets whose loss reads the reference: the ``pear`` preset reads the data's behaviour column
instead, its base-model variant (the schema's default) is the preset ``pear_base_ref``."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"))


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def losses_and_grads(cfg, model_dir, env, micro_batches, cache, zero_reference=False):
    """Each micro-batch's loss and the policy's gradients after their backward, from a fresh root whose policy
    is moved away from the reference (every weight x 1.1, with LoRA every adapter weight + 0.05, so the reference
    terms are not 0)."""
    torch.manual_seed(0)  # the same LoRA initialisation in every root
    root, _ = train.build_root(cfg, str(model_dir), env, cached_reference=cache is not None)
    with torch.no_grad():
        for param in root.policy.parameters():
            if cfg.sft.lora.enabled:
                param.add_(0.05 if param.requires_grad else 0.0)
            else:
                param.mul_(1.1)
    root.train()
    losses = []
    for indices, batch in micro_batches:
        if cache is not None:
            ref_hidden = cache.batch(indices, batch["input_ids"].shape[1])
            batch = {**batch, "ref_hidden": torch.zeros_like(ref_hidden) if zero_reference else ref_hidden}
        with autocast_context(env, cfg.sft.mixed_precision):
            result = root(**batch)
        result.loss.backward()
        losses.append(result.loss.detach())
    grads = {name: full(p.grad) for name, p in root.policy.named_parameters() if p.requires_grad}
    return losses, grads


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ over the whole tensor. Element-wise tolerances fail on bf16 noise in the
    near-zero gradients of rarely seen embedding rows (relative error > 1 where |g| ~ 1e-6)."""
    return float(torch.linalg.vector_norm(actual - expected) / torch.linalg.vector_norm(expected))


@pytest.mark.parametrize("micro_batch_size", [1, 2], ids=["one_sequence", "padded"])
@pytest.mark.parametrize("method", REFERENCE_METHODS)
def test_cached_reference_gives_the_live_losses_and_gradients(tmp_path, model_dir, one_rank, method, micro_batch_size):
    cfg, _ = prepare_run(tmp_path, model_dir, num_rows=6, method=method, micro_batch_size=micro_batch_size,
                         mixed_precision="bf16", reference_cache=True)
    tokens_path = train.sft_tokens_path(cfg)
    rows = read_sft_tokens(tokens_path)
    cache = train.prepare_reference_cache(cfg, str(model_dir), tokens_path, rows, one_rank, announce=lambda m: None)
    assert cache is not None and cache.dtype == torch.bfloat16
    order = DataOrder([len(r.input_ids) for r in rows], micro_batch_size=micro_batch_size, grad_accum=2,
                      world_size=1, order_seed=0)
    micro_batches = [(mb, collate([rows[i] for i in mb], pad_token_id=0)) for mb in order.rank_micro_batches(0, 0)]
    assert any(batch["attention_mask"] is not None for _, batch in micro_batches) == (micro_batch_size > 1)

    live_losses, live_grads = losses_and_grads(cfg, model_dir, one_rank, micro_batches, cache=None)
    cached_losses, cached_grads = losses_and_grads(cfg, model_dir, one_rank, micro_batches, cache=cache)

    blind_losses, blind_grads = losses_and_grads(cfg, model_dir, one_rank, micro_batches, cache=cache,
                                                 zero_reference=True)
    assert not all(torch.equal(a, b) for a, b in zip(blind_losses, live_losses))  # the reference matters here
    if micro_batch_size == 1:  # same forward, same kernels, lossless storage: bitwise
        assert all(torch.equal(a, b) for a, b in zip(cached_losses, live_losses)), (cached_losses, live_losses)
        for name, grad in live_grads.items():
            assert torch.equal(cached_grads[name], grad), name
    else:  # the live reference ran a padded batch: last-bit differences of bf16 hidden states at most
        torch.testing.assert_close(torch.stack(cached_losses), torch.stack(live_losses), rtol=1e-3, atol=1e-4)
        errors = {name: relative_error(cached_grads[name], grad) for name, grad in live_grads.items()}
        assert max(errors.values()) < 1e-2, errors
        assert max(relative_error(blind_grads[name], grad) for name, grad in live_grads.items()) > 1e-2


def test_with_lora_the_base_models_cache_is_the_reference_bitwise(tmp_path, model_dir, one_rank):
    """The LoRA reference is the base with its adapters disabled: the cache built for full fine-tuning (same
    folder) gives its losses and gradients bitwise."""
    lora = {"lora.enabled": "true", "lora.rank": 4}
    cfg, _ = prepare_run(tmp_path, model_dir, num_rows=4, method="eksft", mixed_precision="bf16",
                         reference_cache=True, **lora)
    tokens_path = train.sft_tokens_path(cfg)
    rows = read_sft_tokens(tokens_path)
    cache = train.prepare_reference_cache(cfg, str(model_dir), tokens_path, rows, one_rank, announce=lambda m: None)
    full_cfg, _ = prepare_run(tmp_path / "full", model_dir, num_rows=4, method="eksft", mixed_precision="bf16",
                              reference_cache=True)
    full_cfg.experiment.run_root = cfg.experiment.run_root
    full_cache = train.prepare_reference_cache(full_cfg, str(model_dir), tokens_path, rows, one_rank, print)
    assert full_cache.folder == cache.folder
    order = DataOrder([len(r.input_ids) for r in rows], micro_batch_size=1, grad_accum=2, world_size=1, order_seed=0)
    micro_batches = [(mb, collate([rows[i] for i in mb], pad_token_id=0)) for mb in order.rank_micro_batches(0, 0)]
    live_losses, live_grads = losses_and_grads(cfg, model_dir, one_rank, micro_batches, cache=None)
    cached_losses, cached_grads = losses_and_grads(cfg, model_dir, one_rank, micro_batches, cache=cache)
    assert all(torch.equal(a, b) for a, b in zip(cached_losses, live_losses)), (cached_losses, live_losses)
    assert live_grads.keys() == cached_grads.keys() and all(".lora_" in name for name in live_grads)
    for name, grad in live_grads.items():
        assert torch.equal(cached_grads[name], grad), name


def test_cache_is_built_once_and_shared_by_methods(tmp_path, model_dir, one_rank, monkeypatch):
    cfg, _ = prepare_run(tmp_path, model_dir, num_rows=4, method="eksft", mixed_precision="bf16",
                         reference_cache=True)
    tokens_path = train.sft_tokens_path(cfg)
    rows = read_sft_tokens(tokens_path)
    first = train.prepare_reference_cache(cfg, str(model_dir), tokens_path, rows, one_rank, announce=lambda m: None)
    manifest = read_manifest(first.folder)
    assert manifest.complete and manifest.details["tokens"] == sum(len(r.input_ids) for r in rows)
    assert manifest.details["bytes_per_token"] == 128 * 2  # hidden 128, bf16

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the complete cache was rebuilt")

    monkeypatch.setattr(train, "build_reference_cache", no_rebuild)
    asft_cfg, _ = prepare_run(tmp_path / "asft", model_dir, num_rows=4, method="asft", mixed_precision="bf16",
                              reference_cache=True)
    asft_cfg.experiment.run_root = cfg.experiment.run_root  # same base model and split: same cache
    again = train.prepare_reference_cache(asft_cfg, str(model_dir), tokens_path, rows, one_rank,
                                          announce=lambda m: None)
    assert again.folder == first.folder
    sft_cfg, _ = prepare_run(tmp_path / "sft", model_dir, num_rows=4, method="sft", reference_cache=True)
    assert train.prepare_reference_cache(sft_cfg, str(model_dir), tokens_path, rows, one_rank, print) is None


def test_two_ranks_with_the_cache_match_one_rank_with_the_live_reference(tmp_path, model_dir):
    """fp32, one sequence per micro-batch; the same global batch on 1 rank x 2 micro-batches and 2 ranks x 1."""
    run_args = dict(method="eksft", micro_batch_size=1, max_steps=3, mixed_precision="fp32")
    live_cfg, _ = prepare_run(tmp_path / "live", model_dir, num_rows=8, grad_accum=2, **run_args)
    assert train.run(live_cfg).complete
    cached_cfg, overrides = prepare_run(tmp_path / "cached", model_dir, num_rows=8, grad_accum=1,
                                        reference_cache=True, **run_args)
    overrides = [*overrides, "profile.nproc_per_node=2"]
    result = run_torchrun(overrides, nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cached_cfg = compose(overrides)
    assert "reference hidden states from" in result.stdout
    live = read_metrics(sft_dir(live_cfg) / TRAINING_METRICS_FILE)
    cached = read_metrics(sft_dir(cached_cfg) / TRAINING_METRICS_FILE)
    assert [r["loss"] for r in cached] == pytest.approx([r["loss"] for r in live], abs=1e-5)
    assert [r["stats/kl_reg"] for r in cached] == pytest.approx([r["stats/kl_reg"] for r in live], abs=1e-6)
    assert all("time/reference_cache_read_s" in r for r in cached)
