"""LoRA in the FSDP2 trainer (``sft.lora``, ``sft/lora.py``) on 2 gloo ranks with the tiny random Qwen3.

In one torchrun launch of this module as its worker: the reference (the policy's base with every adapter disabled,
inside the root forward) equals a plain ``from_pretrained`` base bitwise, before and after training; the frozen
weights are unchanged after 3 optimiser steps; the optimiser holds the float32 adapter only; EKSFT-LoRA's loss equals
the dense ``compute_token_loss`` with the base as reference; PSFT's old adapter is a copy of the trained one at a
refresh; a DCP checkpoint restores each rank's adapter and optimiser shards bitwise (accelerate #4206's failure was a
resume that kept only rank 0's adapter slice). Through ``sft.train`` (a 2-rank run; killed with SIGKILL and resumed,
and verl's checks of its keys, in tests/e2e/test_sft_lora_launches.py): the merged export loads in transformers and
gives the logits of the base with the saved adapter.

``torchrun --nproc_per_node=2 tests/integration/test_sft_lora.py MODEL OUT`` runs the worker.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from common.config import compose
from common.manifest import read_manifest
from common.paths import hf_export_dir, lora_adapter_dir, sft_dir
from sft.losses import TOKEN_LOSSES
from sft_helpers import (
    REPO_ROOT,
    build_tiny_model,
    child_env,
    one_rank,  # noqa: F401 (a fixture)
    prepare_run,
    run_in_session,
    run_torchrun,
    tiny_overrides,
)

pytestmark = pytest.mark.integration

LORA = {"lora.enabled": "true", "lora.rank": 4, "lora.alpha": 8, "lora.target_modules": "[q_proj,v_proj,up_proj]"}
"""Adapters on three of the seven linear layers of a decoder layer."""
PROBE_IDS = [[5, 17, 42, 3, 99, 7, 64, 12, 31, 8, 77, 150], [9, 4, 200, 18, 66, 2, 13, 95, 120, 45, 6, 30]]
PROMPT_TOKENS = 4
STEPS = 3
NUM_ROWS = 8
TRAIN = dict(micro_batch_size=2, grad_accum=1, epochs=2, checkpoint_every=1, **LORA)
"""2 ranks x 1 micro-batch of 2: 2 steps per epoch, 4 steps, a checkpoint after each."""


def probe_batch() -> dict[str, torch.Tensor | None]:
    input_ids = torch.tensor(PROBE_IDS)
    labels = input_ids.clone()
    labels[:, :PROMPT_TOKENS] = -100
    return {"input_ids": input_ids, "attention_mask": None, "labels": labels}


def worker(model_dir: str, out_dir: str) -> None:
    """Every rank: the checks above on its own shards; rank 0 saves what needs the gathered model."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM

    from common.config import compose
    from sft.checkpoint import Checkpointer, TrainerState
    from sft.distributed import close_distributed, init_distributed
    from sft.losses import compute_token_loss
    from sft.optim import build_optimizer, build_scheduler
    from sft.policy import final_hidden_states, refresh_old_policy
    from sft.train import build_root
    from sft.trainer import train_step

    env = init_distributed("cpu")
    out = Path(out_dir)
    batch = probe_batch()
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        base_hidden = final_hidden_states(base, batch["input_ids"], None)
        base_logits = base(input_ids=batch["input_ids"], use_cache=False).logits
    record: dict = {}

    cfg = compose(tiny_overrides(out / "runs", Path(model_dir), "eksft", **LORA))
    root, _ = build_root(cfg, model_dir, env)
    optimizer = build_optimizer(root, cfg.sft)
    scheduler = build_scheduler(optimizer, cfg.sft, total_steps=STEPS + 1)
    named = {id(p): name for name, p in root.policy.named_parameters()}
    record["optimised"] = sorted((named[id(p)], str(p.dtype)) for group in optimizer.param_groups
                                 for p in group["params"])
    record["trainable"] = sorted((name, str(p.dtype)) for name, p in root.policy.named_parameters() if p.requires_grad)

    def reference_hidden() -> torch.Tensor:  # the root forward's own pass: the reference's hidden states it uses
        return root(**batch, statistics_only=True).ref_hidden

    record["reference_equals_base_before"] = torch.equal(reference_hidden(), base_hidden)
    loss = root(**batch).loss
    with torch.no_grad():
        policy_logits = root(input_ids=batch["input_ids"])
    root.reshard()
    dense, _ = compute_token_loss(cfg.sft.method, policy_logits, batch["labels"], ref_logits=base_logits)
    record["loss"], record["dense_loss"] = loss.item(), dense.item()

    gather = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for _ in range(STEPS):
        train_step(root, optimizer, [dict(batch)], sft=cfg.sft, env=env)
        scheduler.step()
    record["reference_equals_base_after"] = torch.equal(reference_hidden(), base_hidden)
    trained = get_model_state_dict(root.policy, options=gather)

    checkpointer = Checkpointer(out / "checkpointed", keep=2, env=env)
    state = TrainerState(global_step=STEPS, total_steps=STEPS + 1, epoch=0, index_in_epoch=0,
                         world_size=env.world_size)
    path = checkpointer.save(state, root, optimizer, scheduler)
    saved = local_training_state(root, optimizer)
    train_step(root, optimizer, [dict(batch)], sft=cfg.sft, env=env)  # moves every adapter shard and moment
    moved = local_training_state(root, optimizer)
    checkpointer.load(path, root, optimizer, scheduler, total_steps=STEPS + 1)
    restored = local_training_state(root, optimizer)
    record["restored_bitwise"] = all(torch.equal(saved[k], restored[k]) for k in saved) and saved.keys() == \
        restored.keys()
    record["moved_after_save"] = sum(not torch.equal(saved[k], moved[k]) for k in saved)
    record["local_tensors"] = len(saved)
    record["checkpoint_keys"] = sorted(FileSystemReader(str(path)).read_metadata().state_dict_metadata)

    psft = compose(tiny_overrides(out / "runs", Path(model_dir), "psft", **LORA))
    psft_root, _ = build_root(psft, model_dir, env)
    psft_optimizer = build_optimizer(psft_root, psft.sft)
    with torch.no_grad():
        psft_root(input_ids=batch["input_ids"])  # FSDP2 initialises from the root's first forward
    refresh_old_policy(psft_root)
    old_equals_policy = []
    for _ in range(2):
        psft_root.unshard()
        with torch.no_grad():
            old_hidden = psft_root.frozen_states(batch["input_ids"], None, None)["old_hidden"]
            policy_hidden = final_hidden_states(psft_root.policy, batch["input_ids"], None)
        psft_root.reshard()
        old_equals_policy.append(torch.equal(old_hidden, policy_hidden))
        train_step(psft_root, psft_optimizer, [dict(batch)], sft=psft.sft, env=env)
    record["old_equals_policy_at_refresh_then_after_a_step"] = old_equals_policy
    record["psft_optimised"] = sum(len(group["params"]) for group in psft_optimizer.param_groups)
    if env.is_main:
        torch.save({"trained": trained, "base": base.state_dict()}, out / "gathered.pt")
    torch.save(record, out / f"rank{env.rank}.pt")
    close_distributed(env)


def local_training_state(root, optimizer) -> dict[str, torch.Tensor]:
    """This rank's shards of every adapter tensor and of their AdamW moments, cloned."""
    state = {f"param/{name}": p.to_local().detach().clone() for name, p in root.policy.named_parameters()
             if ".lora_" in name}
    named = {id(p): name for name, p in root.policy.named_parameters()}
    for param, moments in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            state[f"{key}/{named[id(param)]}"] = moments[key].to_local().clone()
    return state


@pytest.fixture(scope="module")
def lora_world(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    model_dir = build_tiny_model(out / "model")
    command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2", __file__,
               str(model_dir), str(out)]
    result = run_in_session(command, timeout=300, env={**child_env(), "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stdout[-4000:]
    return out, [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


def test_the_reference_is_the_plain_base_bitwise_before_and_after_training(lora_world):
    _, ranks = lora_world
    for record in ranks:
        assert record["reference_equals_base_before"] and record["reference_equals_base_after"]


def test_only_the_float32_adapter_is_optimised_and_the_frozen_weights_never_change(lora_world):
    out, ranks = lora_world
    for record in ranks:
        assert record["optimised"] == record["trainable"]
        assert {dtype for _, dtype in record["optimised"]} == {"torch.float32"}
        assert all(".lora_" in name and ".default." in name for name, _ in record["optimised"])
        assert len(record["optimised"]) == 2 * 3 * 2  # A and B, 3 targets, 2 layers
        assert record["psft_optimised"] == len(record["optimised"])  # the old adapter is frozen
    gathered = torch.load(out / "gathered.pt", weights_only=False)
    base, trained = gathered["base"], gathered["trained"]
    frozen = {name.removeprefix("base_model.model.").replace(".base_layer.", "."): tensor
              for name, tensor in trained.items() if ".lora_" not in name}
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[name], base[name]) for name in base)
    assert all(trained[name].abs().sum() > 0 for name in trained if ".lora_B." in name)  # B starts at 0, trained


def test_eksft_lora_loss_equals_the_dense_loss_with_the_base_as_reference(lora_world):
    _, ranks = lora_world
    for record in ranks:
        assert record["loss"] == pytest.approx(record["dense_loss"], rel=1e-5, abs=1e-6)


def test_psft_old_adapter_is_the_trained_one_at_a_refresh_and_lags_after_a_step(lora_world):
    _, ranks = lora_world
    for record in ranks:
        assert record["old_equals_policy_at_refresh_then_after_a_step"] == [True, False]


def test_a_checkpoint_restores_every_ranks_adapter_and_optimiser_shards_bitwise(lora_world):
    _, ranks = lora_world
    for record in ranks:
        assert record["local_tensors"] == 3 * 12  # 12 adapter tensors, each with two moments
        assert record["moved_after_save"] == record["local_tensors"]
        assert record["restored_bitwise"]
        policy_keys = [key for key in record["checkpoint_keys"] if key.startswith("policy.")]
        assert len(policy_keys) == 12 and all(".lora_" in key for key in policy_keys)  # never the frozen base


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """The config of an EKSFT-LoRA run through ``sft.train`` on 2 ranks, 4 steps, a checkpoint after each (the
    SIGKILL-and-resume run beside it and verl's checks: tests/e2e/test_sft_lora_launches.py)."""
    model_dir = build_tiny_model(tmp_path_factory.mktemp("lora_model"))
    _, overrides = prepare_run(tmp_path_factory.mktemp("uninterrupted"), model_dir, NUM_ROWS, "eksft", **TRAIN)
    overrides = [*overrides, "profile.nproc_per_node=2"]
    result = run_torchrun(overrides, nproc=2)
    assert result.returncode == 0, result.stdout[-4000:]
    return compose(overrides)


def test_the_merged_export_loads_in_transformers_and_is_the_base_with_the_adapter(trained_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg, manifest = trained_run, read_manifest(sft_dir(trained_run))
    assert manifest.details["export"]["max_abs_logprob_diff"] < 1e-5  # the reload against the in-memory model
    assert {"hf", "adapter"} <= set(manifest.outputs)
    run_dir = sft_dir(cfg)
    merged = AutoModelForCausalLM.from_pretrained(hf_export_dir(run_dir), dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    assert sum(p.numel() for p in merged.parameters()) == sum(p.numel() for p in base.parameters())
    adapted = PeftModel.from_pretrained(base, lora_adapter_dir(run_dir)).eval()
    input_ids = torch.tensor(PROBE_IDS)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=input_ids).logits, adapted(input_ids=input_ids).logits,
                                   rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_lora"))


@pytest.mark.parametrize("method", sorted(TOKEN_LOSSES))
def test_every_loss_trains_only_its_adapter(tmp_path, tiny_model, one_rank, method):
    """One optimiser step of each registered loss on a LoRA policy (1 rank): only the trained adapter moves."""
    from sft.optim import build_optimizer
    from sft.train import build_root
    from sft.trainer import train_step

    options = {"method.threshold": 0.0} if method == "profit" else {}  # ProFit's τ is above every tiny-model p
    cfg = compose(tiny_overrides(tmp_path / "runs", tiny_model, method, **LORA, **options))
    root, _ = build_root(cfg, str(tiny_model), one_rank, calibration_sequences=PROBE_IDS)
    optimizer = build_optimizer(root, cfg.sft)
    before = {name: p.full_tensor().clone() for name, p in root.policy.named_parameters()}
    batch = probe_batch()
    if cfg.sft.method.reads_behaviour_logprobs():  # PEAR: a behaviour policy that gave each target token e^-0.1
        batch["behaviour_logp"] = torch.full(batch["input_ids"].shape, -0.1)
    train_step(root, optimizer, [batch], sft=cfg.sft, env=one_rank)
    moved = {name for name, p in root.policy.named_parameters() if not torch.equal(p.full_tensor(), before[name])}
    assert moved and all(".lora_" in name and ".default." in name for name in moved), sorted(moved)


if __name__ == "__main__":
    worker(*sys.argv[1:])
