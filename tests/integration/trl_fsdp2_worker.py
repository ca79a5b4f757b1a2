"""TokenLossSFTTrainer's FSDP2 path on a CPU (accelerate never selects FSDP there): one gloo rank, the policy sharded
by accelerate's own ``fsdp2_prepare_model`` as ``accelerate launch --use_fsdp --fsdp_version 2`` shards it (each
decoder layer a unit; the final norm and the head, with the embeddings when tied, one tail unit unsharded by the
trunk's forward; then the root) and the frozen reference and old policy as TRL's ``prepare_fsdp`` shards them (one
unit each); the loss and gradients must equal the unsharded ones on the same batch.

    python tests/integration/trl_fsdp2_worker.py MODEL_DIR OUT_DIR LOSS...   # prints "ok <loss name> <loss>" for each
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from datasets import Dataset
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerControl, TrainerState
from trl import SFTConfig

from sft.data import supervised_token_count
from sft.integrations.trl import TokenLossSFTTrainer


def loss_and_grads(trainer: TokenLossSFTTrainer, batch: dict) -> tuple[float, dict[str, torch.Tensor]]:
    model = trainer.model
    loss = trainer.compute_loss(model, batch, num_items_in_batch=supervised_token_count(batch["labels"]))
    loss.backward()
    grads = {name: (param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad).clone()
             for name, param in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


def check(model_dir: str, out_dir: str, loss_name: str, port: int) -> None:
    rows = [("Compute 3 + 4 * 5.", "The answer is \\boxed{23}."), ("Let x = 12.", "Then x^2 = 144, so \\boxed{144}.")]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q, _ in rows],
                                 "completion": [[{"role": "assistant", "content": a}] for _, a in rows]})
    trainer = TokenLossSFTTrainer(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        args=SFTConfig(output_dir=out_dir, bf16=False, per_device_train_batch_size=2, report_to="none"),
        train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(model_dir), token_loss=loss_name,
        chunk_size=7)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():  # the policy moves away from the reference and the old policy
        for param in trainer.model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())))
    trainer.model.train()
    expected_loss, expected_grads = loss_and_grads(trainer, batch)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    trainer.accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Qwen3DecoderLayer"],
        reshard_after_forward=True, state_dict_type="SHARDED_STATE_DICT", cpu_ram_efficient_loading=False)
    fsdp2_prepare_model(trainer.accelerator, trainer.model)
    frozen = [model for model in (trainer.loss_root.reference, trainer.loss_root.old_policy) if model is not None]
    for model in frozen:
        fully_shard(model)
    loss, grads = loss_and_grads(trainer, batch)
    assert abs(loss - expected_loss) <= 1e-6 * max(1.0, abs(expected_loss)), (loss, expected_loss)
    worst = max((grads[name] - expected_grads[name]).abs().max().item() for name in grads)
    assert worst <= 1e-6, worst
    assert all(isinstance(model, FSDPModule) and isinstance(model.model.embed_tokens.weight, DTensor)
               for model in frozen)  # resharded after the loss
    for callback in trainer.callback_handler.callbacks:  # the step callback: PSFT's refresh on sharded weights
        callback.on_step_begin(trainer.args, TrainerState(global_step=0), TrainerControl())
    if trainer.loss_root.old_policy is not None:
        old = dict(trainer.loss_root.old_policy.named_parameters())
        assert all(torch.equal(old[name].full_tensor(), param.full_tensor())
                   for name, param in trainer.model.named_parameters())
    dist.destroy_process_group()
    print(f"ok {loss_name} {loss:.6f}")


if __name__ == "__main__":
    for index, name in enumerate(sys.argv[3:]):
        check(sys.argv[1], sys.argv[2], name, port=29531 + index)
