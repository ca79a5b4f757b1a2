"""Schema of the toy world: synthetic arithmetic problems, their tokenizer and a tiny Qwen3 base model."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.common import check_range


@dataclass
class ToyConfig:
    """The CPU toy world (``conf/toy/default.yaml`` values live under ``toy:`` in the profile)."""

    num_rows: int = 6000
    """Problems emitted in the LUFFY schema (split into SFT and RL rows by the data stage)."""
    num_benchmark_problems: int = 100
    """Held-out problems per toy benchmark."""
    world_seed: int = 0
    """Seed of the problem and document generators."""
    min_terms: int = 2
    """Fewest terms in a problem."""
    max_terms: int = 4
    """Most terms in a problem."""
    slip_rate: float = 0.2
    """Probability that a pretraining solution contains one arithmetic slip."""
    num_pretrain_docs: int = 20000
    """Documents generated for tokenizer training and pretraining."""
    vocab_size: int = 512
    """Requested BPE vocabulary (the corpus may support fewer)."""
    hidden_size: int = 128
    """Qwen3 hidden size."""
    num_layers: int = 4
    """Decoder layers."""
    num_heads: int = 2
    """Attention heads (head_dim is fixed at 64: vLLM's CPU attention needs it)."""
    num_kv_heads: int = 1
    """Key/value heads."""
    intermediate_size: int = 384
    """MLP width."""
    pretrain_steps: int = 1500
    """Optimiser steps of base-model pretraining."""
    pretrain_batch_size: int = 16
    """Packed sequences per pretraining step."""
    pretrain_seq_len: int = 256
    """Tokens per packed pretraining sequence."""
    pretrain_lr: float = 5e-3
    """Peak learning rate (cosine to 10%, 30 warm-up steps)."""

    def validate(self) -> None:
        check_range("toy.num_rows", self.num_rows, 10)
        check_range("toy.num_benchmark_problems", self.num_benchmark_problems, 1)
        check_range("toy.min_terms", self.min_terms, 2, 8)
        check_range("toy.max_terms", self.max_terms, self.min_terms, 8)
        check_range("toy.slip_rate", self.slip_rate, 0.0, 1.0)
        check_range("toy.num_pretrain_docs", self.num_pretrain_docs, 100)
        check_range("toy.vocab_size", self.vocab_size, 64)
        check_range("toy.hidden_size", self.hidden_size, 64)
        check_range("toy.num_layers", self.num_layers, 1)
        check_range("toy.num_heads", self.num_heads, 1)
        check_range("toy.num_kv_heads", self.num_kv_heads, 1, self.num_heads)
        check_range("toy.intermediate_size", self.intermediate_size, 16)
        check_range("toy.pretrain_steps", self.pretrain_steps, 1)
        check_range("toy.pretrain_batch_size", self.pretrain_batch_size, 1)
        check_range("toy.pretrain_seq_len", self.pretrain_seq_len, 16)
        check_range("toy.pretrain_lr", self.pretrain_lr, 0.0, 1.0, low_open=True)
