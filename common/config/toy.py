"""Schema of the toy worlds (arithmetic, forking): synthetic problems, their tokenizer and a tiny Qwen3 base model."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config.common import IDENTITY_WHEN_SET, SUPERVISION, ConfigError, check_choice, check_range, computation_config

TOY_STYLES = ("chain", "steps", "careful", "direct")
"""Solution styles of the toy world (toy/arithmetic.py explains each)."""

TOY_WORLDS = ("arithmetic", "forking")
"""``toy.world``: toy/arithmetic.py (the default) or toy/forking.py."""
FORK_FAMILIES = ("small", "carry", "plain")
"""Problem families of the forking world (toy/forking.py explains each)."""
FORK_STRATEGIES = ("column", "place", "round")
"""Solution strategies of the forking world."""
FORK_OPENINGS = {"column": "Column:", "place": "Place value:", "round": "Round:"}
"""The first words of each strategy's solution: the fork."""
FORK_BEST_STRATEGY = {"small": "column", "carry": "round", "plain": "place"}
"""The strategy that is right on every problem of a family."""
FORK_POSITIONS = ("first", "mid")
"""Where the forking world's fork sits (``toy.fork_position``)."""
MID_RESPONSE_PREFIX = "Let me add them. "
"""What every solution starts with in the world ``toy.fork_position=mid``, written the same way by the documents and
the teacher, so the fork is the first token after it rather than the first response token."""


def fork_prefix(position: str) -> str:
    """The fixed text before the fork: none (``toy.fork_position=first``) or :data:`MID_RESPONSE_PREFIX` (``mid``)."""
    return MID_RESPONSE_PREFIX if position == "mid" else ""


FORK_FAMILY_RULES = {"small": "a + b ≤ 99", "carry": "a + b ≥ 100, the ones carry",
                     "plain": "a + b ≥ 100, the ones do not carry"}
"""Which problems ``a + b`` each family holds (docs/toy_world.md, "Problems, families and strategies")."""
ARITHMETIC_BENCHMARK_RULES = {"toy_add": "sums and differences of 2–4 numbers (arithmetic world)",
                              "toy_mixed": "sums with at least one product `a * b` or group `(a ± b) * c` "
                                           "(arithmetic world)"}
"""What the arithmetic world's benchmarks hold (docs/toy_world.md, "Problems")."""
FORK_BENCHMARK_PREFIX = "toy_fork_"
"""Benchmark ``toy_fork_<family>`` holds held-out problems of one family."""

ROW_ONLY_FIELDS = ("num_rows", "num_benchmark_problems", "row_style_weights", "fork_teacher_weights",
                   "fork_teacher_verified")
"""Toy fields that shape the data stage's rows and benchmarks but not the pretrained base model."""
BASE_ONLY_FIELDS = ("base_seed",)
"""Toy fields that shape the base model but not the data stage's rows and benchmarks."""
FORKING_FIELDS = ("world", "fork_pretrain_best_share", "fork_teacher_weights", "fork_teacher_verified",
                  "fork_entropy_problems", "fork_entropy_samples", "fork_position", "fork_base_prefers")
"""Fields the arithmetic world ignores: left out of its base-model key, so adding them changed no cached model."""


def _check_style_weights(key: str, weights: dict[str, float], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(weights) - set(allowed))
    if unknown:
        raise ConfigError(f"{key} has unknown styles {unknown}; allowed: {list(allowed)}")
    for style, weight in weights.items():
        check_range(f"{key}.{style}", weight, 0.0)
    if sum(weights.values()) <= 0:
        raise ConfigError(f"{key} must give at least one style a positive weight; got {dict(weights)}")


@dataclass
class ToyConfig:
    """The CPU toy world (defaults here; override as ``toy.<field>=...``). Its hash keys the base-model cache."""

    world: str = "arithmetic"
    """arithmetic (sums of products, four styles) or forking (two-digit sums, three strategies; docs/toy_world.md)."""
    num_rows: int = 6000
    """Problems emitted in the LUFFY schema (split into SFT and RL rows by the data stage)."""
    num_benchmark_problems: int = 100
    """Held-out problems per toy benchmark."""
    world_seed: int = 0
    """Seed of the problem and document generators, the tokenizer and the base model's initialisation."""
    base_seed: int = field(default=0, metadata=IDENTITY_WHEN_SET)
    """Seed of the base model alone: its initialisation and the order of its pretraining sequences (the same
    documents, problems, tokenizer and teacher); 0 is the base model of ``world_seed`` as it always was. In the base
    model's cache key when not 0, never in the data stage's (``experiment.base_seeds`` runs several)."""
    min_terms: int = 2
    """Fewest terms in a problem."""
    max_terms: int = 4
    """Most terms in a problem."""
    chat_doc_ratio: float = 0.5
    """Share of pretraining documents in chat format (the rest are 'Question: ... Answer: ...')."""
    chat_style_weights: dict[str, float] = field(
        default_factory=lambda: {"chain": 0.4, "steps": 0.3, "careful": 0.15, "direct": 0.15})
    """Solution-style mix of chat pretraining documents (what the base model samples from)."""
    raw_style_weights: dict[str, float] = field(
        default_factory=lambda: {"chain": 0.35, "steps": 0.25, "careful": 0.05, "direct": 0.35})
    """Solution-style mix of raw pretraining documents."""
    slip_rates: dict[str, float] = field(default_factory=lambda: {"chain": 0.3, "steps": 0.3, "careful": 0.3})
    """Per style, probability that a pretraining solution has one slip (chain/steps: wrong answer; careful: caught by
    the check and redone, so the base model sees what a failed check is followed by)."""
    direct_error_rate: float = 0.8
    """Probability that a pretraining 'direct' answer is wrong."""
    row_style_weights: dict[str, float] = field(default_factory=lambda: {"chain": 0.45, "steps": 0.4, "careful": 0.15})
    """Style mix of the clean (slip-free) target solutions of the LUFFY rows (SFT targets)."""
    num_pretrain_docs: int = 20000
    """Documents generated for tokenizer training."""
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
    max_position_embeddings: int = 1024
    """Longest sequence (prompt + response) the model is configured for."""
    pretrain_steps: int = 2000
    """Optimiser steps of base-model pretraining (the cosine schedule ends exactly here)."""
    pretrain_batch_size: int = 16
    """Packed sequences per pretraining step."""
    pretrain_seq_len: int = 256
    """Tokens per packed pretraining sequence."""
    pretrain_lr: float = 5e-3
    """Peak learning rate (30 warm-up steps, cosine to 10%)."""
    pretrain_dtype: str = field(default="float32", metadata=IDENTITY_WHEN_SET)
    """Compute dtype of pretraining: float32, or bfloat16 (autocast over fp32 weights; fast only on CPUs with native
    bf16, emulated ~10x slower elsewhere). Chosen here, never from the CPU: in the base model's key when not
    float32."""
    pretrain_checkpoint_every: int = field(default=250, metadata=SUPERVISION)
    """Steps between resumable checkpoints of the pretraining run."""
    pretrain_eval_problems: int = 64
    """Held-out problems for the greedy accuracy recorded in the base manifest (0: skip)."""
    fork_pretrain_best_share: float = 0.5
    """Forking world: share of pretraining documents that use their family's best strategy (the others split the
    rest evenly)."""
    fork_teacher_weights: dict[str, float] = field(
        default_factory=lambda: {"place": 0.9, "column": 0.1, "round": 0.0})
    """Forking world: the narrow teacher's strategy draw per LUFFY row."""
    fork_position: str = field(default="first", metadata=IDENTITY_WHEN_SET)
    """Forking world: where the fork sits: ``first``, the first response token; ``mid``, after a short prefix that
    the documents and the teacher always write the same way (:data:`MID_RESPONSE_PREFIX`)."""
    fork_base_prefers: str = field(default="best", metadata=IDENTITY_WHEN_SET)
    """Forking world: the strategy the pretraining documents prefer (``fork_pretrain_best_share`` of them) on each
    family: ``best`` (the base model is the best fork policy) or ``worst``, the one right least often
    (``toy.forking.WORST_STRATEGY``)."""
    fork_teacher_verified: bool = False
    """Forking world: keep only the teacher's right answers (a verifier-filtered set; the first measurement in
    docs/toy_world.md) instead of every answer it writes."""
    fork_entropy_problems: int = 60
    """Forking world: held-out problems (a third per family) whose sampled solutions give the base model's entropy
    profile in its manifest (0: skip)."""
    fork_entropy_samples: int = 4
    """Forking world: samples per problem (T = 1) for the entropy profile."""

    def data_settings(self) -> dict[str, object]:
        """The fields the data stage depends on (in its identity): everything except :data:`BASE_ONLY_FIELDS`."""
        return {name: value for name, value in computation_config(self).items() if name not in BASE_ONLY_FIELDS}

    def base_model_settings(self) -> dict[str, object]:
        """The fields the base model depends on (its cache key): everything except what only shapes the LUFFY rows."""
        ignored = ROW_ONLY_FIELDS + (FORKING_FIELDS if self.world == "arithmetic" else ())
        return {name: value for name, value in computation_config(self).items() if name not in ignored}

    def validate(self) -> None:
        check_choice("toy.world", self.world, TOY_WORLDS)
        check_range("toy.num_rows", self.num_rows, 10)
        check_range("toy.fork_pretrain_best_share", self.fork_pretrain_best_share, 0.0, 1.0)
        check_choice("toy.fork_position", self.fork_position, FORK_POSITIONS)
        check_choice("toy.fork_base_prefers", self.fork_base_prefers, ("best", "worst"))
        _check_style_weights("toy.fork_teacher_weights", self.fork_teacher_weights, FORK_STRATEGIES)
        check_range("toy.fork_entropy_problems", self.fork_entropy_problems, 0)
        check_range("toy.fork_entropy_samples", self.fork_entropy_samples, 1)
        check_range("toy.num_benchmark_problems", self.num_benchmark_problems, 1)
        check_range("toy.world_seed", self.world_seed, 0, 2**31 - 1)
        check_range("toy.base_seed", self.base_seed, 0, 2**31 - 1)
        check_range("toy.min_terms", self.min_terms, 2, 8)
        check_range("toy.max_terms", self.max_terms, self.min_terms, 8)
        check_range("toy.chat_doc_ratio", self.chat_doc_ratio, 0.0, 1.0)
        _check_style_weights("toy.chat_style_weights", self.chat_style_weights, TOY_STYLES)
        _check_style_weights("toy.raw_style_weights", self.raw_style_weights, TOY_STYLES)
        _check_style_weights("toy.row_style_weights", self.row_style_weights, TOY_STYLES[:3])
        for style, rate in self.slip_rates.items():
            if style not in TOY_STYLES[:3]:
                raise ConfigError(f"toy.slip_rates has unknown style {style!r}; allowed: {list(TOY_STYLES[:3])}")
            check_range(f"toy.slip_rates.{style}", rate, 0.0, 1.0)
        check_range("toy.direct_error_rate", self.direct_error_rate, 0.0, 1.0)
        check_range("toy.num_pretrain_docs", self.num_pretrain_docs, 100)
        check_range("toy.vocab_size", self.vocab_size, 300)
        check_range("toy.hidden_size", self.hidden_size, 64)
        check_range("toy.num_layers", self.num_layers, 1)
        check_range("toy.num_heads", self.num_heads, 1)
        check_range("toy.num_kv_heads", self.num_kv_heads, 1, self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"toy.num_heads ({self.num_heads}) must be a multiple of toy.num_kv_heads "
                              f"({self.num_kv_heads})")
        check_range("toy.intermediate_size", self.intermediate_size, 16)
        check_range("toy.max_position_embeddings", self.max_position_embeddings, 64)
        check_range("toy.pretrain_steps", self.pretrain_steps, 1)
        check_range("toy.pretrain_batch_size", self.pretrain_batch_size, 1)
        check_range("toy.pretrain_seq_len", self.pretrain_seq_len, 16, self.max_position_embeddings)
        check_range("toy.pretrain_lr", self.pretrain_lr, 0.0, 1.0, low_open=True)
        check_choice("toy.pretrain_dtype", self.pretrain_dtype, ("float32", "bfloat16"))
        check_range("toy.pretrain_checkpoint_every", self.pretrain_checkpoint_every, 1)
        check_range("toy.pretrain_eval_problems", self.pretrain_eval_problems, 0)
