"""Schema of the SFT stage: one trainer config plus one small dataclass per token-loss method.

Each method dataclass is registered in Hydra as ``sft/method/base_<name>``; ``conf/sft/method/<name>.yaml``
lists it first in its defaults, so a misspelled method key fails at composition.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Optional

from omegaconf import MISSING

from common.config.common import IDENTITY_WHEN_SET, SUPERVISION, ConfigError, check_choice, check_range


LOSS_NORMS = ("micro_batch_mean", "global_token_mean", "micro_batch_sum")
"""How micro-batch objectives combine into the step objective (``sft.loss_norm``; ``sft.trainer.micro_batch_weight``)."""
STEP_PARTS_NORM = "optimizer_batch_parts"
"""The normalisation of a method that selects over the whole optimiser batch (EKSFT ``selection_scope=
optimizer_batch``), set by the method, never a choice: each micro-batch's loss is already its part of the step's one
objective, which is their sum over micro-batches and ranks."""
CHECKPOINTING_POLICIES = ("full", "selective")
"""``sft.gradient_checkpointing_policy``: what activation checkpointing recomputes of a decoder layer."""
ADAM_IMPLEMENTATIONS = ("default", "fused")
"""``sft.adam_implementation``: how AdamW's step runs."""


LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Qwen3 decoder layer."""
LORA_REFUSED_TARGETS = ("lm_head", "embed_tokens")
"""Never adapted: the chunked loss head reads the head weight (tied to the embeddings in Qwen3-4B) directly."""


@dataclass
class SFTMethod:
    """Plain SFT: token-mean negative log-likelihood of the response tokens."""

    name: str = "sft"
    """Registry name of the token loss (``sft.losses.TOKEN_LOSSES``)."""
    keeps_old_policy: ClassVar[bool] = False
    """The trainer holds and checkpoints a frozen fp32 copy of the policy (the loss's ``needs_old_policy``, tested):
    what the preflight's disk estimate adds per checkpoint. Not a setting."""
    loss_norm: Optional[str] = None
    """This method's own loss normalisation, winning over ``sft.loss_norm``; None: ``sft.loss_norm`` applies
    (except EKSFT with ``compat=official_code``, whose preset is micro_batch_sum, D13 in docs/methods.md)."""

    def resolved(self) -> dict[str, Any]:
        """Every setting this method computes with, by field name: the fields themselves, except that a method whose
        preset fills in the fields left None (EKSFT's ``compat``) returns the values the preset gives them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reads_behaviour_logprobs(self) -> bool:
        """Whether the loss reads the SFT rows' ``behaviour_logprobs`` (the plan refuses data without them)."""
        return False

    def keeps_reference(self) -> bool:
        """Whether the trainer runs the frozen reference (the loss's ``needs_reference``, tested): what the
        preflight's memory estimate adds. Not a setting."""
        return False

    def own_loss_norm(self) -> Optional[str]:
        """The normalisation this method imposes (``loss_norm``, or its preset's), None if it leaves it to ``sft``."""
        return self.resolved()["loss_norm"]

    def validate(self) -> None:
        check_choice("sft.method.loss_norm", self.loss_norm, (None, *LOSS_NORMS))


@dataclass
class DFTMethod(SFTMethod):
    """DFT: NLL weighted by the detached target-token probability, −sg(p)·log p (arXiv 2508.05629)."""

    name: str = "dft"


@dataclass
class IWSFTMethod(SFTMethod):
    """IW-SFT: NLL weighted by a clipped, detached policy/reference likelihood ratio (arXiv 2507.12856)."""

    name: str = "iwsft"
    level: str = "sequence"
    """sequence: w_s = clip(exp(temp · mean_i log(p_i/q_i)), 0, clip_max); token: w_i = clip(p_i/q_i, token_clip_low, token_clip_high)."""
    temp: float = 1.0
    """τ in the sequence weight."""
    clip_max: float = 16.0
    """Upper clip of the sequence weight."""
    token_clip_low: float = 0.2
    """Lower clip of the token-level weight."""
    token_clip_high: float = 1.8
    """Upper clip of the token-level weight."""

    def keeps_reference(self) -> bool:
        return True

    def validate(self) -> None:
        super().validate()
        check_choice("sft.method.level", self.level, ("sequence", "token"))
        check_range("sft.method.temp", self.temp, 0.0, low_open=True)
        check_range("sft.method.clip_max", self.clip_max, 0.0, low_open=True)
        check_range("sft.method.token_clip_low", self.token_clip_low, 0.0, self.token_clip_high)


@dataclass
class PSFTMethod(SFTMethod):
    """PSFT: PPO-clipped surrogate with advantage 1 against an old-policy snapshot, −min(r, 1+ε_h) (arXiv 2508.17784)."""

    name: str = "psft"
    keeps_old_policy: ClassVar[bool] = True
    clip_high: float = 0.28
    """ε_h."""
    updates_per_refresh: int = 8
    """Optimiser steps between refreshes of the old policy (1 makes PSFT identical to SFT)."""

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.clip_high", self.clip_high, 0.0, low_open=True)
        check_range("sft.method.updates_per_refresh", self.updates_per_refresh, 1)


EKSFT_COMPAT_PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(mask_alignment="paper", k_rounding="ceil", topk_ties="paper_rank", reg_sets="union",
                  entropy_norm="none", kl_formula="true_kl", dynamic_lambda=False, stats_dtype="fp32", loss_norm=None),
    "official_code": dict(mask_alignment="official_code", k_rounding="floor", topk_ties="exact_k",
                          reg_sets="per_criterion", entropy_norm="log_vocab", kl_formula="official_code",
                          dynamic_lambda=True, stats_dtype="model", loss_norm="micro_batch_sum"),
}
"""The value each ``compat`` gives every :class:`EKSFTMethod` field left None: decisions D1–D12 and D13 (the loss
normalisation; None leaves it to ``sft.loss_norm``) of docs/methods.md."""


@dataclass
class EKSFTMethod(SFTMethod):
    """EKSFT: drop the top-ρ entropy ∪ top-ρ KL tokens from CE; regularise them with −λ_H·mean_M(H) + λ_KL·mean_M(KL).

    ``compat=official_code`` switches every ``None`` field below to the public code's behaviour
    (D1–D13 in docs/methods.md); a field set explicitly wins over the preset. :meth:`resolved` is the one place
    that decides the switches; the losses, the trainer and the SFT manifest read its result.
    """

    name: str = "eksft"
    rho: float = 0.2
    """ρ: fraction of the valid tokens selected by each criterion, k = ⌈ρ·|T|⌉."""
    lambda_entropy: float = 0.05
    """λ_H: weight of the entropy bonus on M."""
    lambda_kl: float = 0.05
    """λ_KL: weight of the reverse-KL penalty KL(π_θ‖π_ref) on M."""
    combine: str = "union"
    """union (paper) or intersection of M_H and M_KL."""
    selection: str = "topk"
    """topk (paper); random (the paper's random-masking ablation, ``random_mask_ratio`` of the tokens); or
    random_matched (as many random tokens as the top-k selection's M has in the same group)."""
    random_mask_ratio: float = 0.1
    """Fraction of tokens masked uniformly at random when ``selection=random`` (count rounded by ``k_rounding``)."""
    random_mask_seed: int = 0
    """Seed of the random mask, redrawn every optimiser step from generators seeded by (this, step, hash of each sequence)."""
    global_regularisation: bool = False
    """Ablation: CE on all tokens and both regularisers on all tokens (no selection)."""
    compat: str = "paper"
    """paper (spec default) or official_code (preset for the fields left None)."""
    mask_alignment: Optional[str] = None
    """paper (shifted prediction positions) or official_code (unshifted label positions, D1)."""
    k_rounding: Optional[str] = None
    """ceil (paper) or floor (code, D2)."""
    topk_ties: Optional[str] = None
    """paper_rank (ties at the boundary excluded) or exact_k (exactly k, ties by index, D3)."""
    selection_scope: str = "micro_batch"
    """The selection group (D4): micro_batch (each micro-batch; the code's, and the paper's runs' at batch 1),
    sequence (each sequence), or optimizer_batch (the paper's Algorithm 1: every token of the optimiser step, over
    the gradient-accumulation micro-batches and ranks; its loss_norm is optimizer_batch_parts)."""
    reg_sets: Optional[str] = None
    """union (both regularisers over M, ÷|M|) or per_criterion (H over M_H ÷k, KL over M_KL ÷k, D7)."""
    entropy_norm: Optional[str] = None
    """none (nats) or log_vocab (÷ ln V, D8)."""
    kl_formula: Optional[str] = None
    """true_kl Σp(log p − log q) or official_code Σp(p − log q) (D9)."""
    dynamic_lambda: Optional[bool] = None
    """Per-step ±factor multiplier on λ's (code, D10)."""
    target_entropy: float = 0.5
    """Dynamic-λ entropy target (normalised entropy loss)."""
    target_kl: float = 2.0
    """Dynamic-λ KL target."""
    dynamic_lambda_factor: float = 0.05
    """Dynamic-λ step size."""
    stats_dtype: Optional[str] = None
    """fp32 (spec) or model (bf16 statistics as in the code, D12)."""
    kl_eps: float = 1e-9
    """KL values below this count as 0 when ranking (keeps M_KL empty at step 0)."""

    def resolved(self) -> dict[str, Any]:
        """Every field with the value EKSFT computes with: a field left None takes its ``compat`` preset's value
        (:data:`EKSFT_COMPAT_PRESETS`), a field set explicitly keeps it. ``loss_norm`` (D13): set explicitly; else
        optimizer_batch_parts under ``selection_scope=optimizer_batch`` (each micro-batch's loss is its part of one
        objective over the optimiser batch); else the preset's (official_code: micro_batch_sum, the HF Trainer's sum
        of the GA micro-batch means); None: ``sft.loss_norm`` applies."""
        switches = super().resolved()
        for key, preset in EKSFT_COMPAT_PRESETS[self.compat].items():
            if switches[key] is None:
                switches[key] = preset
        if self.loss_norm is None and self.selection_scope == "optimizer_batch":
            switches["loss_norm"] = STEP_PARTS_NORM
        return switches

    def keeps_reference(self) -> bool:
        return True

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.rho", self.rho, 0.0, 1.0)
        check_range("sft.method.lambda_entropy", self.lambda_entropy, 0.0)
        check_range("sft.method.lambda_kl", self.lambda_kl, 0.0)
        check_choice("sft.method.combine", self.combine, ("union", "intersection"))
        check_choice("sft.method.selection", self.selection, ("topk", "random", "random_matched"))
        check_range("sft.method.random_mask_ratio", self.random_mask_ratio, 0.0, 1.0)
        check_range("sft.method.random_mask_seed", self.random_mask_seed, 0, 2**31 - 1)
        check_choice("sft.method.compat", self.compat, ("paper", "official_code"))
        check_choice("sft.method.mask_alignment", self.mask_alignment, (None, "paper", "official_code"))
        check_choice("sft.method.k_rounding", self.k_rounding, (None, "ceil", "floor"))
        check_choice("sft.method.topk_ties", self.topk_ties, (None, "paper_rank", "exact_k"))
        check_choice("sft.method.selection_scope", self.selection_scope, ("micro_batch", "sequence", "optimizer_batch"))
        check_choice("sft.method.reg_sets", self.reg_sets, (None, "union", "per_criterion"))
        check_choice("sft.method.entropy_norm", self.entropy_norm, (None, "none", "log_vocab"))
        check_choice("sft.method.kl_formula", self.kl_formula, (None, "true_kl", "official_code"))
        check_choice("sft.method.stats_dtype", self.stats_dtype, (None, "fp32", "model"))
        check_range("sft.method.kl_eps", self.kl_eps, 0.0)
        check_range("sft.method.dynamic_lambda_factor", self.dynamic_lambda_factor, 0.0, 1.0)
        if self.selection_scope == "optimizer_batch" and self.loss_norm is not None:
            raise ConfigError(f"sft.method.loss_norm={self.loss_norm}: with sft.method.selection_scope="
                              f"optimizer_batch each micro-batch's loss is its part of the step's one objective "
                              f"({STEP_PARTS_NORM}); leave sft.method.loss_norm unset")


@dataclass
class ASFTMethod(SFTMethod):
    """ASFT: DFT plus a forward-KL anchor to the frozen reference, −sg(p)·log p + λ·KL(π_ref‖π_θ) (arXiv 2509.23753)."""

    name: str = "asft"
    kl_coef: float = 0.1
    """λ: weight of the forward KL(π_ref‖π_θ) on every supervised token."""

    def keeps_reference(self) -> bool:
        return True

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.kl_coef", self.kl_coef, 0.0)


@dataclass
class GEMMethod(SFTMethod):
    """GEM: Σ_v q_v·w_v·(log π_θ(v) − log π_θ(y)) with q = sg(softmax(z/β)) (arXiv 2408.16673)."""

    name: str = "gem"
    beta: float = 0.7
    """β: temperature of the detached target distribution q = softmax(z/β)."""
    h: str = "linear"
    """linear (w_v = 1) or logsigmoid (w_v = sg(σ(0.01·(z_v − z_y))), the authors' Qwen2.5 numina script)."""

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.beta", self.beta, 0.0, low_open=True)
        check_choice("sft.method.h", self.h, ("linear", "logsigmoid"))


@dataclass
class SEDSFTMethod(SFTMethod):
    """SED-SFT: CE plus λ·M·(p − ½)², M = [top-k probability mass < τ] ("flexible" tokens) (arXiv 2602.07464)."""

    name: str = "sedsft"
    lambda_de: float = 1.0
    """λ: weight of the diversity term (p − ½)² (the official ``entropy_penalty_scale``, default 1.0)."""
    top_k: int = 2
    """k of the mask's top-k probability mass (the official loss call's default, 2)."""
    threshold: float = 0.95
    """τ: a token is flexible when its top-k mass is below τ (with ``threshold_calibration=none``)."""
    threshold_calibration: str = field(default="none", metadata=IDENTITY_WHEN_SET)
    """none: τ is ``threshold``. official: τ is calibrated once before training as the official script does
    (docs/methods.md): the value at rank ⌊calibration_ratio · n⌋ from the top of the initial model's top-
    ``calibration_top_k`` masses at all n positions of the first ``calibration_sequences`` tokenised SFT rows."""
    calibration_ratio: float = field(default=0.7, metadata=IDENTITY_WHEN_SET)
    """The official ``cumsum_ratio`` (0.7 in its launch script: about 30% of positions start flexible)."""
    calibration_sequences: int = field(default=100, metadata=IDENTITY_WHEN_SET)
    """Sequences the calibration reads (the official ``num_samples``, 100)."""
    calibration_top_k: int = field(default=10, metadata=IDENTITY_WHEN_SET)
    """k of the masses τ is calibrated on (the official script's 10 when ``--top_k`` is unset; the loss uses top_k)."""

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.lambda_de", self.lambda_de, 0.0)
        check_range("sft.method.top_k", self.top_k, 1)
        check_range("sft.method.threshold", self.threshold, 0.0, 1.0)
        check_choice("sft.method.threshold_calibration", self.threshold_calibration, ("none", "official"))
        check_range("sft.method.calibration_ratio", self.calibration_ratio, 0.0, 1.0, low_open=True)
        check_range("sft.method.calibration_sequences", self.calibration_sequences, 1)
        check_range("sft.method.calibration_top_k", self.calibration_top_k, 1)


@dataclass
class EAFTMethod(SFTMethod):
    """EAFT: CE weighted by the detached normalised top-k entropy, (H_k / ln k)^α (arXiv 2601.02151)."""

    name: str = "eaft"
    top_k: int = 20
    """k: the entropy is that of the softmax over the k largest logits (the paper's K = 20)."""
    alpha: float = 1.0
    """α: exponent of the weight (LLaMA-Factory ``eaft_alpha``, default 1.0)."""

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.top_k", self.top_k, 2)
        check_range("sft.method.alpha", self.alpha, 0.0)


@dataclass
class HighEntropyMethod(SFTMethod):
    """CE on the top-ρ entropy tokens only (ours: the "80/20" forking-token idea of arXiv 2506.01939, for SFT)."""

    name: str = "highentropy"
    rho: float = 0.2
    """ρ: the k = ⌈ρ·|T|⌉ highest-entropy rows of the micro-batch (EKSFT's M_H rank rule) get CE, the rest nothing."""

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.rho", self.rho, 0.0, 1.0)


@dataclass
class ProFitMethod(SFTMethod):
    """ProFit: CE only on the tokens whose detached target probability reaches τ (arXiv 2601.09195)."""

    name: str = "profit"
    threshold: float = 0.1
    """τ: a token keeps its CE when sg(p) ≥ τ (the official ``prob_threshold``, 0.1 in its README and run.sh)."""

    def validate(self) -> None:
        super().validate()
        check_range("sft.method.threshold", self.threshold, 0.0, 1.0)


@dataclass
class PEARMethod(SFTMethod):
    """PEAR: CE weighted by a clipped, discounted importance ratio π_θ/π_β of the rest of the response (arXiv
    2602.01058); π_β is the policy that generated the SFT rows, read from their behaviour log-probabilities
    (docs/methods.md)."""

    name: str = "pear"
    behaviour: str = field(default="reference", metadata=IDENTITY_WHEN_SET)
    """π_β: ``data``, the policy that generated the rows, as the paper defines it (the SFT rows' column
    ``behaviour_logprobs``; the ``pear`` preset; data without it is refused); ``reference``, the frozen base model,
    a variant (the ``pear_base_ref`` preset, the runs before this setting existed: with π_θ starting at π_β every
    ratio starts at 1). The schema's default is the variant so that a library call by name, which has no behaviour
    column, still runs (docs/baselines.md)."""

    level: str = "token"
    """token: w_t = γ^(n_t) · Π_{j>t} Δ_j over the n_t supervised tokens after t (the suffix); sequence: one weight
    Π_j Δ_j for every token of the sequence."""
    gamma: float = 0.999
    """γ: discount per token of the suffix (token level)."""
    log_ratio_low: float = -0.08
    """Lower clip of each token's log-ratio log Δ_j = log π_θ(y_j) − log π_β(y_j)."""
    log_ratio_high: float = 0.3
    """Upper clip of each token's log-ratio."""
    weight_low: float = 0.1
    """Lower clip of the weight."""
    weight_high: float = 10.0
    """Upper clip of the weight."""

    def reads_behaviour_logprobs(self) -> bool:
        return self.behaviour == "data"

    def keeps_reference(self) -> bool:
        return self.behaviour == "reference"

    def validate(self) -> None:
        super().validate()
        check_choice("sft.method.behaviour", self.behaviour, ("data", "reference"))
        check_choice("sft.method.level", self.level, ("token", "sequence"))
        check_range("sft.method.gamma", self.gamma, 0.0, 1.0, low_open=True)
        check_range("sft.method.log_ratio_low", self.log_ratio_low, None, 0.0)
        check_range("sft.method.log_ratio_high", self.log_ratio_high, 0.0)
        check_range("sft.method.weight_low", self.weight_low, 0.0, self.weight_high)


SFT_METHOD_SCHEMAS: dict[str, type[SFTMethod]] = {
    "sft": SFTMethod,
    "dft": DFTMethod,
    "iwsft": IWSFTMethod,
    "psft": PSFTMethod,
    "eksft": EKSFTMethod,
    "asft": ASFTMethod,
    "gem": GEMMethod,
    "sedsft": SEDSFTMethod,
    "eaft": EAFTMethod,
    "highentropy": HighEntropyMethod,
    "profit": ProFitMethod,
    "pear": PEARMethod,
}
"""Schema of each method, by registry name; the loss registry must have exactly these names."""


@dataclass
class LoRAConfig:
    """LoRA adapters on the policy (``sft/lora.py``): only the adapters train, the base stays frozen, and a loss's
    reference is the base with the adapters disabled (docs/sft.md, "LoRA")."""

    enabled: bool = False
    """Train LoRA adapters instead of every weight."""
    rank: int = 16
    """r: the adapters' inner dimension."""
    alpha: int = 32
    """α: the update is ``(α / r) · B A`` (an integer, as PEFT and verl type it)."""
    dropout: float = 0.0
    """Dropout on the adapters' input."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_DEFAULT_TARGETS))
    """Module names (suffixes) that get adapters; ``lm_head`` and ``embed_tokens`` are refused."""

    def validate(self) -> None:
        check_choice("sft.lora.enabled", self.enabled, (False, True))
        check_range("sft.lora.rank", self.rank, 1)
        check_range("sft.lora.alpha", self.alpha, 0.0, low_open=True)
        check_range("sft.lora.dropout", self.dropout, 0.0, 1.0, high_open=True)
        if not self.target_modules or not all(isinstance(name, str) and name for name in self.target_modules):
            raise ConfigError(f"sft.lora.target_modules must be a non-empty list of module names; got "
                              f"{self.target_modules}")
        for name in self.target_modules:
            if name.split(".")[-1] in LORA_REFUSED_TARGETS:
                raise ConfigError(f"sft.lora.target_modules: {name!r} is refused: the chunked loss head reads the LM "
                                  "head weight directly (tied to embed_tokens in Qwen3-4B); leave lm_head and "
                                  "embed_tokens out")


@dataclass
class SFTConfig:
    """The SFT trainer (FSDP2 under torchrun); identical for every method."""

    method: Any = MISSING
    """The token-loss method (``conf/sft/method/*.yaml``)."""
    lr: float = 1e-5
    """Peak learning rate (AdamW)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW β1, β2."""
    adam_eps: float = 1e-8
    """AdamW ε."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    adam_implementation: str = field(default="default", metadata=IDENTITY_WHEN_SET)
    """How AdamW's step runs: ``default``, torch's choice (foreach kernels over all parameters on a GPU, a loop over
    them on a CPU); ``fused``, one fused kernel per parameter group (``torch.optim.AdamW(fused=True)``, torchtitan's
    default). The same update up to fp32 round-off."""
    lr_schedule: str = "cosine"
    """cosine or constant after linear warm-up."""
    warmup_ratio: float = 0.01
    """Warm-up steps as a fraction of all optimiser steps."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of the peak (cosine)."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 disables clipping)."""
    micro_batch_size: int = 1
    """Sequences per micro-batch per rank."""
    grad_accum: int = 8
    """Micro-batches per optimiser step per rank."""
    epochs: int = 8
    """Passes over the SFT split."""
    max_steps: int = -1
    """Stop after this many optimiser steps (-1: epochs decide)."""
    loss_norm: str = "micro_batch_mean"
    """micro_batch_mean: mean over micro-batches (and ranks) of each micro-batch's loss (paper Alg. 1; D13 in
    docs/methods.md); global_token_mean: each micro-batch loss weighted by its share of the step's supervised tokens
    over all ranks (counted before the forward; for token-mean losses this is Σ token losses ÷ tokens of the whole
    step); micro_batch_sum: like micro_batch_mean without ÷grad_accum (the official code's HF quirk)."""
    chunk_size: int = 256
    """Tokens per chunk of the loss head (only module that builds [tokens × vocab] tensors)."""
    mixed_precision: str = "bf16"
    """bf16 (autocast on CPU, FSDP2 MixedPrecisionPolicy on GPU) or fp32."""
    gradient_checkpointing: bool = False
    """Recompute decoder activations in backward."""
    gradient_checkpointing_policy: str = field(default="full", metadata=IDENTITY_WHEN_SET)
    """What ``gradient_checkpointing`` recomputes of each decoder layer of the policy (``sft.policy.
    checkpoint_decoder_layers``): ``full``, everything (HF's non-reentrant checkpointing: only the layer's input is
    kept); ``selective``, everything but the matmul and attention outputs (``sft.policy.selective_policy``:
    torchtitan's op-level save list with every matmul kept, where torchtitan recomputes every second one; under LoRA
    each adapter's rank-r B is recomputed), so the backward repeats no projection, for more activation memory. The
    same numbers."""
    compile_layers: bool = field(default=False, metadata=IDENTITY_WHEN_SET)
    """Each decoder layer's forward under ``torch.compile`` (``sft.policy.compile_decoder_layers``): fused
    elementwise kernels, the same computation up to fp32 round-off."""
    compile_statistics: bool = field(default=False, metadata=IDENTITY_WHEN_SET)
    """The loss head's statistics pass under ``torch.compile`` (``sft.token_stats.compiled_chunk_statistics``): a
    few fused passes over each logits chunk, the same statistics up to fp32 round-off."""
    online_statistics: bool = field(default=False, metadata=IDENTITY_WHEN_SET)
    """The statistics pass of a loss whose statistics are all EKSFT's (``logp``, ``entropy``, ``kl``, ``ref_logp``)
    by an online log-sum-exp over vocabulary blocks (``sft.token_stats.online_chunk_statistics``): each logits
    chunk read once (twice for ``kl``) instead of once per reduction, compiled with ``compile_statistics``; the same
    statistics up to fp32 round-off (the entropy more accurate). Other losses keep ``row_terms``. The loss head's
    gradient pass then takes the fp32 ``entropy`` and ``kl`` of that pass (``sft.token_stats.REUSED_TERMS``) instead
    of summing them over the vocabulary again."""
    compile_pass_b: bool = field(default=False, metadata=IDENTITY_WHEN_SET)
    """The loss head's gradient pass under ``torch.compile`` (``sft.token_stats.compiled_chunk_objective_and_grad``):
    each chunk's objective and closed-form logit gradient in a few fused passes instead of one per elementwise op;
    the same numbers up to fp32 round-off."""
    kept_logits_chunks: int = field(default=1, metadata=IDENTITY_WHEN_SET)
    """Chunks of the statistics pass's policy and reference logits that the gradient pass takes instead of
    multiplying the head again (``sft.token_stats.chunked_loss``): the first ones of each micro-batch, held in the
    compute dtype until the gradient pass reaches them, ``2 · chunk_size · V`` values each with a reference (0.62 GB
    at chunk 1,024, Qwen3's vocabulary, bf16). More than a micro-batch has keeps them all. Losses without a
    statistics pass (SFT, DFT) hold none. The same numbers up to round-off where a last, short chunk's product was
    padded to ``chunk_size`` rows (``compile_statistics``)."""
    frozen_dtype: str = field(default="fp32", metadata=IDENTITY_WHEN_SET)
    """fp32 or bf16: storage of the frozen reference, its cached head and PSFT's old policy (``sft.policy.freeze``).
    Under bf16 mixed precision on a GPU FSDP2 casts them to bf16 for every forward anyway, so bf16 changes no number
    there and saves 2 bytes per parameter. Elsewhere (a CPU, fp32) the policy computes with weights the bf16 models
    do not hold: EKSFT's KL at step 0 is rounding (~1e-6 nats), not 0, and it draws the first KL masks."""
    lora: LoRAConfig = field(default_factory=LoRAConfig, metadata=IDENTITY_WHEN_SET)
    """LoRA adapters instead of full fine-tuning (off by default)."""
    reference_cache: bool = False
    """Losses that need the frozen reference read its final hidden states from a cache written once per (base model,
    tokenised split, precision) instead of running its trunk every step (``sft/reference_cache.py``; disk: tokens ×
    hidden × 2 bytes in bf16). Ignored by losses without a reference."""
    checkpoint_every: int = field(default=0, metadata=SUPERVISION)
    """Save a resumable checkpoint every N optimiser steps; one is also saved at every epoch end and after the last step (0: only those)."""
    keep_checkpoints: int = field(default=2, metadata=SUPERVISION)
    """Resumable checkpoints kept on disk."""
    process_group_timeout_s: int = field(default=3600, metadata=SUPERVISION)
    """How long a collective waits for the slowest rank before the run fails (the process group's timeout; torch's
    default is 10 minutes): the other ranks wait while rank 0 alone loads the fp32 base model (Qwen3-8B: 33 GB) and
    writes, reloads and hashes the export before the final barrier."""
    download_timeout_s: int = field(default=7200, metadata=SUPERVISION)
    """How long the other ranks wait, at a barrier of their own before any NCCL collective, for rank 0 to download a
    hub base model (Qwen3-8B: 16 GB) into the HF cache."""

    def effective_loss_norm(self) -> str:
        """The normalisation the trainer applies: the method's own (``sft.method.own_loss_norm()``) or ``loss_norm``."""
        return self.method.own_loss_norm() or self.loss_norm

    def resolved_method(self) -> dict[str, Any]:
        """What the SFT manifest records: every setting of the method as it computes (``sft.method.resolved()``, for
        EKSFT its switches after ``compat``) with ``loss_norm`` the normalisation the trainer applies."""
        return {**self.method.resolved(), "loss_norm": self.effective_loss_norm()}

    def validate(self) -> None:
        if not isinstance(self.method, SFTMethod):
            raise ConfigError("sft.method must be one of the configs in conf/sft/method "
                              f"({sorted(SFT_METHOD_SCHEMAS)}); got {type(self.method).__name__}")
        check_choice("sft.method.name", self.method.name, SFT_METHOD_SCHEMAS)
        self.method.validate()
        check_range("sft.lr", self.lr, 0.0, 1.0, low_open=True)
        if len(self.betas) != 2:
            raise ConfigError(f"sft.betas must have two values; got {self.betas}")
        for i, beta in enumerate(self.betas):
            check_range(f"sft.betas[{i}]", beta, 0.0, 1.0, high_open=True)
        check_range("sft.adam_eps", self.adam_eps, 0.0, low_open=True)
        check_choice("sft.adam_implementation", self.adam_implementation, ADAM_IMPLEMENTATIONS)
        check_range("sft.weight_decay", self.weight_decay, 0.0)
        check_choice("sft.lr_schedule", self.lr_schedule, ("cosine", "constant"))
        check_range("sft.warmup_ratio", self.warmup_ratio, 0.0, 1.0)
        check_range("sft.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_range("sft.grad_clip", self.grad_clip, 0.0)
        check_range("sft.micro_batch_size", self.micro_batch_size, 1)
        check_range("sft.grad_accum", self.grad_accum, 1)
        check_range("sft.epochs", self.epochs, 1)
        if self.max_steps != -1:
            check_range("sft.max_steps", self.max_steps, 1)
        check_choice("sft.loss_norm", self.loss_norm, LOSS_NORMS)
        check_range("sft.chunk_size", self.chunk_size, 1)
        check_choice("sft.mixed_precision", self.mixed_precision, ("bf16", "fp32"))
        check_choice("sft.gradient_checkpointing_policy", self.gradient_checkpointing_policy, CHECKPOINTING_POLICIES)
        if self.gradient_checkpointing_policy != "full" and not self.gradient_checkpointing:
            raise ConfigError(f"sft.gradient_checkpointing_policy={self.gradient_checkpointing_policy} needs "
                              "sft.gradient_checkpointing=true")
        check_choice("sft.compile_layers", self.compile_layers, (False, True))
        check_choice("sft.compile_statistics", self.compile_statistics, (False, True))
        check_choice("sft.online_statistics", self.online_statistics, (False, True))
        check_choice("sft.compile_pass_b", self.compile_pass_b, (False, True))
        check_range("sft.kept_logits_chunks", self.kept_logits_chunks, 1)
        check_choice("sft.frozen_dtype", self.frozen_dtype, ("fp32", "bf16"))
        check_choice("sft.reference_cache", self.reference_cache, (False, True))
        self.lora.validate()
        check_range("sft.checkpoint_every", self.checkpoint_every, 0)
        check_range("sft.keep_checkpoints", self.keep_checkpoints, 1)
        check_range("sft.process_group_timeout_s", self.process_group_timeout_s, 1)
        check_range("sft.download_timeout_s", self.download_timeout_s, 1)
