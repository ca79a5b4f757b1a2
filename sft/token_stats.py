"""The only module that builds ``[tokens × vocab]`` tensors: per-token statistics and the chunked loss head.

A token loss (``sft.losses``) never sees the vocabulary. It names the per-token statistics it needs
(``TokenLoss.stats``) and turns them into per-token coefficients of differentiable per-token terms
(:class:`TokenWeights`); this module computes both, from the final hidden states and the LM-head weight,
``chunk_size`` prediction rows at a time (docs/sft.md):

* pass A (no graph, fp32 unless the loss asks for the model dtype): the loss's statistics, a few floats per row;
  skipped entirely (no head matmul) when the loss names none (plain SFT, DFT). It runs its chunks last to first
  and hands the policy and reference logits of the first ``kept_logits_chunks`` chunks (``sft.kept_logits_chunks``,
  1 by default) to pass B, which starts with them: their matmuls are not done twice (with that many chunks per
  micro-batch each head's forward matmul runs once). With
  ``sft.compile_statistics`` each chunk's statistics run compiled (:func:`compiled_chunk_statistics`), the
  policy's and the reference's logits read in a few fused passes; with ``sft.online_statistics`` EKSFT's are
  computed by an online log-sum-exp over vocabulary blocks (:func:`online_chunk_statistics`), one read of each chunk;
* selection and weighting on those ``N`` scalars (``TokenLoss.weigh``);
* pass B: ``Σ_rows Σ_terms coef · term`` with gradients, as a custom autograd function that forms each chunk's
  logit gradient in the forward from the closed forms below (in the chunk's own logits buffer) and accumulates
  ``grad_hidden`` and ``grad_head_weight`` at once (the Liger fused-linear pattern), so one chunk of logits is
  alive at a time and backward is a rescale; with ``sft.compile_pass_b`` each chunk's closed forms run compiled.
  Pass B also keeps each row's detached ``log p_y``, from which ``TokenLoss.head_metrics`` reports what a loss
  without a pass A logs (SFT's and DFT's ``ce``).

Reference logits are built in pass B only for the rows whose reference-term coefficients are non-zero (for
EKSFT: the masked set M); for a kept chunk they are those rows of pass A's reference logits, the very values
the selection ranked (a separate product of only those rows can round differently: BLAS picks kernels by shape).
:func:`dense_loss` computes the same loss on given full logits with plain autograd through :func:`row_terms` (the
reference API); tests hold the two to ≤ 1e-5.

Legend: B sequences, L positions, V vocabulary, d hidden size, N prediction rows of a micro-batch (shifted:
row ``(b, i)`` predicts ``labels[b, i+1]``), C rows of one chunk. ``*_nd`` hidden rows, ``*_cv`` chunk logits.

Per-row terms (all in nats; ``p = softmax(z)``, ``q = softmax(z')`` for reference logits ``z'``, ``lse`` the
log-sum-exp, ``y`` the target):

* ``logp``        ``log p_y = z_y − lse``
* ``prob_logp``   ``sg(p_y) · log p_y`` (DFT; logit gradient ``p_y (e_y − p)``)
* ``entropy``     ``H = −Σ_v p_v log p_v = lse − Σ_v p_v z_v``
* ``kl``          ``KL(π_θ‖π_ref) = Σ_v p_v (log p_v − log q_v) = Σ_v p_v (z_v − z'_v) − lse + lse'``
* ``code_kl``     ``Σ_v p_v (p_v − log q_v)`` (the official EKSFT code's "KL", D9 in docs/methods.md)
* ``forward_kl``  ``KL(π_ref‖π_θ) = Σ_v q_v (log q_v − log p_v)`` (ASFT)
* ``ref_logp``    ``log q_y``;  ``old_logp``  ``log π_old(y)`` (from old-policy logits)
* ``ratio``       ``exp(clamp(log p_y − old_logp, −20, 20))`` (PSFT; ``old_logp`` from pass A)
* ``gem``         ``Σ_v g_v w_v (log p_v − log p_y)``, ``g = sg(softmax(z/β))``, ``w_v = 1`` or
                  ``sg(σ(0.01 (z_v − z_y)))`` (GEM)
* ``de``          ``(p_y − ½)²`` (SED-SFT's diversity term; logit gradient ``2 (p_y − ½) p_y (e_y − p)``)
* ``topk_mass``   ``Σ`` of the ``top_k`` largest ``p_v`` (detached statistic; SED-SFT's flexible-token mask)
* ``topk_entropy`` entropy of ``softmax`` over the ``top_k`` largest logits (detached statistic; EAFT)

For ``entropy`` and ``kl`` the graph goes through ``p`` only, with ``z`` inside the sums detached: the dropped
part ``Σ_v p_v ∂log p_v/∂z = p (1 − Σ p)`` is exactly zero in exact arithmetic, and without it the logit
gradients are the closed forms ``−p(log p + H)`` and ``p(log p − log q − KL)``, so the KL gradient is exactly 0
(not round-off) when policy and reference logits are equal.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
from torch import Tensor

from common.paths import BEHAVIOUR_LOGP_COLUMN, IGNORE_INDEX

REFERENCE_TERMS = frozenset({"kl", "code_kl", "forward_kl", "ref_logp"})
"""Terms that need the reference model's logits."""
REUSED_TERMS = ("entropy", "kl")
"""Pass-A statistics pass B takes as they are under ``online_statistics`` (fp32 ones only) instead of summing over
each chunk's vocabulary again: the values of the objective's ``entropy`` and ``kl`` terms and the per-row constants
of their logit gradients."""
OLD_POLICY_TERMS = frozenset({"old_logp"})
"""Terms that need the old policy's logits."""
DATA_TERMS = frozenset({"behaviour_logp"})
"""Terms the data gives, not a model: ``behaviour_logp`` = log π_β(y) of the row's target under the policy that
generated the SFT row (the tokens' :data:`common.paths.BEHAVIOUR_LOGP_COLUMN`, :func:`data_terms`)."""
ALL_TERMS = frozenset({"logp", "prob_logp", "entropy", "ratio", "gem", "de", "topk_mass", "topk_entropy"}) \
    | REFERENCE_TERMS | OLD_POLICY_TERMS
TARGET_FREE_TERMS = frozenset({"entropy", "topk_mass", "topk_entropy"})
"""Statistics of the predicted distribution alone, defined at every position (:func:`position_statistics`)."""
OBJECTIVE_TERMS = frozenset({"logp", "prob_logp", "entropy", "ratio", "gem", "de", "kl", "code_kl", "forward_kl"})
"""Terms a loss may put coefficients on (the others do not depend on the policy)."""


@dataclass
class TokenStats:
    """Detached per-row statistics of one micro-batch (pass A), what a token loss selects and weighs with."""

    values: dict[str, Tensor]
    """Statistic name → ``[N]`` fp32 values (names from ``TokenLoss.stats``)."""
    targets: Tensor
    """``[N]`` target token id of each row (0 where the row has no target)."""
    has_target: Tensor
    """``[N]`` bool: the row is a supervised prediction position (``labels[b, i+1] != -100``)."""
    is_label_position: Tensor
    """``[N]`` bool: ``labels[b, i] != -100`` (the official EKSFT code's unshifted mask, D1 in docs/methods.md)."""
    sequence: Tensor
    """``[N]`` index of the row's sequence in the micro-batch."""
    num_sequences: int
    """B."""
    vocab_size: int
    """V (the logits width)."""

    @property
    def num_rows(self) -> int:
        return self.targets.numel()

    @staticmethod
    def concat(parts: Sequence[TokenStats]) -> TokenStats:
        """The rows of ``parts`` (e.g. every micro-batch of an optimiser step) as one set of rows, in order; the
        sequence indices of each part are offset by the sequences before it, so every sequence keeps its own."""
        offsets = [0]
        for part in parts[:-1]:
            offsets.append(offsets[-1] + part.num_sequences)
        return TokenStats(
            values={name: torch.cat([part.values[name] for part in parts]) for name in parts[0].values},
            targets=torch.cat([part.targets for part in parts]),
            has_target=torch.cat([part.has_target for part in parts]),
            is_label_position=torch.cat([part.is_label_position for part in parts]),
            sequence=torch.cat([part.sequence + offset for part, offset in zip(parts, offsets)]),
            num_sequences=sum(part.num_sequences for part in parts), vocab_size=parts[0].vocab_size)

    def to_rows(self) -> Tensor:
        """``[N, C]`` float64, one column per value (sorted by name), then targets, has_target, is_label_position
        and sequence: what :meth:`from_rows` restores exactly (fp32 values and ids below 2⁵³ survive float64)."""
        columns = [self.values[name].double() for name in sorted(self.values)]
        columns += [self.targets.double(), self.has_target.double(), self.is_label_position.double(),
                    self.sequence.double()]
        return torch.stack(columns, dim=1)

    @staticmethod
    def from_rows(rows: Tensor, names: Sequence[str], num_sequences: int, vocab_size: int) -> TokenStats:
        """The inverse of :meth:`to_rows` for statistics ``names``."""
        names = sorted(names)
        n = len(names)
        return TokenStats(values={name: rows[:, i].float() for i, name in enumerate(names)},
                          targets=rows[:, n].long(), has_target=rows[:, n + 1].bool(),
                          is_label_position=rows[:, n + 2].bool(), sequence=rows[:, n + 3].long(),
                          num_sequences=num_sequences, vocab_size=vocab_size)


@dataclass
class TokenWeights:
    """What a token loss makes of :class:`TokenStats`: ``loss = Σ_terms Σ_rows coefs[term] · term + constant``."""

    coefs: dict[str, Tensor]
    """Term name → ``[N]`` detached coefficient (0 where the term does not apply)."""
    constant: Tensor
    """Detached scalar added to the loss (e.g. PSFT's clipped rows, −(1+ε_h) each)."""
    metrics: dict[str, Tensor] = field(default_factory=dict)
    """Detached scalars: loss terms, set sizes, means (no ``.item()``)."""

    def split(self, sizes: Sequence[int]) -> list[TokenWeights]:
        """The weights of consecutive blocks of ``sizes`` rows (the inverse of :meth:`TokenStats.concat`): each
        block's coefficients, the constant on the first block only (the blocks' losses sum to the whole), and the
        whole's metrics on every block."""
        coefs = {name: coef.split(list(sizes)) for name, coef in self.coefs.items()}
        return [TokenWeights(coefs={name: parts[i] for name, parts in coefs.items()},
                             constant=self.constant if i == 0 else torch.zeros_like(self.constant),
                             metrics=dict(self.metrics)) for i in range(len(sizes))]


class TokenLossLike(Protocol):
    """What this module needs from a ``sft.losses.TokenLoss``."""

    name: str
    needs_reference: bool
    needs_old_policy: bool
    stats: tuple[str, ...]
    uses_label_positions: bool
    stats_in_model_dtype: bool
    term_options: Mapping[str, Any]

    def weigh(self, stats: TokenStats) -> TokenWeights: ...

    def head_metrics(self, stats: TokenStats) -> dict[str, Tensor]: ...


@dataclass
class LossResult:
    """One micro-batch's objective."""

    loss: Tensor
    """Scalar with grad: this micro-batch's objective under the method's own within-micro-batch normalisation."""
    num_tokens: Tensor
    """Scalar int: supervised prediction positions in this micro-batch (for ``global_token_mean`` weighting)."""
    metrics: dict[str, Tensor]
    """Detached scalars: every loss term, set sizes, means (see ``docs/methods.md``)."""


@dataclass
class PredictionRows:
    """The rows of a micro-batch a loss looks at: flat indices into ``B·L`` and what each row is."""

    index: Tensor
    targets: Tensor
    has_target: Tensor
    is_label_position: Tensor
    sequence: Tensor
    num_sequences: int


def prediction_rows(labels: Tensor, include_label_positions: bool = False) -> PredictionRows:
    """Rows ``(b, i)`` with ``labels[b, i+1] != -100`` (shifted HF convention), plus, when
    ``include_label_positions``, rows with ``labels[b, i] != -100`` (the official EKSFT code's alignment)."""
    if labels.dim() != 2:
        raise ValueError(f"labels must be [batch, length]; got shape {tuple(labels.shape)}")
    shifted = torch.full_like(labels, IGNORE_INDEX)
    shifted[:, :-1] = labels[:, 1:]
    has_target = shifted != IGNORE_INDEX
    is_label = labels != IGNORE_INDEX
    row_mask = has_target | is_label if include_label_positions else has_target
    index = row_mask.flatten().nonzero().squeeze(1)
    has_target = has_target.flatten()[index]
    return PredictionRows(
        index=index,
        targets=torch.where(has_target, shifted.flatten()[index], 0),
        has_target=has_target,
        is_label_position=is_label.flatten()[index],
        sequence=torch.div(index, labels.shape[1], rounding_mode="floor"),
        num_sequences=labels.shape[0],
    )


def _rowdot(a_cv: Tensor, b_cv: Tensor) -> Tensor:
    """``Σ_v a[c, v] · b[c, v]`` without a ``[C × V]`` temporary."""
    return torch.einsum("cv,cv->c", a_cv, b_cv)


EXPM1_LIMIT = 80.0
"""Centred gaps above this many nats would overflow ``expm1`` in fp32: such rows take the plain KL
(:func:`_accurate_kl`, :func:`online_chunk_statistics`)."""


def _accurate_kl(probs: Tensor, gap: Tensor, mean_gap: Tensor, plain: Tensor) -> Tensor:
    """Detached ``KL(p‖q) = log1p(Σ_v p_v (expm1(y_v) − y_v))`` with ``y = μ − gap``, ``μ = Σ_v p_v gap_v``
    (``mean_gap``, which every caller has already formed), for ``gap = log p − log q + c`` (any per-row constant c,
    e.g. the raw logit difference ``z − z'``).

    Derivation: ``KL = μ + log Σ p e^{−gap} = log Σ p e^{y} = log1p(Σ p (e^y − 1 − y))`` since ``Σ p y = 0``.
    The textbook ``Σ p log p − Σ p log q`` (or ``Σ p (z − z') − lse + lse'``) cancels numbers of order ``ln V`` down
    to the KLs of 1e-5..1e-3 seen early in training, losing most fp32 digits, which the top-k ranking needs; here
    every summand ``e^y − 1 − y`` is ≥ 0, so nothing cancels. Exactly 0 when ``gap`` is 0. Rows whose centred gap
    would overflow ``expm1`` in fp32 (> :data:`EXPM1_LIMIT` nats) take ``plain`` instead.
    """
    with torch.no_grad():
        probs = probs.detach()
        centred = mean_gap.detach().unsqueeze(1) - gap
        overflow = centred.amax(-1) > EXPM1_LIMIT
        if torch.compiler.is_compiling():  # fused: the series' temporaries cost no memory (Inductor's CPU expm1)
            excess = _expm1_minus_identity(centred)
        else:
            excess = torch.expm1(centred).sub_(centred)
        del centred
        accurate = torch.log1p(_rowdot(probs, excess))
        return torch.where(overflow, plain.detach(), accurate)


def row_terms(logits: Tensor, targets: Tensor, names: Sequence[str], *, ref_logits: Tensor | None = None,
              old_logits: Tensor | None = None, old_logp: Tensor | None = None,
              gem_beta: float = 1.0, gem_weighting: str = "linear", top_k: int = 1) -> dict[str, Tensor]:
    """Per-row terms (module docstring) of ``logits [C, V]`` in their own dtype; differentiable in ``logits``."""
    unknown = set(names) - ALL_TERMS
    if unknown:
        raise ValueError(f"unknown per-token terms {sorted(unknown)}; known: {sorted(ALL_TERMS)}")
    out: dict[str, Tensor] = {}
    if not names:
        return out
    lse = torch.logsumexp(logits, dim=-1)
    target_logit = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
    if {"logp", "prob_logp", "ratio", "de"} & set(names):
        logp = target_logit - lse
        out["logp"] = logp
        if "prob_logp" in names:
            out["prob_logp"] = logp.detach().exp() * logp
        if "de" in names:
            out["de"] = (logp.exp() - 0.5) ** 2
        if "ratio" in names:
            if old_logp is None:
                raise ValueError("the 'ratio' term needs old_logp (old-policy log-probabilities of the targets)")
            out["ratio"] = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    if {"entropy", "kl", "code_kl"} & set(names):
        probs = torch.softmax(logits, dim=-1)
        if "entropy" in names:
            out["entropy"] = lse.detach() - _rowdot(probs, logits.detach())
    if REFERENCE_TERMS & set(names):
        if ref_logits is None:
            raise ValueError(f"terms {sorted(REFERENCE_TERMS & set(names))} need reference logits")
        ref_logits = ref_logits.detach()
        ref_lse = torch.logsumexp(ref_logits, dim=-1)
        if "kl" in names:  # gradient through p only: exactly 0 when z = z'; value from the accurate form
            gap = logits.detach() - ref_logits
            mean_gap = _rowdot(probs, gap)
            plain = mean_gap - lse.detach() + ref_lse
            out["kl"] = plain - plain.detach() + _accurate_kl(probs, gap, mean_gap, plain)
        if "code_kl" in names:
            out["code_kl"] = _rowdot(probs, probs) - _rowdot(probs, ref_logits) + ref_lse
        if "forward_kl" in names:
            ref_probs = torch.softmax(ref_logits, dim=-1)
            gap = ref_logits - logits
            mean_gap = _rowdot(ref_probs, gap)
            plain = mean_gap - ref_lse + lse
            out["forward_kl"] = plain - plain.detach() + _accurate_kl(ref_probs, gap.detach(), mean_gap, plain)
        if "ref_logp" in names:
            out["ref_logp"] = ref_logits.gather(1, targets.unsqueeze(1)).squeeze(1) - ref_lse
    if "old_logp" in names:
        if old_logits is None:
            raise ValueError("the 'old_logp' term needs old-policy logits")
        old_logits = old_logits.detach()
        out["old_logp"] = (old_logits.gather(1, targets.unsqueeze(1)).squeeze(1)
                           - torch.logsumexp(old_logits, dim=-1))
    if {"topk_mass", "topk_entropy"} & set(names):
        top_logits = logits.detach().topk(min(top_k, logits.shape[-1]), dim=-1).values
        if "topk_mass" in names:
            out["topk_mass"] = torch.exp(top_logits - lse.detach().unsqueeze(1)).sum(-1)
        if "topk_entropy" in names:
            top_logp = top_logits.log_softmax(-1)
            out["topk_entropy"] = -(top_logp.exp() * top_logp).sum(-1)
    if "gem" in names:
        detached = logits.detach()
        weights = torch.softmax(detached / gem_beta, dim=-1)
        if gem_weighting == "logsigmoid":
            weights = weights * torch.sigmoid(0.01 * (detached - target_logit.detach().unsqueeze(1)))
        out["gem"] = _rowdot(weights, logits) - weights.sum(-1) * target_logit
    return {name: out[name] for name in names}


# ------------------------------------------------------------------------------------------ dense reference


def dense_loss(loss: TokenLossLike, logits: Tensor, labels: Tensor, *, ref_logits: Tensor | None = None,
               old_logits: Tensor | None = None, behaviour_logp: Tensor | None = None) -> LossResult:
    """The loss on given full logits ``[B, L, V]`` (HF-convention, unshifted labels ``[B, L]``); the reference
    the chunked head is tested against. Builds ``[N × V]`` copies: for tests and small inputs only.
    ``behaviour_logp [B, L]``: the data's :data:`DATA_TERMS` (:func:`data_terms`)."""
    _check_pair("logits", logits, "labels", labels)
    _check_models(loss, logits, ref_logits, old_logits, "ref_logits", "old_logits")
    rows = prediction_rows(labels, loss.uses_label_positions)
    given = data_terms(loss, rows, behaviour_logp)
    logits_nv = logits.flatten(0, 1).index_select(0, rows.index)
    ref_nv = None if ref_logits is None else ref_logits.detach().flatten(0, 1).index_select(0, rows.index)
    old_nv = None if old_logits is None else old_logits.detach().flatten(0, 1).index_select(0, rows.index)
    with torch.no_grad():
        stats_dtype = logits.dtype if loss.stats_in_model_dtype else torch.float32
        values = row_terms(logits_nv.to(stats_dtype), rows.targets, [n for n in loss.stats if n not in DATA_TERMS],
                           ref_logits=_maybe_to(ref_nv, stats_dtype), old_logits=_maybe_to(old_nv, stats_dtype),
                           **loss.term_options) | given
    weights = loss.weigh(_token_stats(rows, values, logits.shape[-1]))
    terms = row_terms(logits_nv.float(), rows.targets, list(weights.coefs), ref_logits=_maybe_to(ref_nv, torch.float32),
                      old_logp=values.get("old_logp"), **loss.term_options)
    objective = sum((weights.coefs[name] * terms[name]).sum() for name in weights.coefs)
    value = objective + weights.constant + 0.0 * logits.sum()  # the zero term keeps |T| = 0 on the graph
    target_logp = row_terms(logits_nv.detach().float(), rows.targets, ("logp",))["logp"]
    return _result(value, rows, _with_head_metrics(loss, weights, rows, values, target_logp, logits.shape[-1]))


# ------------------------------------------------------------------------------------------ chunked head


def chunked_loss(loss: TokenLossLike, hidden: Tensor, head_weight: Tensor, labels: Tensor, *, chunk_size: int,
                 ref_hidden: Tensor | None = None, ref_head_weight: Tensor | None = None,
                 old_hidden: Tensor | None = None, old_head_weight: Tensor | None = None,
                 weights: TokenWeights | None = None, statistics: Mapping[str, Tensor] | None = None,
                 compile_statistics: bool = False, online_statistics: bool = False, compile_pass_b: bool = False,
                 kept_logits_chunks: int = 1, behaviour_logp: Tensor | None = None) -> LossResult:
    """``loss`` on the LM head ``hidden [B, L, d] @ head_weight[V, d]ᵀ``, ``chunk_size`` rows at a time.

    ``hidden`` are the policy's final hidden states (after the final norm), with grad; gradients flow into
    ``hidden`` and ``head_weight`` (tied or not). ``ref_*``/``old_*`` come from no-grad forwards of the
    reference / old-policy trunks and are required when the loss ``needs_reference`` / ``needs_old_policy``.
    Holds pass A's policy and reference logits of ``kept_logits_chunks`` chunks (compute dtype) for pass B to take
    instead of multiplying again, and one chunk more at a time; matches :func:`dense_loss` on
    ``hidden @ head_weightᵀ`` to fp32 round-off. ``weights``: this micro-batch's share of a selection made over the
    whole optimiser step (``TokenLoss.selects_over_step``, one coefficient per row of :func:`chunked_statistics`);
    pass A and ``weigh`` are then skipped, and ``statistics`` are that pass's values of this micro-batch's rows.
    ``compile_statistics``: pass A's per-chunk statistics through :func:`compiled_chunk_statistics` (a few fused
    passes over each chunk) instead of eager ``row_terms``;
    ``online_statistics``: through :func:`online_chunk_statistics` where it computes all of them, and pass B takes
    pass A's fp32 :data:`REUSED_TERMS` instead of summing them again.
    ``compile_pass_b``: pass B's per-chunk objective and gradient through :func:`compiled_chunk_objective_and_grad`.
    ``kept_logits_chunks``: how many chunks of pass A's logits pass B takes (the first ones; each holds
    ``2 · chunk_size · V`` compute-dtype values with a reference, half that without, until pass B reaches it).
    ``behaviour_logp [B, L]``: the data's :data:`DATA_TERMS` (:func:`data_terms`).
    """
    head = _head_inputs(loss, hidden, head_weight, labels, chunk_size, ref_hidden, ref_head_weight, old_hidden,
                        old_head_weight)
    rows = head.rows
    values: dict[str, Tensor] = {}
    _check_positive_int("kept_logits_chunks", kept_logits_chunks)
    kept = _KeptLogits()
    if weights is None:
        with torch.no_grad():
            values, kept = _chunked_stats(loss, head.hidden_nd.detach(), head.weight_cd, rows.targets, chunk_size,
                                          head.ref_nd, head.ref_w, head.old_nd, head.old_w, compile_statistics,
                                          online_statistics, kept_logits_chunks)
            values |= data_terms(loss, rows, behaviour_logp)
        weights = loss.weigh(_token_stats(rows, values, head_weight.shape[0]))
    elif any(coef.shape != rows.targets.shape for coef in weights.coefs.values()):
        shapes = sorted({tuple(coef.shape) for coef in weights.coefs.values()})
        raise ValueError(f"the step's weights for this micro-batch have coefficients of shape {shapes}; its labels "
                         f"give {rows.targets.numel()} rows")
    known = values if statistics is None else statistics
    reuse = online_statistics and not loss.stats_in_model_dtype
    reused = {name: known[name] for name in REUSED_TERMS if name in known} if reuse else {}
    plan = _HeadPlan(coefs=weights.coefs, targets=rows.targets, chunk_size=chunk_size, compute_dtype=head.compute_dtype,
                     kept_logits=kept, ref_hidden=head.ref_nd, ref_head_weight=head.ref_w,
                     old_logp=values.get("old_logp"), term_options=loss.term_options,
                     target_logp=head.hidden_nd.new_zeros(rows.index.numel(), dtype=torch.float32), statistics=reused,
                     compiled=compile_pass_b)
    value = _ChunkedHeadObjective.apply(head.hidden_nd, head_weight, plan) + weights.constant
    return _result(value, rows,
                   _with_head_metrics(loss, weights, rows, values, plan.target_logp, head_weight.shape[0]))


def chunked_statistics(loss: TokenLossLike, hidden: Tensor, head_weight: Tensor, labels: Tensor, *, chunk_size: int,
                       ref_hidden: Tensor | None = None, ref_head_weight: Tensor | None = None,
                       old_hidden: Tensor | None = None, old_head_weight: Tensor | None = None,
                       compile_statistics: bool = False, online_statistics: bool = False,
                       behaviour_logp: Tensor | None = None) -> TokenStats:
    """Pass A of :func:`chunked_loss` alone (no graph): ``loss.stats`` of every row of a micro-batch, what a loss that
    selects over the whole optimiser step is given for all micro-batches at once (:meth:`TokenStats.concat`)."""
    head = _head_inputs(loss, hidden, head_weight, labels, chunk_size, ref_hidden, ref_head_weight, old_hidden,
                        old_head_weight)
    with torch.no_grad():
        values, _ = _chunked_stats(loss, head.hidden_nd.detach(), head.weight_cd, head.rows.targets, chunk_size,
                                   head.ref_nd, head.ref_w, head.old_nd, head.old_w, compile_statistics,
                                   online_statistics)
    return _token_stats(head.rows, values | data_terms(loss, head.rows, behaviour_logp), head_weight.shape[0])


@dataclass
class _HeadInputs:
    """A micro-batch's prediction rows and the head inputs restricted to them (compute-dtype head weights)."""

    rows: PredictionRows
    hidden_nd: Tensor
    weight_cd: Tensor
    compute_dtype: torch.dtype
    ref_nd: Tensor | None
    ref_w: Tensor | None
    old_nd: Tensor | None
    old_w: Tensor | None


def _head_inputs(loss: TokenLossLike, hidden: Tensor, head_weight: Tensor, labels: Tensor, chunk_size: int,
                 ref_hidden: Tensor | None, ref_head_weight: Tensor | None, old_hidden: Tensor | None,
                 old_head_weight: Tensor | None) -> _HeadInputs:
    _check_positive_int("chunk_size", chunk_size)
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [batch, length, hidden_size]; got shape {tuple(hidden.shape)}")
    _check_pair("hidden", hidden, "labels", labels)
    _check_head("head_weight", head_weight, hidden)
    _check_models(loss, hidden, ref_hidden, old_hidden, "ref_hidden", "old_hidden")
    if ref_hidden is not None:
        _check_head("ref_head_weight", ref_head_weight, ref_hidden)
    if old_hidden is not None:
        _check_head("old_head_weight", old_head_weight, old_hidden)
    rows = prediction_rows(labels, loss.uses_label_positions)
    compute_dtype = _compute_dtype(hidden, head_weight)
    return _HeadInputs(
        rows=rows, hidden_nd=hidden.flatten(0, 1).index_select(0, rows.index),
        weight_cd=head_weight.detach().to(compute_dtype), compute_dtype=compute_dtype,
        ref_nd=None if ref_hidden is None else ref_hidden.detach().flatten(0, 1).index_select(0, rows.index),
        ref_w=None if ref_head_weight is None else ref_head_weight.detach().to(compute_dtype),
        old_nd=None if old_hidden is None else old_hidden.detach().flatten(0, 1).index_select(0, rows.index),
        old_w=None if old_head_weight is None else old_head_weight.detach().to(compute_dtype))


def position_statistics(hidden: Tensor, head_weight: Tensor, names: Sequence[str], *, chunk_size: int,
                        **term_options: Any) -> dict[str, Tensor]:
    """Detached fp32 statistics of :data:`TARGET_FREE_TERMS` (``row_terms`` with ``term_options``) of the next-token
    distribution at every row of ``hidden [N, d]`` under the head ``head_weight [V, d]``, ``chunk_size`` rows at a
    time; e.g. SED-SFT's τ calibration over every position of a sequence (``TokenLoss.calibration``)."""
    unknown = set(names) - TARGET_FREE_TERMS
    if unknown:
        raise ValueError(f"{sorted(unknown)} need a target; position statistics are {sorted(TARGET_FREE_TERMS)}")
    weight_cd = head_weight.detach().to(_compute_dtype(hidden, head_weight))
    parts: dict[str, list[Tensor]] = {name: [] for name in names}
    with torch.no_grad():
        for start in range(0, hidden.shape[0], chunk_size):
            logits = _head_logits(hidden[start:start + chunk_size].detach(), weight_cd).float()
            targets = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
            for name, value in row_terms(logits, targets, names, **term_options).items():
                parts[name].append(value)
    empty = hidden.new_zeros(0, dtype=torch.float32)
    return {name: torch.cat(values) if values else empty for name, values in parts.items()}


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """dtype of the head matmuls: the caller's autocast dtype if autocast is on, else the promoted input dtype."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _head_logits(hidden: Tensor, weight_cd: Tensor) -> Tensor:
    """``hidden @ weight_cdᵀ`` in ``weight_cd``'s dtype (the head weight already cast to the compute dtype)."""
    return hidden.to(weight_cd.dtype) @ weight_cd.T


@dataclass
class _KeptLogits:
    """Pass A's policy and reference logits ``hidden @ Wᵀ`` (compute dtype, not yet cast to the statistics dtype) of
    its last-computed chunks, the first ones of the micro-batch (``kept_logits_chunks`` of them), by the chunk's first
    row: pass B takes each instead of multiplying again and releases it there."""

    policy: dict[int, Tensor] = field(default_factory=dict)
    reference: dict[int, Tensor] = field(default_factory=dict)


def chunk_statistics(logits: Tensor, targets: Tensor, names: tuple[str, ...], stats_dtype: torch.dtype, *,
                     ref_logits: Tensor | None = None, old_logits: Tensor | None = None,
                     **term_options: Any) -> dict[str, Tensor]:
    """Pass A's statistics ``names`` of one chunk: ``row_terms`` of the compute-dtype logits ``[C, V]`` (and the
    reference's and old policy's) cast to ``stats_dtype``."""
    return row_terms(logits.to(stats_dtype), targets, names, ref_logits=_maybe_to(ref_logits, stats_dtype),
                     old_logits=_maybe_to(old_logits, stats_dtype), **term_options)


@functools.cache
def compiled_chunk_statistics() -> Callable[..., dict[str, Tensor]]:
    """:func:`chunk_statistics` under ``torch.compile``: the casts, log-sum-exps, softmax and row sums of a chunk fuse
    into a few passes over it instead of one memory round trip per elementwise op (``bench.statistics_pass``). Static
    shapes: pass A pads a short last chunk to ``chunk_size`` rows, so each set of ``names`` compiles once per chunk
    shape and the kernels know their row count (a symbolic row count was slower on a GPU:
    docs/results/2026-11-27-sft-compiled-gpu.md)."""
    return torch.compile(chunk_statistics, dynamic=False, fullgraph=True)


ONLINE_TERMS = frozenset({"logp", "entropy", "kl", "ref_logp"})
"""The statistics :func:`online_chunk_statistics` computes (EKSFT's, and the reference's ``log q_y``)."""
ONLINE_BLOCK = 16384
"""Vocabulary columns per block of :func:`online_chunk_statistics` (a block of 1,024 bf16 rows: 32 MB, in L2)."""
_NO_MAX = -1e30
"""The running max before the first block: finite, so the first rescale is ``0 · s``, not ``0 · ∞``."""


def online_chunk_statistics(logits: Tensor, targets: Tensor, names: tuple[str, ...], stats_dtype: torch.dtype, *,
                            ref_logits: Tensor | None = None, old_logits: Tensor | None = None,
                            **term_options: Any) -> dict[str, Tensor]:
    """:func:`chunk_statistics` of :data:`ONLINE_TERMS` reading each chunk once in ``ONLINE_BLOCK``-column blocks
    (twice for ``kl``), with the online log-sum-exp of flash attention. Per row, for the blocks seen so far: the
    running max ``m`` and ``s = Σ e^{z−m}``, ``a = Σ e^{z−m} (z − m)`` and ``c = Σ e^{z−m} (z − z')``; a block that
    raises the max to ``m₂`` rescales them by ``α = e^{m−m₂}`` (``a ← α (a + s (m − m₂))``). Then
    ``lse = m + log s``, ``log p_y = z_y − lse``, ``H = log s − a / s`` (no difference of two numbers of order
    ``lse``, so more accurate than ``row_terms``' ``lse − Σ p z``), ``μ = c / s = Σ p (z − z')`` and, in a second read,
    ``KL = log1p(Σ p (expm1(μ − gap) − (μ − gap)))`` as ``row_terms`` (``_accurate_kl``; the summand by
    :func:`_expm1_minus_identity`, accurate compiled too). ``old_logits``
    and ``term_options`` are :func:`chunk_statistics`' arguments, unused by these terms."""
    rows, vocab = logits.shape
    blocks = [slice(start, start + ONLINE_BLOCK) for start in range(0, vocab, ONLINE_BLOCK)]
    needs_ref = bool({"kl", "ref_logp"} & set(names))
    m = logits.new_full((rows,), _NO_MAX, dtype=stats_dtype)
    s, a, c = (torch.zeros_like(m) for _ in range(3))
    ref_m, ref_s = m.clone(), torch.zeros_like(m)
    for block in blocks:
        z = logits[:, block].to(stats_dtype)
        m_new = torch.maximum(m, z.amax(1))
        alpha = torch.exp(m - m_new)
        e = torch.exp(z - m_new[:, None])
        a = alpha * (a + s * (m - m_new)) + (e * (z - m_new[:, None])).sum(1)
        s, m = alpha * s + e.sum(1), m_new
        if needs_ref:
            z_ref = ref_logits[:, block].to(stats_dtype)
            c = alpha * c + (e * (z - z_ref)).sum(1)
            ref_m_new = torch.maximum(ref_m, z_ref.amax(1))
            ref_s = torch.exp(ref_m - ref_m_new) * ref_s + torch.exp(z_ref - ref_m_new[:, None]).sum(1)
            ref_m = ref_m_new
    lse = m + torch.log(s)
    out = {"logp": logits.gather(1, targets[:, None]).squeeze(1).to(stats_dtype) - lse,
           "entropy": torch.log(s) - a / s}
    if needs_ref:
        ref_lse = ref_m + torch.log(ref_s)
        out["ref_logp"] = ref_logits.gather(1, targets[:, None]).squeeze(1).to(stats_dtype) - ref_lse
    if "kl" in names:
        mean_gap = c / s
        excess, peak = torch.zeros_like(m), torch.full_like(m, _NO_MAX)
        for block in blocks:
            z = logits[:, block].to(stats_dtype)
            centred = mean_gap[:, None] - (z - ref_logits[:, block].to(stats_dtype))
            peak = torch.maximum(peak, centred.amax(1))
            excess = excess + (torch.exp(z - lse[:, None]) * _expm1_minus_identity(centred)).sum(1)
        out["kl"] = torch.where(peak > EXPM1_LIMIT, mean_gap - lse + ref_lse, torch.log1p(excess))
    return {name: out[name] for name in names}


def _expm1_minus_identity(y: Tensor) -> Tensor:
    """``e^y − 1 − y``, by its Taylor series up to ``y⁸`` where ``|y| < 0.1`` (truncation ≤ 6e-13 of the value):
    Inductor's vectorised CPU kernels compute ``expm1`` as ``exp − 1`` (pytorch/pytorch#189803, still in torch
    2.13), which near 0 leaves ``expm1(y) − y`` no correct digit (at ``y = 1e-5``: 1.4e-8 for 5e-11)."""
    series = y * (1 / 40320)
    for coefficient in (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2):
        series = y * (series + coefficient)
    return torch.where(y.abs() < 0.1, y * series, torch.expm1(y) - y)


@functools.cache
def compiled_online_chunk_statistics() -> Callable[..., dict[str, Tensor]]:
    """:func:`online_chunk_statistics` under ``torch.compile`` (static shapes, as :func:`compiled_chunk_statistics`):
    each block's max and sums one fused kernel."""
    return torch.compile(online_chunk_statistics, dynamic=False, fullgraph=True)


def _chunked_stats(loss: TokenLossLike, hidden_nd: Tensor, weight: Tensor, targets: Tensor, chunk_size: int,
                   ref_nd: Tensor | None, ref_w: Tensor | None, old_nd: Tensor | None,
                   old_w: Tensor | None, compile_statistics: bool, online_statistics: bool,
                   kept_chunks: int = 0) -> tuple[dict[str, Tensor], _KeptLogits]:
    """Pass A: ``loss.stats`` for every row, chunk by chunk, without a graph; fp32 unless the loss asks for the
    compute dtype. The head weights come already cast to the compute dtype. The chunks run last to first (each
    row's statistics do not depend on the order), so the logits of the first ``kept_chunks`` chunks are the last
    computed and are returned for pass B (nothing when the loss names no statistics). Compiled, a short chunk is
    padded with zero rows to ``chunk_size`` (:func:`compiled_chunk_statistics`) and their statistics dropped. With
    ``online_statistics`` a loss whose statistics are all :data:`ONLINE_TERMS` takes
    :func:`online_chunk_statistics` (compiled or not)."""
    kept = _KeptLogits()
    names = tuple(name for name in loss.stats if name not in DATA_TERMS)
    if not names:
        return {}, kept
    stats_dtype = weight.dtype if loss.stats_in_model_dtype else torch.float32
    if online_statistics and ONLINE_TERMS.issuperset(names):
        statistics = compiled_online_chunk_statistics() if compile_statistics else online_chunk_statistics
    else:
        statistics = compiled_chunk_statistics() if compile_statistics else chunk_statistics
    needs_ref = bool(REFERENCE_TERMS & set(names))
    needs_old = bool(OLD_POLICY_TERMS & set(names))
    starts = range(0, hidden_nd.shape[0], chunk_size)
    parts: dict[str, list[Tensor]] = {name: [] for name in names}
    with torch.autocast(hidden_nd.device.type, enabled=False):
        for start in reversed(starts):
            chunk = slice(start, start + chunk_size)
            rows = min(chunk_size, hidden_nd.shape[0] - start)
            shape = chunk_size if compile_statistics else rows
            logits = _head_logits(_pad_rows(hidden_nd[chunk], shape), weight)
            ref_logits = _head_logits(_pad_rows(ref_nd[chunk], shape), ref_w) if needs_ref else None
            values = statistics(logits, _pad_rows(targets[chunk], shape), names, stats_dtype, ref_logits=ref_logits,
                                old_logits=_head_logits(_pad_rows(old_nd[chunk], shape), old_w) if needs_old else None,
                                **loss.term_options)
            for name in names:
                parts[name].append(values[name][:rows].float())
            if start < kept_chunks * chunk_size:
                kept.policy[start] = logits[:rows]
                if ref_logits is not None:
                    kept.reference[start] = ref_logits[:rows]
    empty = hidden_nd.new_zeros(0, dtype=torch.float32)
    return {name: torch.cat(chunks[::-1]) if chunks else empty for name, chunks in parts.items()}, kept


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    """``tensor`` with zero rows appended up to ``rows`` (itself when it has them)."""
    missing = rows - tensor.shape[0]
    return tensor if missing == 0 else torch.cat([tensor, tensor.new_zeros(missing, *tensor.shape[1:])])


@dataclass
class _HeadPlan:
    """Everything pass B needs besides the two differentiable inputs."""

    coefs: dict[str, Tensor]
    targets: Tensor
    chunk_size: int
    compute_dtype: torch.dtype
    kept_logits: _KeptLogits
    ref_hidden: Tensor | None
    ref_head_weight: Tensor | None
    old_logp: Tensor | None
    term_options: Mapping[str, Any]
    target_logp: Tensor
    """``[N]`` fp32, filled chunk by chunk: each row's detached ``log p_y`` (for ``TokenLoss.head_metrics``)."""
    statistics: Mapping[str, Tensor] = field(default_factory=dict)
    """Pass A's fp32 ``entropy`` and ``kl`` of every row (:data:`REUSED_TERMS`): their values and the constants of
    their closed-form gradients, instead of a row sum over each chunk's vocabulary; a term missing here is summed."""
    compiled: bool = False
    """Each chunk's objective and gradient through :func:`compiled_chunk_objective_and_grad` (``sft.compile_pass_b``),
    the chunk padded to ``chunk_size`` rows with zero coefficients."""

    def policy_logits(self, chunk: slice, hidden_cd: Tensor, weight_cd: Tensor) -> Tensor:
        """fp32 ``hidden_cd @ weight_cdᵀ`` of one chunk; for a kept chunk, pass A's product of the same operands
        (released here)."""
        logits = self.kept_logits.policy.pop(chunk.start, None)
        if logits is None:
            logits = hidden_cd @ weight_cd.T
        return logits.float()

    def chunk_value_and_grad(self, logits_cv: Tensor, chunk: slice, need_grad: bool) -> tuple[Tensor, Tensor | None]:
        """:func:`chunk_objective_and_grad` of the rows ``chunk`` from their fp32 logits (overwritten in place), this
        plan's coefficients and pass A's statistics of those rows, and the reference's logits of the rows that need
        them: for a kept chunk pass A's (released here), else its final hidden states and head. Records each row's
        ``log p_y`` in :attr:`target_logp`."""
        rows = logits_cv.shape[0]
        shape = self.chunk_size if self.compiled else rows

        def rows_of(values: Tensor | None) -> Tensor | None:
            return None if values is None else _pad_rows(values[chunk], shape)

        ref_logits, ref_hidden = self.kept_logits.reference.pop(chunk.start, None), None
        if ref_logits is not None:
            ref_logits = _pad_rows(ref_logits, shape)
        elif self.ref_hidden is not None:
            ref_hidden = rows_of(self.ref_hidden)
        objective = compiled_chunk_objective_and_grad() if self.compiled else chunk_objective_and_grad
        value, grad, logp_y = objective(
            _pad_rows(logits_cv, shape), rows_of(self.targets), {name: rows_of(c) for name, c in self.coefs.items()},
            need_grad, statistics={name: rows_of(values) for name, values in self.statistics.items()},
            old_logp=rows_of(self.old_logp), term_options=self.term_options, ref_logits=ref_logits,
            ref_hidden=ref_hidden, ref_head_weight=self.ref_head_weight)
        self.target_logp[chunk] = logp_y[:rows]
        return value, None if grad is None else grad[:rows]


def chunk_objective_and_grad(logits_cv: Tensor, targets: Tensor, coefs: Mapping[str, Tensor], need_grad: bool, *,
                             statistics: Mapping[str, Tensor], old_logp: Tensor | None,
                             term_options: Mapping[str, Any], ref_logits: Tensor | None = None,
                             ref_hidden: Tensor | None = None,
                             ref_head_weight: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
    """``Σ_rows Σ_terms coef · term`` of one chunk of fp32 logits ``[C, V]`` (overwritten in place), its logit
    gradient from the closed forms (module docstring, built in the logits' own buffer) if ``need_grad``, and each
    row's detached ``log p_y``.

    Per row the gradient is ``p ⊙ (α + β log p) + γ e_y`` plus the GEM and reference-term parts. ``statistics``:
    pass A's fp32 :data:`REUSED_TERMS` of these rows, taken instead of a row sum over the vocabulary. Reference
    logits are formed only for the rows with a non-zero reference-term coefficient: those rows of ``ref_logits
    [C, V]`` (pass A's), else ``ref_hidden [C, d] @ ref_head_weightᵀ`` of those rows.
    """
    unknown = set(coefs) - OBJECTIVE_TERMS
    if unknown:
        raise ValueError(f"terms {sorted(unknown)} cannot be optimised; objective terms: {sorted(OBJECTIVE_TERMS)}")
    targets = targets.unsqueeze(1)
    value = logits_cv.new_zeros(())
    gem_weights = None
    if "gem" in coefs:
        gem_weights = torch.softmax(logits_cv / term_options["gem_beta"], dim=-1)
        if term_options["gem_weighting"] == "logsigmoid":
            gem_weights.mul_(torch.sigmoid(0.01 * (logits_cv - logits_cv.gather(1, targets))))
    logp = logits_cv.sub_(torch.logsumexp(logits_cv, dim=-1, keepdim=True))
    probs = logp.exp()
    logp_y = logp.gather(1, targets).squeeze(1)
    alpha, beta, gamma = (torch.zeros_like(logp_y) for _ in range(3))
    if "logp" in coefs:  # ∂ log p_y = e_y − p
        value = value + (coefs["logp"] * logp_y).sum()
        alpha -= coefs["logp"]
        gamma += coefs["logp"]
    if "prob_logp" in coefs:  # ∂ sg(p_y) log p_y = p_y (e_y − p)
        prob_y = logp_y.exp()
        value = value + (coefs["prob_logp"] * prob_y * logp_y).sum()
        slope = coefs["prob_logp"] * prob_y
        alpha -= slope
        gamma += slope
    if "de" in coefs:  # ∂(p_y − ½)² = 2 (p_y − ½) p_y (e_y − p)
        prob_y = logp_y.exp()
        value = value + (coefs["de"] * (prob_y - 0.5) ** 2).sum()
        slope = coefs["de"] * 2.0 * (prob_y - 0.5) * prob_y
        alpha -= slope
        gamma += slope
    if "ratio" in coefs:  # ∂ r = r (e_y − p) inside the clamp, 0 outside
        log_ratio = logp_y - old_logp
        ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
        value = value + (coefs["ratio"] * ratio).sum()
        slope = coefs["ratio"] * ratio * ((log_ratio >= -20.0) & (log_ratio <= 20.0))
        alpha -= slope
        gamma += slope
    if "entropy" in coefs:  # ∂H = −p (log p + H)
        entropy = statistics["entropy"] if "entropy" in statistics else -_rowdot(probs, logp)
        value = value + (coefs["entropy"] * entropy).sum()
        alpha -= coefs["entropy"] * entropy
        beta -= coefs["entropy"]
    if gem_weights is not None:  # ∂ = g w − Σ(g w) e_y
        mass = gem_weights.sum(-1)
        value = value + (coefs["gem"] * (_rowdot(gem_weights, logp) - mass * logp_y)).sum()
        gamma -= coefs["gem"] * mass
    active, ref_value, ref_grad = _reference_part(coefs, logp, probs, need_grad, statistics, ref_logits, ref_hidden,
                                                  ref_head_weight)
    value = value + ref_value
    if not need_grad:
        return value, None, logp_y
    grad = logp.mul_(beta.unsqueeze(1)).add_(alpha.unsqueeze(1)).mul_(probs)
    del probs
    grad.scatter_add_(1, targets, gamma.unsqueeze(1))
    if gem_weights is not None:
        grad.add_(gem_weights.mul_(coefs["gem"].unsqueeze(1)))
    if ref_grad is not None:
        grad.index_add_(0, active, ref_grad)
    return value, grad, logp_y


@functools.cache
def compiled_chunk_objective_and_grad() -> Callable[..., tuple[Tensor, Tensor | None, Tensor]]:
    """:func:`chunk_objective_and_grad` under ``torch.compile``: its elementwise passes over the chunk fuse (on one
    H200 the trainer's pass B of a 1,024 × 151,936 EKSFT chunk took 2.8 ms compiled against 5.9 eager:
    docs/results/2026-11-28-gpu-checks-h200.md). The chunk's shape is static (a short last chunk comes padded); the
    graph breaks at the ``nonzero`` of the reference rows, whose count Dynamo makes symbolic at its second value
    instead of compiling once per count."""
    return torch.compile(chunk_objective_and_grad)


def _reference_part(coefs: Mapping[str, Tensor], logp: Tensor, probs: Tensor, need_grad: bool,
                    statistics: Mapping[str, Tensor], ref_logits: Tensor | None, ref_hidden: Tensor | None,
                    ref_head_weight: Tensor | None) -> tuple[Tensor | None, Tensor, Tensor | None]:
    """(active rows, value, logit gradient of the active rows) of the reference terms of one chunk."""
    ref_names = [name for name in coefs if name in REFERENCE_TERMS]
    value = logp.new_zeros(())
    if not ref_names:
        return None, value, None
    active = reference_rows(coefs)
    if not active.numel():
        return None, value, None
    if ref_logits is not None:
        ref_logits = ref_logits.index_select(0, active).float()
    else:
        ref_logits = _head_logits(ref_hidden.index_select(0, active), ref_head_weight).float()
    logq = ref_logits.sub_(torch.logsumexp(ref_logits, dim=-1, keepdim=True))
    probs_a, logp_a = probs.index_select(0, active), logp.index_select(0, active)
    grad = torch.zeros_like(probs_a) if need_grad else None
    for name in ref_names:
        coef = coefs[name].index_select(0, active)
        if name == "kl":  # ∂KL = p (log p − log q − KL); the difference first: exactly 0 when p = q
            diff = logp_a - logq
            if "kl" in statistics:
                kl = statistics["kl"].index_select(0, active)
            else:
                plain = _rowdot(probs_a, diff)
                kl = _accurate_kl(probs_a, diff, plain, plain)
            value = value + (coef * kl).sum()
            part = diff.sub_(kl.unsqueeze(1)).mul_(probs_a) if need_grad else None
        elif name == "code_kl":  # ∂ Σp(p − log q) = p (2p − 2Σp² − log q + Σ p log q)
            collision, cross = _rowdot(probs_a, probs_a), _rowdot(probs_a, logq)
            value = value + (coef * (collision - cross)).sum()
            part = (2.0 * probs_a - logq).add_((cross - 2.0 * collision).unsqueeze(1)).mul_(probs_a) \
                if need_grad else None
        else:  # forward_kl: ∂ Σ q (log q − log p) = p − q
            ref_probs = logq.exp()
            gap = logq - logp_a
            mean_gap = _rowdot(ref_probs, gap)
            value = value + (coef * _accurate_kl(ref_probs, gap, mean_gap, mean_gap)).sum()
            del gap
            part = (probs_a - ref_probs) if need_grad else None
        if part is not None:
            grad.add_(part.mul_(coef.unsqueeze(1)))
    return active, value, grad


def reference_rows(coefs: Mapping[str, Tensor]) -> Tensor:
    """Indices of the rows with a non-zero coefficient of some reference term (:data:`REFERENCE_TERMS`): the only
    rows pass B builds reference logits for."""
    return torch.stack([coefs[name] != 0 for name in coefs if name in REFERENCE_TERMS]).any(0).nonzero().squeeze(1)


class _ChunkedHeadObjective(torch.autograd.Function):
    """Pass B. Forward: per chunk, logits → objective and its closed-form logit gradient ``dz`` →
    ``grad_hidden[chunk] = dz @ W`` and ``grad_W += dzᵀ h``; backward scales the stored gradients by the
    incoming scalar (in place: call backward once per forward).

    ``grad_W`` is summed over the chunks in at least fp32 and cast to the weight's dtype on return: under FSDP2
    mixed precision the head weight is bf16, and a bf16 running sum of ~80 chunk products (one 20k-token row at
    chunk 256) loses several times the error of the single bf16 GEMM plain autograd would do."""

    @staticmethod
    def forward(ctx, hidden_nd: Tensor, weight: Tensor, plan: _HeadPlan) -> Tensor:
        need_hidden_grad, need_weight_grad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        compute_dtype = plan.compute_dtype
        weight_cd = weight.detach().to(compute_dtype)
        grad_hidden = torch.zeros_like(hidden_nd) if need_hidden_grad else None
        grad_weight = torch.zeros_like(weight, dtype=torch.promote_types(weight.dtype, torch.float32)) \
            if need_weight_grad else None
        ctx.weight_dtype = weight.dtype
        total = hidden_nd.new_zeros((), dtype=torch.float32)
        with torch.autocast(hidden_nd.device.type, enabled=False):
            for start in range(0, hidden_nd.shape[0], plan.chunk_size):
                chunk = slice(start, start + plan.chunk_size)
                hidden_cd = hidden_nd[chunk].detach().to(compute_dtype)
                value, grad_logits = plan.chunk_value_and_grad(plan.policy_logits(chunk, hidden_cd, weight_cd), chunk,
                                                               need_hidden_grad or need_weight_grad)
                total = total + value
                if grad_logits is not None:
                    grad_logits = grad_logits.to(compute_dtype)
                    if grad_hidden is not None:
                        grad_hidden[chunk] = (grad_logits @ weight_cd).to(grad_hidden.dtype)
                    if grad_weight is not None and grad_weight.dtype == compute_dtype:
                        grad_weight.addmm_(grad_logits.T, hidden_cd)
                    elif grad_weight is not None:  # bf16 compute (autocast or bf16 weights): sum in fp32
                        grad_weight.add_(grad_logits.T @ hidden_cd)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden.mul_(grad_output.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_output.to(grad_weight.dtype)).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None


# ------------------------------------------------------------------------------------------ shared helpers


def data_terms(loss: TokenLossLike, rows: PredictionRows, behaviour_logp: Tensor | None) -> dict[str, Tensor]:
    """The :data:`DATA_TERMS` among ``loss.stats``, per prediction row: ``behaviour_logp`` of row (b, i) is
    ``behaviour_logp[b, i + 1]``, the log-probability of its target token ``labels[b, i + 1]`` under the policy
    that generated the row (0 on rows without a target). Raises ValueError when the loss reads it and the batch
    has none, or a supervised token has none (NaN)."""
    if "behaviour_logp" not in loss.stats:
        return {}
    if behaviour_logp is None:
        raise ValueError(f"token loss {loss.name!r} reads the behaviour policy's log-probabilities of the targets "
                         f"(tokens column {BEHAVIOUR_LOGP_COLUMN}); this batch has none")
    shifted = torch.full_like(behaviour_logp, math.nan, dtype=torch.float32)
    shifted[:, :-1] = behaviour_logp[:, 1:]
    values = shifted.flatten()[rows.index]
    if torch.isnan(values[rows.has_target]).any():
        raise ValueError(f"token loss {loss.name!r}: a supervised token has no behaviour log-probability (NaN in "
                         f"{BEHAVIOUR_LOGP_COLUMN})")
    return {"behaviour_logp": torch.where(rows.has_target, values, 0.0)}


def _token_stats(rows: PredictionRows, values: dict[str, Tensor], vocab_size: int) -> TokenStats:
    return TokenStats(values=values, targets=rows.targets, has_target=rows.has_target,
                      is_label_position=rows.is_label_position, sequence=rows.sequence,
                      num_sequences=rows.num_sequences, vocab_size=vocab_size)


def _with_head_metrics(loss: TokenLossLike, weights: TokenWeights, rows: PredictionRows, values: dict[str, Tensor],
                       target_logp: Tensor, vocab_size: int) -> TokenWeights:
    """``weights`` plus ``loss.head_metrics`` of the statistics with pass B's ``log p_y`` as ``logp`` where pass A
    did not compute it."""
    stats = _token_stats(rows, {"logp": target_logp, **values}, vocab_size)
    return TokenWeights(coefs=weights.coefs, constant=weights.constant,
                        metrics={**weights.metrics, **loss.head_metrics(stats)})


def _result(value: Tensor, rows: PredictionRows, weights: TokenWeights) -> LossResult:
    metrics = dict(weights.metrics)
    metrics["total"] = value.detach()
    num_tokens = rows.has_target.sum()
    metrics["num_tokens"] = num_tokens.detach().float()
    return LossResult(loss=value, num_tokens=num_tokens, metrics=metrics)


def _maybe_to(tensor: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    return None if tensor is None else tensor.to(dtype)


def _check_pair(name: str, tensor: Tensor, labels_name: str, labels: Tensor) -> None:
    if labels.dim() != 2 or tuple(tensor.shape[:2]) != tuple(labels.shape):
        raise ValueError(f"{name} {tuple(tensor.shape)} and {labels_name} {tuple(labels.shape)} must share "
                         "[batch, length]")


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


def _check_head(name: str, weight: Tensor | None, hidden: Tensor) -> None:
    if weight is None or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        shape = None if weight is None else tuple(weight.shape)
        raise ValueError(f"{name} must be [vocab, {hidden.shape[-1]}] to match its hidden states; got {shape}")


def _check_models(loss: TokenLossLike, policy: Tensor, ref: Tensor | None, old: Tensor | None,
                  ref_name: str, old_name: str) -> None:
    for needed, tensor, arg in ((loss.needs_reference, ref, ref_name), (loss.needs_old_policy, old, old_name)):
        if needed and tensor is None:
            raise ValueError(f"token loss {loss.name!r} needs {arg}")
        if tensor is not None and tuple(tensor.shape[:2]) != tuple(policy.shape[:2]):
            raise ValueError(f"{arg} {tuple(tensor.shape)} must share [batch, length] with the policy's "
                             f"{tuple(policy.shape)}")
