"""The token losses inside TRL's SFTTrainer (sft.integrations.trl) and the HF Trainer (sft.integrations.hf), on the
tiny random Qwen3 in fp32: every registered loss's value and gradients equal the dense reference API on the same
batch, project DFT equals TRL's ``loss_type="dft"``, gradient accumulation 2×2 equals 1×4, the PEFT reference is the
base bitwise, the example completes on 2 gloo DDP ranks, and verl's model patch still runs with TRL installed."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments
from trl import SFTConfig, SFTTrainer

from common.config.common import ConfigError
from sft.data import supervised_token_count
from sft.integrations.hf import token_loss_func
from sft.integrations.trl import TokenLossSFTTrainer
from sft.losses import TOKEN_LOSSES, compute_token_loss
from sft.policy import final_hidden_states
from sft_helpers import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
ROWS = [("Compute 3 + 4 * 5.", "4 * 5 = 20. 3 + 20 = 23. The answer is \\boxed{23}."),
        ("What is \\frac{1}{2}?", "\\boxed{\\frac{1}{2}}."),
        ("Evaluate \\sqrt{16} - 2^{3}.", "We get 4 - 8 = -4, so \\boxed{-4}."),
        ("Let x = 12.", "Then x^2 = 144 and the final answer is \\boxed{144}.")]
"""Completions of different lengths, so micro-batches hold different numbers of supervised tokens."""
OPTIONS = {"eksft": {"rho": 0.3}, "highentropy": {"rho": 0.3}, "profit": {"threshold": 0.002},
           "sedsft": {"threshold": 0.5}, "iwsft": {"level": "token"}}
"""Settings under which the tiny model's random predictions select, clip or mask some tokens and not others."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q, _ in ROWS],
                              "completion": [[{"role": "assistant", "content": a}] for _, a in ROWS]})


def sft_args(tmp_path: Path, **overrides) -> SFTConfig:
    """One fp32 SGD step at lr 1 (the update is the gradient; SFTConfig's default is bf16 autocast), no clipping."""
    values = dict(output_dir=str(tmp_path / "out"), bf16=False, max_steps=1, per_device_train_batch_size=2,
                  gradient_accumulation_steps=2, learning_rate=1.0, optim="sgd", lr_scheduler_type="constant",
                  max_grad_norm=0.0, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                  seed=0)
    return SFTConfig(**{**values, **overrides})


def load(tiny: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` with every weight moved by N(0, 0.02²): a policy that differs from its reference and old policy."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return model


def trained_weights(trainer) -> dict[str, torch.Tensor]:
    trainer.train()
    return {name: param.detach().clone() for name, param in trainer.model.named_parameters()}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    worst = largest_difference(a, b)
    assert worst <= atol, worst


@pytest.mark.parametrize("name, online", [(name, False) for name in sorted(TOKEN_LOSSES)] + [("eksft", True)],
                         ids=sorted(TOKEN_LOSSES) + ["eksft-online"])
def test_every_loss_and_its_gradients_equal_the_dense_loss_on_the_same_batch(name, online, tiny, dataset, tmp_path):
    """TRL path (patched root forward → chunked head, 5-token chunks) against ``compute_token_loss`` on the full
    logits of the same policy, reference and old policy: the loss and every parameter gradient to fp32 round-off;
    EKSFT also with ``online_statistics`` and every chunk's logits kept for the gradient pass."""
    options = OPTIONS.get(name, {})
    reference = load(tiny)
    trainer = TokenLossSFTTrainer(load(tiny), args=sft_args(tmp_path), train_dataset=dataset,
                                  processing_class=AutoTokenizer.from_pretrained(tiny), token_loss=name,
                                  token_loss_options=options, chunk_size=5, online_statistics=online,
                                  kept_logits_chunks=64 if online else 1,
                                  ref_model=reference if TOKEN_LOSSES[name].needs_reference else None)
    assert trainer.loss_root.online_statistics is online
    assert trainer.loss_root.kept_logits_chunks == (64 if online else 1)
    policy = perturbed(trainer.model, seed=1)  # after the old policy's copy: π_θ ≠ π_old ≠ π_ref
    batch = next(iter(trainer.get_train_dataloader()))
    labels = batch["labels"]
    trainer.current_gradient_accumulation_steps = 1
    policy.train()
    loss = trainer.compute_loss(policy, batch, num_items_in_batch=supervised_token_count(labels))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters()}
    policy.zero_grad()

    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        ref_logits = reference(**inputs).logits
        old = trainer.loss_root.old_policy
        old_logits = old(**inputs).logits if old is not None else None
    dense, _ = compute_token_loss(name, policy(**inputs).logits, labels, ref_logits, old_logits, **options)
    dense.backward()
    assert loss.item() == pytest.approx(dense.item(), abs=1e-6, rel=1e-6)
    scale = max(p.grad.abs().max().item() for p in policy.parameters())
    assert scale > 0
    worst = max((grads[n] - p.grad).abs().max().item() for n, p in policy.named_parameters())
    assert worst <= 1e-6 * max(1.0, scale), (worst, scale)


def test_project_dft_equals_trl_dft(tiny, dataset, tmp_path):
    """The same step through TRL's own ``loss_type="dft"`` and through ``token_loss="dft"``: the same loss and the
    same weights after it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    theirs = SFTTrainer(load(tiny), args=sft_args(tmp_path / "a", loss_type="dft"), train_dataset=dataset,
                        processing_class=tokenizer)
    ours = TokenLossSFTTrainer(load(tiny), args=sft_args(tmp_path / "b"), train_dataset=dataset,
                               processing_class=tokenizer, token_loss="dft")
    assert_close_weights(trained_weights(theirs), trained_weights(ours), atol=1e-6)
    assert ours.state.log_history[0]["loss"] == pytest.approx(theirs.state.log_history[0]["loss"], abs=1e-6)


@pytest.mark.parametrize("name", ["sft", "iwsft"])
def test_gradient_accumulation_2x2_equals_1x4(name, tiny, dataset, tmp_path):
    """One step over the same 4 rows as 2 micro-batches of 2 or 1 of 4: with the global token normalisation the same
    update (a token-mean loss), with the micro-batch mean a different one (the micro-batches' token counts differ)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)

    def step(batch: int, accumulation: int, loss_norm: str) -> dict[str, torch.Tensor]:
        args = sft_args(tmp_path / f"{batch}x{accumulation}{loss_norm}", per_device_train_batch_size=batch,
                        gradient_accumulation_steps=accumulation)
        return trained_weights(TokenLossSFTTrainer(load(tiny), args=args, train_dataset=dataset,
                                                   processing_class=tokenizer, token_loss=name, loss_norm=loss_norm))

    one_by_four = step(4, 1, "global_token_mean")
    assert_close_weights(step(2, 2, "global_token_mean"), one_by_four, atol=1e-6)
    assert largest_difference(step(2, 2, "micro_batch_mean"), one_by_four) > 1e-4


def test_peft_reference_is_the_base_bitwise(tiny, dataset, tmp_path):
    """LoRA on q/v/up, no ref_model: after a step the adapters change the policy, the reference (the base with
    adapters disabled) still gives the base model's hidden states bitwise, and the base weights did not move."""
    from peft import LoraConfig

    base = load(tiny)
    untouched = copy.deepcopy(base)
    trainer = TokenLossSFTTrainer(base, args=sft_args(tmp_path, learning_rate=0.05), train_dataset=dataset,
                                  processing_class=AutoTokenizer.from_pretrained(tiny), token_loss="eksft",
                                  peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"],
                                                         lora_dropout=0.0))
    trainer.train()
    batch = next(iter(trainer.get_train_dataloader()))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        reference = final_hidden_states(trainer.loss_root.reference, ids, mask)
        policy = final_hidden_states(trainer.loss_root.policy, ids, mask)
        expected = final_hidden_states(untouched, ids, mask)
    assert torch.equal(reference, expected)
    assert not torch.equal(policy, expected)
    base_weights = trainer.model.get_base_model().state_dict()
    for name, weight in untouched.state_dict().items():
        key = name.replace("q_proj.weight", "q_proj.base_layer.weight").replace(
            "v_proj.weight", "v_proj.base_layer.weight").replace("up_proj.weight", "up_proj.base_layer.weight")
        assert torch.equal(base_weights[key], weight), name


@pytest.mark.parametrize("setting, message", [
    (dict(args=dict(packing=True)), "packing"),
    (dict(args=dict(padding_free=True)), "padding_free"),
    (dict(args=dict(use_liger_kernel=True)), "use_liger_kernel"),
    (dict(args=dict(loss_type="dft")), "loss_type='dft'"),
    (dict(compute_loss_func=lambda *a, **k: None), "compute_loss_func"),
    (dict(token_loss_options={"selection_scope": "optimizer_batch"}), "selection_scope=optimizer_batch"),
    (dict(token_loss="sedsft", token_loss_options={"threshold_calibration": "official"}), "calibrates"),
    (dict(token_loss="sft", ref_model="unused"), "uses no reference"),
    (dict(peft=["q_proj", "lm_head"]), "lm_head is wrapped by PEFT"),
    (dict(peft=["q_proj", "embed_tokens"]), "embed_tokens is wrapped by PEFT"),
    (dict(args=dict(gradient_checkpointing=False), gradient_checkpointing_policy="selective"),
     "gradient_checkpointing_policy=selective needs gradient_checkpointing=True"),
])
def test_what_cannot_be_honoured_is_refused_in_one_line(setting, message, tiny, dataset, tmp_path):
    from peft import LoraConfig

    kwargs = {key: value for key, value in setting.items() if key not in ("args", "peft")}
    if "peft" in setting:
        kwargs["peft_config"] = LoraConfig(r=4, target_modules=setting["peft"])
    with pytest.raises(ConfigError, match=message) as refusal:
        TokenLossSFTTrainer(load(tiny), args=sft_args(tmp_path, **setting.get("args", {})), train_dataset=dataset,
                            processing_class=AutoTokenizer.from_pretrained(tiny), **{"token_loss": "eksft", **kwargs})
    assert "\n" not in str(refusal.value)


def test_selective_checkpointing_trains_as_hf_checkpointing_and_repeats_no_matmul(tiny, dataset, tmp_path):
    """``gradient_checkpointing_policy="selective"``: the same SGD step as HF's full checkpointing (TRL's default
    ``gradient_checkpointing=True``), and a backward that recomputes SwiGLU's activation but runs the matmuls of one
    without checkpointing."""
    from test_sft_activation_checkpointing import MatmulCount

    def trainer(folder: str, checkpointing: bool = True, policy: str = "full") -> TokenLossSFTTrainer:
        return TokenLossSFTTrainer(load(tiny), args=sft_args(tmp_path / folder, gradient_checkpointing=checkpointing),
                                   train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(tiny),
                                   token_loss="eksft", token_loss_options=OPTIONS["eksft"],
                                   gradient_checkpointing_policy=policy)

    def backward_counts(trainer: TokenLossSFTTrainer) -> tuple[int, int]:
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, batch, num_items_in_batch=supervised_token_count(batch["labels"]))
        with MatmulCount() as counter:
            loss.backward()
        return counter.count, counter.silu

    assert_close_weights(trained_weights(trainer("full")), trained_weights(trainer("selective", policy="selective")),
                         atol=1e-6)
    (matmuls, silu), (none_matmuls, none_silu) = backward_counts(trainer("sel", policy="selective")), \
        backward_counts(trainer("none", False))
    assert matmuls == none_matmuls and silu > none_silu == 0  # activations recomputed, no matmul


def test_hf_trainer_compute_loss_func_equals_the_trl_trainer(tiny, dataset, tmp_path):
    """Plain ``Trainer(compute_loss_func=token_loss_func("eaft"))`` on TRL's tokenised rows, 2×2: the same step as
    the TRL path; a loss that needs a reference is refused."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    ours = TokenLossSFTTrainer(load(tiny), args=sft_args(tmp_path / "trl"), train_dataset=dataset,
                               processing_class=tokenizer, token_loss="eaft")
    plain_args = TrainingArguments(**{key: value for key, value in sft_args(tmp_path / "hf").to_dict().items()
                                      if key in TrainingArguments.__dataclass_fields__ and key != "push_to_hub_token"})
    plain = Trainer(load(tiny), args=plain_args, train_dataset=ours.train_dataset, data_collator=ours.data_collator,
                    compute_loss_func=token_loss_func("eaft"))
    assert_close_weights(trained_weights(plain), trained_weights(ours), atol=1e-6)
    with pytest.raises(ConfigError, match="needs a frozen reference"):
        token_loss_func("eksft")


def run(command: list[str], timeout: float = 240) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def test_the_example_runs_as_written_on_two_gloo_ddp_ranks():
    """The example's torchrun line: the script of its one-process line, under DDP (the tests above run the trainer
    in one process)."""
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "examples/trl_eksft.py", "--steps", "2"])
    assert "EKSFT through TRL: 2 steps" in out


def test_verl_model_patch_runs_with_trl_installed():
    """verl 0.9.1's ``apply_monkey_patch`` imports ``trl.experimental.ppo`` whenever TRL is installed (gone from TRL
    1.13 on): with the ``trl`` extra's 1.12.0 it must still patch a model."""
    from bench.tiny_model import random_qwen3
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.utils.import_utils import is_trl_available

    assert is_trl_available()
    apply_monkey_patch(random_qwen3(vocab_size=64, hidden_size=64, num_layers=1))


def test_fsdp2_sharded_policy_reference_and_old_policy_give_the_unsharded_loss(tiny, tmp_path):
    """The FSDP2 path on one gloo rank, sharded by hand as accelerate and TRL's ``prepare_fsdp`` shard (accelerate
    never selects FSDP on a CPU): loss and gradients equal the unsharded ones, PSFT's refresh copies sharded weights."""
    out = run([sys.executable, "tests/integration/trl_fsdp2_worker.py", str(tiny), str(tmp_path), "eksft", "psft"])
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("ok ")] == [["ok", "eksft"], ["ok", "psft"]]


def test_the_gpu_check_builds_its_fsdp2_launch_and_its_worker_trains_on_a_cpu(tmp_path):
    """scripts/trl_fsdp_gpu_check.py: the plain and the ``accelerate launch`` FSDP2 commands, and the plain worker (the
    code the FSDP2 run executes too) training a step of EKSFT on the tiny model, in this process."""
    spec = importlib.util.spec_from_file_location("trl_fsdp_gpu_check", REPO / "scripts" / "trl_fsdp_gpu_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    runs = check.commands(tmp_path / "tiny", tmp_path, "fp32", steps=1)
    fsdp2 = " ".join(runs["fsdp2"])
    assert "accelerate.commands.launch --num_processes 1" in fsdp2 and "--use_fsdp --fsdp_version 2" in fsdp2
    assert runs["fsdp2"][-1].endswith("fsdp2-fp32.json") and "--expect-fsdp" in runs["fsdp2"]
    assert "--expect-fsdp" not in runs["plain"]
    check.train(str(build_tiny_model(tmp_path / "tiny")), "fp32", 1, False, str(tmp_path / "plain.json"))
    assert len(json.loads((tmp_path / "plain.json").read_text())["losses"]) == 1
