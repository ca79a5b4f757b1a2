"""Per-token SFT objectives: one registry, one small class per method, no vocabulary-sized tensors.

A :class:`TokenLoss` names the detached per-token statistics it needs (``stats``) and turns them
(:class:`~sft.token_stats.TokenStats`, one row per prediction position) into per-row coefficients of
differentiable per-token terms (:class:`~sft.token_stats.TokenWeights`); ``sft.token_stats`` computes the
statistics and the weighted sum chunk by chunk. The trainer gets its loss with ``build_loss(cfg.sft.method)``
and never branches on a method name. Formulas, sources and the EKSFT decisions D1–D13: ``docs/methods.md``.

Notation: T the supervised prediction positions of a selection group, ``p_i`` the policy's probability of
target ``y_i``, ``q`` the frozen reference, ``H_i``/``KL_i`` entropy and reverse KL(π_θ‖π_ref) in nats,
``sg`` stop-gradient. Every loss is a token mean within its micro-batch unless stated; "0 if empty" throughout.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from common.config.common import ConfigError
from common.config.sft import EKSFT_COMPAT_PRESETS, SFT_METHOD_SCHEMAS, EKSFTMethod, SFTMethod
from common.paths import (
    STAT_CE,
    STAT_ENTROPY_ON_M,
    STAT_ENTROPY_REST,
    STAT_IOU,
    STAT_KL_ON_M,
    STAT_KL_REST,
    set_size_stat,
)
from common.seeding import derive_seed
from sft.token_stats import TokenStats, TokenWeights, dense_loss


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a loss calibrates on once before training (:meth:`TokenLoss.calibration`): the position statistic
    ``stat`` (``sft.token_stats.position_statistics`` with ``term_options``) of the initial policy at every position
    of the first ``num_sequences`` tokenised SFT rows."""

    stat: str
    term_options: Mapping[str, Any]
    num_sequences: int


class TokenLoss:
    """Base of every registered token loss; built from its config dataclass (``common.config.sft``)."""

    name: str = ""
    needs_reference: bool = False
    """The frozen base model's hidden states are needed (EKSFT, IW-SFT, ASFT)."""
    needs_old_policy: bool = False
    """Hidden states of an old-policy snapshot are needed (PSFT)."""
    old_policy_refresh_every: int = 0
    """Optimiser steps between old-policy refreshes (PSFT: ``updates_per_refresh``; else 0)."""
    stats: tuple[str, ...] = ("logp",)
    """Per-token statistics pass A computes before ``weigh`` (names of ``sft.token_stats.row_terms``); empty: no
    pass A at all (no extra head matmul), ``weigh`` sees only the row masks."""
    uses_label_positions: bool = False
    """Also give ``weigh`` the rows ``labels[i] != -100`` (official EKSFT alignment, D1 of docs/methods.md)."""
    stats_in_model_dtype: bool = False
    """Compute pass-A statistics in the model dtype instead of fp32 (official EKSFT, D12)."""
    selects_over_step: bool = False
    """``weigh`` selects over the whole optimiser step (EKSFT ``selection_scope=optimizer_batch``): the trainer gives
    it the statistics of every micro-batch on every rank at once, before any backward
    (``sft.trainer.select_over_step``), and each micro-batch its share of the weights."""

    def __init__(self, cfg: SFTMethod):
        self.cfg = cfg
        self.term_options: Mapping[str, Any] = {}
        self.step = 0
        """The optimiser step being computed (0-based), set by :meth:`begin_step`."""
        self.calibrated: dict[str, float] = {}
        """The constants :meth:`load_calibration` set (empty: none), recorded in the SFT manifest."""

    @classmethod
    def variant(cls, cfg: SFTMethod) -> type[TokenLoss]:
        """The class that computes ``cfg``: this one, unless the method keeps some settings in a subclass (EKSFT:
        the paper's equations in :class:`EKSFTLoss`, everything else in :class:`EKSFTVariantsLoss`)."""
        return cls

    def begin_step(self, step: int) -> None:
        """Called by the trainer before optimiser step ``step``; losses with per-step randomness read ``self.step``."""
        self.step = step

    def calibration(self) -> Calibration | None:
        """What :meth:`calibrate` needs before training, or None: the loss has nothing to calibrate (the default)."""
        return None

    def calibrate(self, values: Tensor) -> dict[str, float]:
        """The loss's calibrated constants from ``values`` (``[n]``, :meth:`calibration`'s statistic at every
        position), recorded in the SFT manifest; every rank then hands them to :meth:`load_calibration`."""
        raise NotImplementedError(f"{type(self).__name__} asks for no calibration")

    def load_calibration(self, constants: Mapping[str, float]) -> None:
        """Sets the constants :meth:`calibrate` returned (on every rank, and again on a resumed run); subclasses
        read theirs and call this, which keeps them in :attr:`calibrated`."""
        self.calibrated = dict(constants)

    def weigh(self, stats: TokenStats) -> TokenWeights:
        raise NotImplementedError

    def head_metrics(self, stats: TokenStats) -> dict[str, Tensor]:
        """Metrics computed after the loss head: ``stats.values`` holds pass A's statistics and, when pass A did
        not compute it, pass B's detached ``logp`` (how a loss without pass A still logs its ``ce``)."""
        return {}


TOKEN_LOSSES: dict[str, type[TokenLoss]] = {}
"""Registry name → loss class; the names equal ``common.config.sft.SFT_METHOD_SCHEMAS``."""


def register_token_loss(name: str) -> Callable[[type[TokenLoss]], type[TokenLoss]]:
    """Class decorator adding a loss to :data:`TOKEN_LOSSES`; a name can be registered once."""

    def add(cls: type[TokenLoss]) -> type[TokenLoss]:
        if name in TOKEN_LOSSES:
            raise ValueError(f"token loss {name!r} is already registered ({TOKEN_LOSSES[name].__name__})")
        cls.name = name
        TOKEN_LOSSES[name] = cls
        return cls

    return add


def build_loss(method_cfg: SFTMethod) -> TokenLoss:
    """The loss registered under ``method_cfg.name`` (its :meth:`TokenLoss.variant` for ``method_cfg``, an instance
    of a dataclass in ``SFT_METHOD_SCHEMAS``)."""
    name = getattr(method_cfg, "name", None)
    if name not in TOKEN_LOSSES:
        raise ConfigError(f"sft.method.name: unknown token loss {name!r}; valid: {sorted(TOKEN_LOSSES)}")
    schema = SFT_METHOD_SCHEMAS.get(name)
    if schema is None or type(method_cfg) is not schema:
        raise ConfigError(f"sft.method: the config of {name!r} must be a {getattr(schema, '__name__', None)}; "
                          f"got {type(method_cfg).__name__}")
    method_cfg.validate()
    return TOKEN_LOSSES[name].variant(method_cfg)(method_cfg)


def method_config(method: str | SFTMethod, **params: Any) -> SFTMethod:
    """The config of token loss ``method`` (a registered name, or a config) with ``params`` overriding its fields
    (e.g. ``rho``, ``lambda_entropy``, ``compat="official_code"``); unknown names or fields are refused."""
    if isinstance(method, str):
        if method not in SFT_METHOD_SCHEMAS:
            raise ConfigError(f"unknown token loss {method!r}; valid: {sorted(SFT_METHOD_SCHEMAS)}")
        schema = SFT_METHOD_SCHEMAS[method]
        base = schema()
    else:
        schema, base = type(method), method
    known = {f.name for f in dataclasses.fields(schema)} - {"name"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"unknown parameters {unknown} for token loss {base.name!r}; valid: {sorted(known)}")
    return dataclasses.replace(base, **params)


def compute_token_loss(method: str | SFTMethod, logits: Tensor, labels: Tensor, ref_logits: Tensor | None = None,
                       old_logits: Tensor | None = None, *, step: int = 0, behaviour_logp: Tensor | None = None,
                       **params: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Dense reference API: ``method`` (a name or a config, ``params`` overriding its fields: :func:`method_config`)
    on HF-convention unshifted ``logits [B, L, V]`` and ``labels [B, L]`` (-100 ignored) at optimiser step ``step``
    (``behaviour_logp [B, L]``: each token's log-probability under the policy that generated the data, for a loss
    that reads it). Returns ``(loss, metrics)``, metrics detached."""
    loss = build_loss(method_config(method, **params))
    loss.begin_step(step)
    result = dense_loss(loss, logits, labels, ref_logits=ref_logits, old_logits=old_logits,
                        behaviour_logp=behaviour_logp)
    return result.loss, result.metrics


# ------------------------------------------------------------------------------------------ helpers


def _count(mask: Tensor) -> Tensor:
    return mask.sum().float()


def _per_row_share(mask: Tensor, denominator: Tensor | None = None) -> Tensor:
    """``mask / denominator`` as fp32 (default denominator ``|mask|``); all zeros when the denominator is 0."""
    den = _count(mask) if denominator is None else denominator.float()
    return mask.float() / den.clamp(min=1.0)


def _mean_on(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over ``mask`` (0 if empty)."""
    return (values * mask).sum() / _count(mask).clamp(min=1.0)


def _ce_metrics(stats: TokenStats, mask: Tensor) -> dict[str, Tensor]:
    return {STAT_CE: _mean_on(-stats.values["logp"], mask), set_size_stat("T"): _count(mask)}


# ------------------------------------------------------------------------------------------ baselines


@register_token_loss("sft")
class SFTLoss(TokenLoss):
    """SFT: ``L = −(1/|T|) Σ_{i∈T} log p_i``."""

    stats = ()

    def weigh(self, stats: TokenStats) -> TokenWeights:
        share = _per_row_share(stats.has_target)
        return TokenWeights(coefs={"logp": -share}, constant=share.new_zeros(()))

    def head_metrics(self, stats: TokenStats) -> dict[str, Tensor]:
        return _ce_metrics(stats, stats.has_target)


@register_token_loss("dft")
class DFTLoss(TokenLoss):
    """DFT (arXiv 2508.05629): ``L = −(1/|T|) Σ_{i∈T} sg(p_i) log p_i``; gradient ``−(1/|T|) Σ ∇p_i``."""

    stats = ()

    def weigh(self, stats: TokenStats) -> TokenWeights:
        share = _per_row_share(stats.has_target)
        return TokenWeights(coefs={"prob_logp": -share}, constant=share.new_zeros(()))

    def head_metrics(self, stats: TokenStats) -> dict[str, Tensor]:
        metrics = _ce_metrics(stats, stats.has_target)
        metrics["dft_p_mean"] = _mean_on(stats.values["logp"].exp(), stats.has_target)
        return metrics


@register_token_loss("iwsft")
class IWSFTLoss(TokenLoss):
    """IW-SFT (arXiv 2507.12856): ``L = −(1/|T|) Σ_{i∈T} w_i log p_i`` with a detached weight,
    sequence level ``w_i = w_s = clip(exp(τ · mean_{j∈s} (log p_j − log q_j)), 0, clip_max)``, or token level
    ``w_i = clip(p_i / q_i, token_clip_low, token_clip_high)``; ``q`` the frozen reference."""

    needs_reference = True
    stats = ("logp", "ref_logp")

    def weigh(self, stats: TokenStats) -> TokenWeights:
        cfg = self.cfg
        mask = stats.has_target
        log_ratio = (stats.values["logp"] - stats.values["ref_logp"]) * mask
        if cfg.level == "sequence":
            seq_sum = log_ratio.new_zeros(stats.num_sequences).index_add_(0, stats.sequence, log_ratio)
            seq_count = log_ratio.new_zeros(stats.num_sequences).index_add_(0, stats.sequence, mask.float())
            seq_weight = torch.clamp(torch.exp(cfg.temp * seq_sum / seq_count.clamp(min=1.0)), 0.0, cfg.clip_max)
            weight = seq_weight[stats.sequence]
            weighted_units, unit_weights = seq_count > 0, seq_weight
        else:
            weight = torch.clamp(torch.exp(log_ratio), cfg.token_clip_low, cfg.token_clip_high)
            weighted_units, unit_weights = mask, weight
        share = _per_row_share(mask)
        metrics = _ce_metrics(stats, mask)
        metrics["iw_weight_mean"] = _mean_on(unit_weights, weighted_units)
        metrics["iw_weight_max"] = torch.where(weighted_units, unit_weights, 0.0).max() if mask.numel() \
            else share.new_zeros(())
        return TokenWeights(coefs={"logp": -share * weight}, constant=share.new_zeros(()), metrics=metrics)


@register_token_loss("psft")
class PSFTLoss(TokenLoss):
    """PSFT (arXiv 2508.17784): ``L = −(1/|T|) Σ_{i∈T} min(r_i, 1 + ε_h)``, ``r_i = exp(clamp(log p_i −
    log π_old(y_i), −20, 20))`` (PPO surrogate with advantage 1; the lower clip never binds). Clipped rows are a
    constant; the others have gradient ``−r_i ∇log p_i`` (= SFT's at r = 1)."""

    needs_old_policy = True
    stats = ("logp", "old_logp")

    def __init__(self, cfg: SFTMethod):
        super().__init__(cfg)
        self.old_policy_refresh_every = cfg.updates_per_refresh

    def weigh(self, stats: TokenStats) -> TokenWeights:
        mask = stats.has_target
        ratio = torch.exp(torch.clamp(stats.values["logp"] - stats.values["old_logp"], -20.0, 20.0))
        clipped = mask & (ratio > 1.0 + self.cfg.clip_high)
        share = _per_row_share(mask)
        metrics = _ce_metrics(stats, mask)
        metrics["psft_clip_frac"] = _mean_on(clipped.float(), mask)
        metrics["psft_ratio_mean"] = _mean_on(ratio, mask)
        return TokenWeights(coefs={"ratio": -share * (~clipped)},
                            constant=-(1.0 + self.cfg.clip_high) * (share * clipped).sum(), metrics=metrics)


@register_token_loss("asft")
class ASFTLoss(TokenLoss):
    """ASFT (arXiv 2509.23753): ``L = (1/|T|) Σ_{i∈T} [−sg(p_i) log p_i + λ KL(π_ref ‖ π_θ)_i]`` (forward KL,
    full distributions, every supervised token)."""

    needs_reference = True
    stats = ("logp", "forward_kl")

    def weigh(self, stats: TokenStats) -> TokenWeights:
        mask = stats.has_target
        share = _per_row_share(mask)
        prob = stats.values["logp"].exp()
        metrics = _ce_metrics(stats, mask)
        metrics["dft_p_mean"] = _mean_on(prob, mask)
        metrics["forward_kl"] = _mean_on(stats.values["forward_kl"], mask)
        return TokenWeights(coefs={"logp": -share * prob, "forward_kl": self.cfg.kl_coef * share},
                            constant=share.new_zeros(()), metrics=metrics)


@register_token_loss("gem")
class GEMLoss(TokenLoss):
    """GEM (arXiv 2408.16673): ``L = (1/|T|) Σ_{i∈T} Σ_v g_v w_v (log p(v) − log p_i)``, ``g = sg(softmax(z/β))``,
    ``w_v = 1`` (h=linear: logit gradient ``g − e_y``) or ``sg(σ(0.01 (z_v − z_y)))`` (h=logsigmoid)."""

    def __init__(self, cfg: SFTMethod):
        super().__init__(cfg)
        self.term_options = {"gem_beta": cfg.beta, "gem_weighting": cfg.h}

    def weigh(self, stats: TokenStats) -> TokenWeights:
        share = _per_row_share(stats.has_target)
        return TokenWeights(coefs={"gem": share}, constant=share.new_zeros(()),
                            metrics=_ce_metrics(stats, stats.has_target))


# ------------------------------------------------------------------------------------------ EKSFT


def selection_size(count: Tensor, ratio: float, rounding: str) -> Tensor:
    """``k = ⌈ratio · count⌉`` (paper) or ``⌊ratio · count⌋`` (official code), in float64 on the device.

    The ceiling ignores a product exceeding an integer by < 1e-6 (float round-off: 0.1·30 = 3.0000000000000004)."""
    product = ratio * count.double()
    return torch.floor(product) if rounding == "floor" else torch.ceil(product - 1e-6)


def top_rank_mask(values: Tensor, candidates: Tensor, k: Tensor, ties: str) -> Tensor:
    """The top-k of ``values`` among ``candidates``.

    paper_rank (Eq. 6–7): ``{t : #{i ∈ candidates : X_i ≥ X_t} ≤ k}`` — rows tied at the boundary are all
    excluded, so the set may have fewer than k rows. exact_k: exactly ``min(k, |candidates|)`` rows, ties broken by
    the lower row index (deterministic stand-in for the official code's ``torch.topk``).
    """
    masked = torch.where(candidates, values, float("-inf"))
    if ties == "exact_k":
        order = torch.argsort(masked, descending=True, stable=True)
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=order.device)
        return candidates & (position < k)
    ascending = torch.sort(masked).values
    rank = masked.numel() - torch.searchsorted(ascending, masked, side="left")
    return candidates & (rank <= k)


def _eksft_metrics(stats: TokenStats, sets: dict[str, Tensor], ce_coef: Tensor, entropy_reg: Tensor,
                   kl_reg: Tensor, lambda_entropy: Tensor, lambda_kl: Tensor) -> dict[str, Tensor]:
    """What both EKSFT classes log (docs/methods.md): ``sets`` holds the row masks T, M_H, M_KL, M and CE."""
    entropy, kl = stats.values["entropy"], stats.values["kl"]
    rest = sets["T"] & ~sets["M"]
    return {STAT_CE: (ce_coef * -stats.values["logp"]).sum(), "entropy_reg": entropy_reg, "kl_reg": kl_reg,
            "lambda_entropy": lambda_entropy, "lambda_kl": lambda_kl,
            **{set_size_stat(key): _count(mask) for key, mask in sets.items()},
            STAT_IOU: _count(sets["M_H"] & sets["M_KL"]) / _count(sets["M_H"] | sets["M_KL"]).clamp(min=1.0),
            STAT_ENTROPY_ON_M: _mean_on(entropy, sets["M"]), STAT_ENTROPY_REST: _mean_on(entropy, rest),
            STAT_KL_ON_M: _mean_on(kl, sets["M"]), STAT_KL_REST: _mean_on(kl, rest)}


@register_token_loss("eksft")
class EKSFTLoss(TokenLoss):
    """EKSFT as the paper writes it (§4, Eq. 4–15), on the supervised rows T of a micro-batch:

    ``H_i`` the entropy (Eq. 4), ``KL_i = KL(π_θ‖π_ref)_i`` (Eq. 8), ``k = ⌈ρ|T|⌉`` (Eq. 7),
    ``TopK(X) = {t ∈ T : #{i ∈ T : X_i ≥ X_t} ≤ k}`` (Eq. 6–7; ties at the boundary all left out; KL < kl_eps
    ranks as 0, so M_KL = ∅ while π_θ = π_ref), ``M_H = TopK(H)``, ``M_KL = TopK(KL)``, ``M = M_H ∪ M_KL`` (Eq. 10–11),
    ``L = −(1/|T∖M|) Σ_{i∈T∖M} log p_i − λ_H (1/|M|) Σ_{i∈M} H_i + λ_KL (1/|M|) Σ_{i∈M} KL_i`` (Eq. 12–15).
    Masked rows get no ``−∇log p_i`` term (label-free). The selection group is every row ``weigh`` is given: a
    micro-batch, or with ``selection_scope=optimizer_batch`` the whole optimiser step (Algorithm 1). Every other setting
    of :class:`EKSFTMethod` (the official code's choices, the paper's ablations) is computed by
    :class:`EKSFTVariantsLoss`; :meth:`variant` picks the class.
    """

    needs_reference = True
    stats = ("logp", "entropy", "kl")

    def __init__(self, cfg: EKSFTMethod):
        super().__init__(cfg)
        self.switches = cfg.resolved()
        """Every switch after ``compat`` (``EKSFTMethod.resolved``)."""
        self.selects_over_step = self.switches["selection_scope"] == "optimizer_batch"

    @classmethod
    def variant(cls, cfg: EKSFTMethod) -> type[TokenLoss]:
        switches = cfg.resolved()
        paper = all(switches[key] == value for key, value in PAPER_SWITCHES.items()) \
            and switches["selection_scope"] in PAPER_SCOPES
        return EKSFTLoss if paper else EKSFTVariantsLoss

    def select(self, stats: TokenStats, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(M_H, M_KL, M)`` among ``rows`` (Eq. 6–11)."""
        k = selection_size(rows.sum(), self.cfg.rho, "ceil")
        kl = stats.values["kl"]
        by_entropy = top_rank_mask(stats.values["entropy"], rows, k, "paper_rank")
        by_kl = top_rank_mask(torch.where(kl < self.cfg.kl_eps, 0.0, kl), rows, k, "paper_rank")
        return by_entropy, by_kl, by_entropy | by_kl

    def weigh(self, stats: TokenStats) -> TokenWeights:
        entropy, kl, supervised = stats.values["entropy"], stats.values["kl"], stats.has_target
        by_entropy, by_kl, masked = self.select(stats, supervised)
        unmasked = supervised & ~masked
        ce_share, reg_share = _per_row_share(unmasked), _per_row_share(masked)  # 1/|T∖M| on T∖M, 1/|M| on M
        lambda_entropy, lambda_kl = self.cfg.lambda_entropy, self.cfg.lambda_kl
        coefs = {"logp": -ce_share, "entropy": -lambda_entropy * reg_share, "kl": lambda_kl * reg_share}  # Eq. 15
        sets = {"T": supervised, "M_H": by_entropy, "M_KL": by_kl, "M": masked, "CE": unmasked}
        metrics = _eksft_metrics(stats, sets, ce_share, (reg_share * entropy).sum(), (reg_share * kl).sum(),
                                 lambda_entropy * supervised.any(), lambda_kl * supervised.any())
        return TokenWeights(coefs=coefs, constant=ce_share.new_zeros(()), metrics=metrics)


# ------------------------------------------------------------------------------------------ EKSFT: every other switch

PAPER_SWITCHES: dict[str, Any] = dict({key: value for key, value in EKSFT_COMPAT_PRESETS["paper"].items()
                                       if key != "loss_norm"},
                                      combine="union", selection="topk", global_regularisation=False)
"""With these switches and a scope in :data:`PAPER_SCOPES`, EKSFT is the paper's Eq. 4–15 (:class:`EKSFTLoss`)."""
PAPER_SCOPES = ("micro_batch", "optimizer_batch")
"""The scopes whose selection group is every row ``weigh`` is given (one micro-batch, or the whole step)."""


def random_subset_mask(candidates: Tensor, k: Tensor, targets: Tensor, sequence: Tensor, seed: int,
                       step: int) -> Tensor:
    """``k`` candidate rows drawn uniformly without replacement, a new draw every optimiser step.

    Every row of sequence s gets a uniform key from a CPU generator seeded by ``derive_seed(seed,
    "eksft_random_mask:<step>:<SHA-256 of s's target ids>")``; the k candidates with the largest keys are drawn. So a
    fixed (seed, step, sequence) gives the same keys on any process or device and in any batch (resume redraws the
    same mask), and each step draws afresh, so no label stays untrained for every epoch.
    """
    targets_cpu, sequence_cpu = targets.cpu(), sequence.cpu()
    keys = torch.zeros(candidates.shape, dtype=torch.float64)
    for seq in torch.unique(sequence_cpu[candidates.cpu()]).tolist():
        rows = (sequence_cpu == seq).nonzero().squeeze(1)
        digest = hashlib.sha256(targets_cpu.index_select(0, rows).numpy().tobytes()).hexdigest()
        generator = torch.Generator().manual_seed(derive_seed(seed, f"eksft_random_mask:{step}:{digest}"))
        keys[rows] = torch.rand(rows.numel(), generator=generator, dtype=torch.float64)
    return top_rank_mask(keys.to(candidates.device), candidates, k, "exact_k")


class EKSFTVariantsLoss(EKSFTLoss):
    """EKSFT under any switch of :class:`EKSFTMethod`: the public code's choices (``compat=official_code`` or switch by
    switch, D1–D12 of docs/methods.md) and the paper's ablations that leave Eq. 15. Per selection group G
    (``selection_scope``: the micro-batch, each sequence, or the optimiser step) with rankable rows R (T; under D1 the
    label positions ``labels[i] != -100``):

    ``k = ρ|R|`` rounded up (paper) or down (D2); ``M_H``, ``M_KL`` the top k of H and KL by the paper's rank rule or
    exactly k (D3); ``M = M_H ∪ M_KL`` or ``M_H ∩ M_KL`` (``combine``), or ``random_mask_ratio``·|R| random rows
    (``selection=random``), or as many random rows as that M has (``selection=random_matched``), or
    ``M_H = M_KL = M = R`` (``global_regularisation``, with CE on all of T);
    ``L_G = (1/|C|) Σ_{i∈C} −log p_i − (λ_H/n_H) Σ_{i∈S_H} H_i/s + (λ_KL/n_KL) Σ_{i∈S_KL} K_i`` with
    C = T∖M (under D1: the rows whose next row is not masked); S_H = S_KL = M, n = |M| (paper) or S_H = M_H,
    S_KL = M_KL, n = k (D7); s = 1 or ln V (D8); K the true KL or ``Σ_v p_v (p_v − log q_v)`` (D9); each λ × (1 ±
    factor) per group (D10); ranking statistics in the model dtype (D12). The micro-batch loss is the mean of L_G
    over its non-empty groups.
    """

    def __init__(self, cfg: EKSFTMethod):
        super().__init__(cfg)
        self.uses_label_positions = self.switches["mask_alignment"] == "official_code"
        self.stats_in_model_dtype = self.switches["stats_dtype"] == "model"
        self.kl_term = "code_kl" if self.switches["kl_formula"] == "official_code" else "kl"
        self.stats = ("logp", "entropy", "kl") + (("code_kl",) if self.kl_term == "code_kl" else ())

    def select(self, stats: TokenStats, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        cfg, switches = self.cfg, self.switches
        if cfg.global_regularisation:
            return rows, rows, rows
        count = rows.sum()
        k = selection_size(count, cfg.rho, switches["k_rounding"])
        kl = stats.values["kl"]
        by_entropy = top_rank_mask(stats.values["entropy"], rows, k, switches["topk_ties"])
        by_kl = top_rank_mask(torch.where(kl < cfg.kl_eps, 0.0, kl), rows, k, switches["topk_ties"])
        masked = by_entropy | by_kl if cfg.combine == "union" else by_entropy & by_kl
        if cfg.selection != "topk":
            size = selection_size(count, cfg.random_mask_ratio, switches["k_rounding"]) if cfg.selection == "random" \
                else masked.sum()
            masked = random_subset_mask(rows, size, stats.targets, stats.sequence, cfg.random_mask_seed, self.step)
        return by_entropy, by_kl, masked

    def _ce_rows(self, stats: TokenStats, member: Tensor, rankable: Tensor, masked: Tensor) -> Tensor:
        """The rows of group ``member`` that keep their CE term."""
        if self.cfg.global_regularisation:
            return member & stats.has_target
        if self.uses_label_positions:  # masking label position i drops the CE of row i − 1 (D1)
            next_masked = torch.zeros_like(masked)
            next_masked[:-1] = masked[1:]
            return member & stats.has_target & ~next_masked
        return rankable & ~masked

    def _lambdas(self, entropy_term: Tensor, kl_term: Tensor) -> tuple[Tensor, Tensor]:
        """(λ_H, λ_KL) of a group whose regularisers (before λ, within the group) are ``entropy_term``,
        ``kl_term``; under D10 each × (1 ± factor), not persisted across steps."""
        cfg = self.cfg
        lambda_entropy = torch.full_like(entropy_term, cfg.lambda_entropy)
        lambda_kl = torch.full_like(kl_term, cfg.lambda_kl)
        if self.switches["dynamic_lambda"]:
            up, down = 1.0 + cfg.dynamic_lambda_factor, 1.0 - cfg.dynamic_lambda_factor
            lambda_entropy = lambda_entropy * torch.where(entropy_term < cfg.target_entropy, up, down)
            lambda_kl = lambda_kl * torch.where(kl_term > cfg.target_kl, up, down)
        return lambda_entropy, lambda_kl

    def weigh(self, stats: TokenStats) -> TokenWeights:
        cfg, switches, values = self.cfg, self.switches, stats.values
        rankable_all = stats.is_label_position if self.uses_label_positions else stats.has_target
        groups = [stats.sequence == s for s in range(stats.num_sequences)] if cfg.selection_scope == "sequence" \
            else [torch.ones_like(stats.has_target)]
        nonempty = torch.stack([(member & (rankable_all | stats.has_target)).any() for member in groups]).sum()
        group_share = 1.0 / nonempty.float().clamp(min=1.0)
        entropy_scale = 1.0 / math.log(stats.vocab_size) if switches["entropy_norm"] == "log_vocab" else 1.0
        scaled_entropy, reg_kl = values["entropy"] * entropy_scale, values[self.kl_term]

        zeros = torch.zeros_like(values["logp"])
        ce_coef, entropy_coef, kl_coef = zeros.clone(), zeros.clone(), zeros.clone()
        entropy_reg, kl_reg = zeros.new_zeros(()), zeros.new_zeros(())
        lambda_entropy, lambda_kl = zeros.new_zeros(()), zeros.new_zeros(())
        sets = {key: torch.zeros_like(stats.has_target) for key in ("T", "M_H", "M_KL", "M", "CE")}
        for member in groups:
            rankable = member & rankable_all
            by_entropy, by_kl, masked = self.select(stats, rankable)
            ce_rows = self._ce_rows(stats, member, rankable, masked)
            if switches["reg_sets"] == "per_criterion" and not cfg.global_regularisation:
                k = selection_size(rankable.sum(), cfg.rho, switches["k_rounding"]).float()
                entropy_base = _per_row_share(by_entropy, k) * group_share
                kl_base = _per_row_share(by_kl, k) * group_share
            else:
                entropy_base = kl_base = _per_row_share(masked) * group_share
            group_entropy_reg = (entropy_base * scaled_entropy).sum()
            group_kl_reg = (kl_base * reg_kl).sum()
            group_lambda_entropy, group_lambda_kl = self._lambdas(group_entropy_reg / group_share,
                                                                  group_kl_reg / group_share)
            ce_coef += _per_row_share(ce_rows) * group_share
            entropy_coef += group_lambda_entropy * entropy_base * entropy_scale
            kl_coef += group_lambda_kl * kl_base
            entropy_reg, kl_reg = entropy_reg + group_entropy_reg, kl_reg + group_kl_reg
            lambda_entropy = lambda_entropy + group_lambda_entropy * group_share * member.any()
            lambda_kl = lambda_kl + group_lambda_kl * group_share * member.any()
            for key, mask in (("T", rankable), ("M_H", by_entropy), ("M_KL", by_kl), ("M", masked), ("CE", ce_rows)):
                sets[key] |= mask

        metrics = _eksft_metrics(stats, sets, ce_coef, entropy_reg, kl_reg, lambda_entropy, lambda_kl)
        coefs = {"logp": -ce_coef, "entropy": -entropy_coef, self.kl_term: kl_coef}
        return TokenWeights(coefs=coefs, constant=zeros.new_zeros(()), metrics=metrics)


# ------------------------------------------------------------------------------------------ newer token-level baselines


@register_token_loss("sedsft")
class SEDSFTLoss(TokenLoss):
    """SED-SFT (arXiv 2602.07464; code pppa2019/SED-SFT): ``L = (1/|T|) Σ_{i∈T} [−log p_i + λ M_i (p_i − ½)²]``,
    ``M_i = [Σ_{top-k v} p(v) < τ]`` detached ("flexible" tokens), ``p_i`` the target probability (with gradient)."""

    stats = ("logp", "topk_mass")

    def __init__(self, cfg: SFTMethod):
        super().__init__(cfg)
        self.term_options = {"top_k": cfg.top_k}
        self.threshold: float | None = cfg.threshold if cfg.threshold_calibration == "none" else None
        """τ: ``threshold``, or the calibrated value once :meth:`load_calibration` has run."""

    def calibration(self) -> Calibration | None:
        if self.cfg.threshold_calibration == "none":
            return None
        return Calibration("topk_mass", {"top_k": self.cfg.calibration_top_k}, self.cfg.calibration_sequences)

    def calibrate(self, values: Tensor) -> dict[str, float]:
        """The official ``compute_cumsum_threshold``: with ``n`` masses and ``k = ⌊ratio · n⌋``, τ is the k-th
        largest (``sorted(masses)[-k]``); about ``1 − ratio`` of the positions fall below it."""
        k = int(self.cfg.calibration_ratio * values.numel())
        if k < 1:
            raise ValueError(f"SED-SFT calibration: {values.numel()} positions give no rank at "
                             f"sft.method.calibration_ratio={self.cfg.calibration_ratio}")
        threshold = values.float().sort().values[-k].item()
        return {"sed_threshold": threshold, "sed_calibration_positions": float(values.numel())}

    def load_calibration(self, constants: Mapping[str, float]) -> None:
        super().load_calibration(constants)
        self.threshold = constants["sed_threshold"]

    def weigh(self, stats: TokenStats) -> TokenWeights:
        if self.threshold is None:
            raise RuntimeError("sft.method.threshold_calibration=official: τ is not calibrated yet "
                               "(the trainer calls calibrate and load_calibration before the first step)")
        mask = stats.has_target
        share = _per_row_share(mask)
        flexible = mask & (stats.values["topk_mass"] < self.threshold)
        metrics = _ce_metrics(stats, mask)
        metrics["sed_flexible_frac"] = _mean_on(flexible.float(), mask)
        metrics["sed_de_mean"] = _mean_on((stats.values["logp"].exp() - 0.5) ** 2, flexible)
        return TokenWeights(coefs={"logp": -share, "de": self.cfg.lambda_de * share * flexible},
                            constant=share.new_zeros(()), metrics=metrics)


@register_token_loss("eaft")
class EAFTLoss(TokenLoss):
    """EAFT (arXiv 2601.02151): ``L = −(1/|T|) Σ_{i∈T} w_i log p_i``, ``w_i = sg((H^k_i / ln k)^α)``, ``H^k`` the
    entropy of the softmax over the k largest logits (the paper's top-K approximation of H, K = 20; k ≤ V)."""

    stats = ("logp", "topk_entropy")

    def __init__(self, cfg: SFTMethod):
        super().__init__(cfg)
        self.term_options = {"top_k": cfg.top_k}

    def weigh(self, stats: TokenStats) -> TokenWeights:
        mask = stats.has_target
        share = _per_row_share(mask)
        top_k = min(self.cfg.top_k, stats.vocab_size)
        weight = (stats.values["topk_entropy"] / math.log(top_k)).clamp(min=0.0) ** self.cfg.alpha
        metrics = _ce_metrics(stats, mask)
        metrics["eaft_weight_mean"] = _mean_on(weight, mask)
        return TokenWeights(coefs={"logp": -share * weight}, constant=share.new_zeros(()), metrics=metrics)


@register_token_loss("highentropy")
class HighEntropyCELoss(TokenLoss):
    """CE on the top-ρ entropy tokens only (ours, not from a paper: the "80/20" forking-token idea of arXiv
    2506.01939, an RLVR method, applied to SFT): per micro-batch ``k = ⌈ρ|T|⌉``, ``M_H = TopK(H)`` with EKSFT's rank
    rule (ties at the boundary excluded), ``L = −(1/|M_H|) Σ_{i∈M_H} log p_i`` (0 if M_H is empty)."""

    stats = ("logp", "entropy")

    def weigh(self, stats: TokenStats) -> TokenWeights:
        mask = stats.has_target
        k = selection_size(mask.sum(), self.cfg.rho, "ceil")
        selected = top_rank_mask(stats.values["entropy"], mask, k, "paper_rank")
        share = _per_row_share(selected)
        metrics = _ce_metrics(stats, mask)
        metrics[set_size_stat("M_H")] = _count(selected)
        metrics[STAT_ENTROPY_ON_M] = _mean_on(stats.values["entropy"], selected)
        metrics[STAT_ENTROPY_REST] = _mean_on(stats.values["entropy"], mask & ~selected)
        return TokenWeights(coefs={"logp": -share}, constant=share.new_zeros(()), metrics=metrics)


@register_token_loss("profit")
class ProFitLoss(TokenLoss):
    """ProFit (arXiv 2601.09195; code Utaotao/ProFit): ``L = −(1/|T|) Σ_{i∈T: sg(p_i) ≥ τ} log p_i``, CE only on the
    tokens whose target probability reaches τ, divided by all supervised tokens (the official loss divides the kept
    tokens' CE sum by ``num_items_in_batch``, which counts the masked tokens too)."""

    stats = ("logp",)

    def weigh(self, stats: TokenStats) -> TokenWeights:
        mask = stats.has_target
        kept = mask & (stats.values["logp"].exp() >= self.cfg.threshold)
        share = _per_row_share(mask)
        metrics = _ce_metrics(stats, mask)
        metrics["profit_kept_frac"] = _mean_on(kept.float(), mask)
        return TokenWeights(coefs={"logp": -share * kept}, constant=share.new_zeros(()), metrics=metrics)


@register_token_loss("pear")
class PEARLoss(TokenLoss):
    """PEAR (arXiv 2602.01058): per sequence s with supervised rows T_s (consecutive, in position order),
    ``δ_j = clip(log p_j − log π_β(y_j), log_ratio_low, log_ratio_high)``, and with ``n_t = #{j ∈ T_s : j > t}``

    token level ``w_t = clip(γ^{n_t} · exp(Σ_{j∈T_s, j>t} δ_j), weight_low, weight_high)`` (the discounted importance
    ratio of the rest of the response), sequence level ``w_t = clip(exp(Σ_{j∈T_s} δ_j), weight_low, weight_high)``;
    ``L = −(1/|T|) Σ_{t∈T} sg(w_t) log p_t``. π_β is the policy that generated the rows (``behaviour: data``,
    :class:`PEARBehaviourLoss`, the paper's) or, in this class, the frozen reference (``behaviour: reference``, the
    ``pear_base_ref`` variant: log π_β(y_j) = log q_j)."""

    needs_reference = True
    stats = ("logp", "ref_logp")
    behaviour_term = "ref_logp"
    """The statistic that holds log π_β(y_j)."""

    @classmethod
    def variant(cls, cfg: SFTMethod) -> type[TokenLoss]:
        return PEARBehaviourLoss if cfg.reads_behaviour_logprobs() else PEARLoss

    def weigh(self, stats: TokenStats) -> TokenWeights:
        cfg = self.cfg
        mask = stats.has_target
        log_ratio = torch.clamp(stats.values["logp"] - stats.values[self.behaviour_term], cfg.log_ratio_low,
                                cfg.log_ratio_high).double() * mask
        log_weight = _sequence_sums(log_ratio, stats)[stats.sequence]
        if cfg.level == "token":  # the suffix after t: the sequence's sum minus the sum up to and including t
            count = mask.double()
            suffix_count = _sequence_sums(count, stats)[stats.sequence] - _cumsum_within_sequence(count, stats)
            log_weight = (log_weight - _cumsum_within_sequence(log_ratio, stats)) + suffix_count * math.log(cfg.gamma)
        weight = torch.clamp(torch.exp(log_weight), cfg.weight_low, cfg.weight_high).float()
        share = _per_row_share(mask)
        metrics = _ce_metrics(stats, mask)
        metrics["pear_weight_mean"] = _mean_on(weight, mask)
        metrics["pear_weight_max"] = torch.where(mask, weight, 0.0).max() if mask.numel() else share.new_zeros(())
        return TokenWeights(coefs={"logp": -share * weight}, constant=share.new_zeros(()), metrics=metrics)


class PEARBehaviourLoss(PEARLoss):
    """PEAR as the paper defines it (``behaviour: data``, the ``pear`` preset): log π_β(y_j) is the data's
    ``behaviour_logp``, the log-probability of the target under the policy that generated the row; no reference."""

    needs_reference = False
    stats = ("logp", "behaviour_logp")
    behaviour_term = "behaviour_logp"


def _sequence_sums(values: Tensor, stats: TokenStats) -> Tensor:
    """``[num_sequences]``: the sum of ``values`` over each sequence's rows."""
    return values.new_zeros(stats.num_sequences).index_add_(0, stats.sequence, values)


def _cumsum_within_sequence(values: Tensor, stats: TokenStats) -> Tensor:
    """The inclusive running sum of ``values`` within each sequence (rows grouped by sequence, in order)."""
    before = torch.cumsum(_sequence_sums(values, stats), 0) - _sequence_sums(values, stats)
    return torch.cumsum(values, 0) - before[stats.sequence]
