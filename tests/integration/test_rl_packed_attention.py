"""RL attention on the paper profile (docs/rl.md, "Attention"): verl packs a micro-batch's sequences into one
padding-free row (``use_remove_padding``, position ids restarting at each sequence) and the actor runs transformers'
``sdpa``. Checked on CPU with a tiny random Qwen3: the packed row gives each sequence exactly its own log-probs
(correct), and SDPA receives a dense block-diagonal ``N × N`` mask for it (the cost: all ``N²`` scores instead of
``Σ nᵢ² / 2``, and no flash kernel, which takes no mask)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.tiny_model import random_qwen3
from common.config import compose
from rl.verl_args import build_overrides, override_key

pytestmark = pytest.mark.integration
LENGTHS = [5, 7, 4]


def test_paper_rl_packs_sequences_for_sdpa():
    keys = {override_key(o): o.split("=", 1)[1] for o in build_overrides(compose(["profile=paper"]))}
    assert keys["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert "actor_rollout_ref.model.use_remove_padding" not in keys  # verl's default: on, sequences packed


def test_a_packed_row_is_exact_under_a_dense_block_diagonal_sdpa_mask(monkeypatch):
    model = random_qwen3(vocab_size=96, hidden_size=64, num_layers=2, seed=0).eval()
    model.config._attn_implementation = "sdpa"
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, 96, (1, n), generator=generator) for n in LENGTHS]
    with torch.no_grad():
        alone = [model(input_ids=ids).logits for ids in sequences]
    masks = []
    real_sdpa = F.scaled_dot_product_attention

    def recording_sdpa(query, key, value, attn_mask=None, is_causal=False, **kwargs):
        masks.append((None if attn_mask is None else tuple(attn_mask.shape), is_causal))
        return real_sdpa(query, key, value, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    packed_ids = torch.cat(sequences, dim=1)  # as verl's actor runs it: no mask, no KV cache
    position_ids = torch.cat([torch.arange(n) for n in LENGTHS]).unsqueeze(0)
    with torch.no_grad():
        packed = model(input_ids=packed_ids, position_ids=position_ids, attention_mask=None, use_cache=False).logits
    torch.testing.assert_close(packed, torch.cat(alone, dim=1), rtol=1e-5, atol=1e-5)
    total = sum(LENGTHS)
    assert masks and all(mask == ((1, 1, total, total), False) for mask in masks)
