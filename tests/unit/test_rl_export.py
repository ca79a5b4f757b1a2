"""The RL export of a LoRA actor: verl's merger leaves the base plus ``lora_adapter/``; ``rl.export`` merges it into
the HF folder evaluation reads and keeps the adapter beside it."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from bench.tiny_model import build_tiny_qwen3
from common.models import load_causal_lm
from rl.export import VERL_LORA_ADAPTER, merge_lora_adapter

IDS = torch.tensor([[5, 17, 42, 3, 99, 7, 64, 12], [9, 4, 200, 18, 66, 2, 13, 95]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IDS).logits


@pytest.fixture
def verl_lora_export(tmp_path):
    """A bf16 tiny Qwen3 folder (tied head, as verl's merger writes bf16) with a peft adapter saved in
    ``lora_adapter/`` (the keys verl's merger writes); returns (folder, the in-memory merged model's logits, the
    base's logits)."""
    hf_dir = build_tiny_qwen3(tmp_path / "hf", hidden_size=64, num_layers=1)
    base_logits = logits(load_causal_lm(hf_dir, dtype="auto"))
    torch.manual_seed(0)
    policy = get_peft_model(load_causal_lm(hf_dir, dtype="auto"),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: the adapter would change nothing
                parameter.normal_(0.0, 0.5)
    policy.save_pretrained(hf_dir / VERL_LORA_ADAPTER)
    return hf_dir, logits(policy.merge_and_unload()), base_logits


def test_the_lora_adapter_verl_leaves_is_merged_into_the_folder_evaluation_reads(tmp_path, verl_lora_export):
    hf_dir, merged_logits, base_logits = verl_lora_export
    assert merge_lora_adapter(hf_dir, tmp_path / "adapter")
    assert not (hf_dir / VERL_LORA_ADAPTER).exists()
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    reloaded = load_causal_lm(hf_dir, dtype="auto")
    assert reloaded.dtype == torch.bfloat16 and not hasattr(reloaded, "peft_config")
    assert torch.equal(logits(reloaded), merged_logits)
    assert not torch.equal(merged_logits, base_logits)


def test_a_full_rl_export_is_left_as_it_is(tmp_path):
    hf_dir = build_tiny_qwen3(tmp_path / "hf", hidden_size=64, num_layers=1)
    before = {path.name: path.read_bytes() for path in hf_dir.iterdir()}
    assert not merge_lora_adapter(hf_dir, tmp_path / "adapter")
    assert {path.name: path.read_bytes() for path in hf_dir.iterdir()} == before
    assert not (tmp_path / "adapter").exists()
