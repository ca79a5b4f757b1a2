"""Pass B of the loss head on one logits chunk: the trainer's hand-derived value and logit gradient against the
objective written once, term by term, and differentiated by autograd.

    python -m bench.pass_b_candidates                                # CPU: 256 rows x 32,768, one thread, CPU clock
    python -m bench.pass_b_candidates --device cuda --rows 1024 --vocab 151936 --hidden 2048

Pass B (``sft.token_stats._HeadPlan.chunk_value_and_grad``) forms ``Σ_rows Σ_terms coef · term`` of a chunk of fp32
logits and its logit gradient from closed forms derived by hand, one per term, in eager elementwise kernels. The
candidate here, :func:`chunk_objective`, writes each term once as the paper's equation (``log p_y``,
``H = −Σ p log p``, ``KL = Σ p (log p − log q)``, …) and leaves the gradient to autograd. For one chunk of
``--rows`` × ``--vocab`` with EKSFT's coefficients (the real ``sft.losses`` loss weighing the chunk's own pass-A
statistics: ``logp`` on the unmasked rows, ``entropy`` and ``kl`` on the top-ρ union M), the bench times:

* ``today``: the trainer's eager pass B, taking pass A's fp32 entropy and KL (``sft.online_statistics``, the paper
  profile); ``today, summed``: the same without them (each row's entropy and KL summed over the vocabulary again);
* ``today, compiled``: that same method as ``sft.compile_pass_b`` runs it in training
  (``sft.token_stats.compiled_chunk_objective_and_grad``). Its reference rows are the ``nonzero`` of the
  coefficients, a data-dependent shape: Dynamo breaks the graph there, and makes the count symbolic at its second
  value (one count here: static);
* ``once, eager``: :func:`objective_value_and_grad`, eager autograd;
* ``once, compiled``: :func:`chunk_objective` compiled (``fullgraph``, static shapes), then ``torch.autograd.grad``
  (AOTAutograd's forward and backward graphs, its default partitioner choosing what to save);
* ``once, recomputed``: the same with ``activation_memory_budget = 0``: only the inputs are saved for backward,
  which recomputes the log-softmax and everything after it;
* ``once, grad_and_value``: ``torch.func.grad_and_value(chunk_objective)`` compiled as one graph.

The "once" candidates take the masked rows the way the trainer does: their indices from the coefficients, eagerly,
and those rows of the reference logits, as inputs (so they too compile once per count of masked rows). Those rows'
policy logits are an input of their own and ``log p_y`` a masked row sum, so the backward is elementwise
(:func:`chunk_objective`; with ``gather`` and ``index_select`` on the whole chunk the compiled candidates were ~2×
slower and held 1–3 more chunks: docs/results/2026-11-27-pass-b-candidates-cpu.md).

Each call gets a fresh fp32 copy of the policy logits, made outside the clock (the trainer overwrites its fp32
logits in place: on a GPU the copy is the cast from bf16, on a CPU the matmul's own output). Printed per candidate:
median seconds (after one untimed call, which compiles; the candidates timed in rounds of one call each, so that a
shared machine's load weighs on all alike), the peak memory it allocates beyond its inputs (CUDA:
``torch.cuda.max_memory_allocated``; CPU: the allocation events of ``torch.profiler``, as
``bench.sft_memory_estimate`` counts them), and its largest deviation of value and gradient from
:func:`chunk_objective` in fp64 (autograd in fp64; the trainer's closed forms equal it:
tests/unit/test_pass_b_candidates.py).
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from bench.sft_memory_estimate import allocated_peak
from bench.statistics_pass import add_chunk_arguments, make_inputs
from sft.token_stats import REFERENCE_TERMS, reference_rows


def chunk_objective(logits: Tensor, active_logits: Tensor | None, targets: Tensor, coefs: dict[str, Tensor],
                    ref_logits: Tensor | None = None, active: Tensor | None = None, old_logp: Tensor | None = None, *,
                    gem_beta: float = 1.0, gem_weighting: str = "linear", **unused: Any) -> Tensor:
    """``Σ_rows Σ_terms coef · term`` of ``logits [C, V]``, each objective term (``sft.token_stats.OBJECTIVE_TERMS``)
    written once, with ``p = softmax(z)``, ``q = softmax(z')``:

    ``logp = log p_y``; ``prob_logp = sg(p_y) log p_y``; ``de = (p_y − ½)²``;
    ``ratio = exp(clamp(log p_y − old_logp, −20, 20))``; ``entropy = −Σ_v p_v log p_v``;
    ``gem = Σ_v g_v w_v (log p_v − log p_y)``, ``g = sg(softmax(z/β))``, ``w = 1`` or ``sg(σ(0.01 (z − z_y)))``;
    on the rows ``active`` only, from their policy logits ``active_logits [A, V]`` (``logits[active]`` as an input
    of its own, see below) and their reference logits ``ref_logits [A, V]``:
    ``kl = Σ_v p_v (log p_v − log q_v)``; ``code_kl = Σ_v p_v (p_v − log q_v)``;
    ``forward_kl = Σ_v q_v (log q_v − log p_v)``. ``coefs``: term → ``[C]``.

    Two choices keep the backward elementwise, so it fuses: ``log p_y`` is a masked row sum, not a ``gather`` (whose
    gradient scatters into a zeroed ``[C × V]`` buffer), and the masked rows' policy logits come as their own input
    (the gradient of ``index_select`` on ``[C × V]`` intermediates is an ``index_put`` into another zeroed buffer);
    their gradient is added to those rows' afterwards (:func:`objective_value_and_grad`)."""
    logp = _log_softmax(logits)
    probs = logp.exp()
    is_target = torch.arange(logits.shape[-1], device=logits.device) == targets.unsqueeze(1)
    logp_y = torch.where(is_target, logp, 0.0).sum(-1)
    terms: dict[str, Tensor] = {}
    if "logp" in coefs:
        terms["logp"] = logp_y
    if "prob_logp" in coefs:
        terms["prob_logp"] = logp_y.detach().exp() * logp_y
    if "de" in coefs:
        terms["de"] = (logp_y.exp() - 0.5) ** 2
    if "ratio" in coefs:
        terms["ratio"] = torch.exp(torch.clamp(logp_y - old_logp, -20.0, 20.0))
    if "entropy" in coefs:
        terms["entropy"] = -(probs * logp).sum(-1)
    if "gem" in coefs:
        detached = logits.detach()
        weights = torch.softmax(detached / gem_beta, dim=-1)
        if gem_weighting == "logsigmoid":
            weights = weights * torch.sigmoid(0.01 * (detached - detached.gather(1, targets.unsqueeze(1))))
        terms["gem"] = (weights * (logp - logp_y.unsqueeze(1))).sum(-1)
    value = sum(((coefs[name] * term).sum() for name, term in terms.items()), logits.new_zeros(()))
    if REFERENCE_TERMS & set(coefs):
        logp_a, logq = _log_softmax(active_logits), _log_softmax(ref_logits)
        probs_a = logp_a.exp()
        reference_terms = {"kl": lambda: (probs_a * (logp_a - logq)).sum(-1),
                           "code_kl": lambda: (probs_a * (probs_a - logq)).sum(-1),
                           "forward_kl": lambda: (logq.exp() * (logq - logp_a)).sum(-1)}
        for name in sorted(REFERENCE_TERMS & set(coefs)):
            value = value + (coefs[name].index_select(0, active) * reference_terms[name]()).sum()
    return value


def _log_softmax(logits: Tensor) -> Tensor:
    """``z − lse(z)`` (ATen's CPU ``log_softmax`` sums its exponentials less accurately: ~1e-5 off at 32k columns)."""
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def objective_value_and_grad(logits: Tensor, targets: Tensor, coefs: dict[str, Tensor],
                             ref_logits: Tensor | None = None, active: Tensor | None = None,
                             old_logp: Tensor | None = None, *,
                             objective: Callable[..., Tensor] = chunk_objective,
                             **options: Any) -> tuple[Tensor, Tensor]:
    """``objective`` (:func:`chunk_objective`, eager or compiled) of ``logits`` and its logit gradient by autograd:
    the gradient in ``logits`` plus, on the rows ``active``, the one in their own copy ``active_logits``."""
    logits = logits.detach().requires_grad_()
    active_logits = None if active is None else logits.detach().index_select(0, active).requires_grad_()
    value = objective(logits, active_logits, targets, coefs, ref_logits, active, old_logp, **options)
    grads = torch.autograd.grad(value, [logits] if active is None else [logits, active_logits], materialize_grads=True)
    return value.detach(), _with_active_rows(grads, active)


def _with_active_rows(grads: Sequence[Tensor], active: Tensor | None) -> Tensor:
    return grads[0] if active is None else grads[0].index_add_(0, active, grads[1])


@functools.cache
def compiled_objective() -> Callable[..., Tensor]:
    """:func:`chunk_objective` compiled as the trainer compiles pass A (static shapes, one graph)."""
    return torch.compile(chunk_objective, dynamic=False, fullgraph=True)


def compiled_objective_value_and_grad(logits: Tensor, *args: Any, **options: Any) -> tuple[Tensor, Tensor]:
    """:func:`objective_value_and_grad` through :func:`compiled_objective` (AOTAutograd's forward and backward)."""
    return objective_value_and_grad(logits, *args, objective=compiled_objective(), **options)


def _recomputed_objective(*args: Any, **options: Any) -> Tensor:
    return chunk_objective(*args, **options)  # its own code object: Dynamo caches compiled graphs per code object


@functools.cache
def _compiled_recomputed_objective() -> Callable[..., Tensor]:
    return torch.compile(_recomputed_objective, dynamic=False, fullgraph=True)


def recomputed_objective_value_and_grad(logits: Tensor, *args: Any, **options: Any) -> tuple[Tensor, Tensor]:
    """:func:`compiled_objective_value_and_grad` partitioned with ``activation_memory_budget = 0``: AOTAutograd saves
    only the inputs for backward and recomputes every ``[rows × vocab]`` intermediate there."""
    import torch._functorch.config

    with torch._functorch.config.patch(activation_memory_budget=0.0):  # read when the first call compiles
        return objective_value_and_grad(logits, *args, objective=_compiled_recomputed_objective(), **options)


@functools.cache
def _compiled_grad_and_value(argnums: tuple[int, ...]) -> Callable[..., tuple[tuple[Tensor, ...], Tensor]]:
    return torch.compile(torch.func.grad_and_value(chunk_objective, argnums=argnums), dynamic=False, fullgraph=True)


def grad_and_value(logits: Tensor, targets: Tensor, coefs: dict[str, Tensor], ref_logits: Tensor | None = None,
                   active: Tensor | None = None, old_logp: Tensor | None = None,
                   **options: Any) -> tuple[Tensor, Tensor]:
    """:func:`chunk_objective` of ``logits`` and its logit gradient (as :func:`objective_value_and_grad`),
    ``torch.func.grad_and_value`` compiled as one graph (static shapes)."""
    active_logits = None if active is None else logits.index_select(0, active)
    grads, value = _compiled_grad_and_value((0,) if active is None else (0, 1))(
        logits, active_logits, targets, coefs, ref_logits, active, old_logp, **options)
    return value, _with_active_rows(grads, active)


def written_once(logits: Tensor, targets: Tensor, coefs: dict[str, Tensor], ref_logits: Tensor | None = None,
                 old_logp: Tensor | None = None, *, differentiate: Callable[..., tuple[Tensor, Tensor]],
                 **term_options: Any) -> tuple[Tensor, Tensor]:
    """Value and logit gradient of :func:`chunk_objective` of fp32 ``logits [C, V]`` by ``differentiate``
    (:func:`objective_value_and_grad`, :func:`compiled_objective_value_and_grad` or :func:`grad_and_value`), given
    the whole chunk's reference logits (compute dtype) as pass A hands them over: only the rows with a reference-term
    coefficient are cast to the logits' dtype and used, as in the trainer."""
    active = ref_rows = None
    if REFERENCE_TERMS & set(coefs):
        active = reference_rows(coefs)
        ref_rows = ref_logits.index_select(0, active).to(logits.dtype)
    return differentiate(logits, targets, coefs, ref_rows, active, old_logp, **term_options)


def trainer_plan(coefs: dict[str, Tensor], targets: Tensor, ref_logits: Tensor | None = None,
                 old_logp: Tensor | None = None, statistics: dict[str, Tensor] | None = None, compiled: bool = False,
                 **term_options: Any):
    """The trainer's pass-B plan for one chunk of ``targets.numel()`` rows with the whole chunk's reference logits
    from pass A (``ref_logits``, compute dtype) and, with ``statistics``, pass A's fp32 entropy and KL; ``compiled``:
    ``sft.compile_pass_b``."""
    from sft.token_stats import _HeadPlan, _KeptLogits

    rows = targets.numel()
    return _HeadPlan(coefs=coefs, targets=targets, chunk_size=rows,
                     compute_dtype=torch.float32 if ref_logits is None else ref_logits.dtype,
                     kept_logits=_KeptLogits(reference={} if ref_logits is None else {0: ref_logits}),
                     ref_hidden=None, ref_head_weight=None, old_logp=old_logp, term_options=term_options,
                     target_logp=torch.zeros(rows, device=targets.device), statistics=statistics or {},
                     compiled=compiled)


def hand_derived(logits: Tensor, *args: Any, **options: Any) -> tuple[Tensor, Tensor]:
    """The trainer's pass B (``_HeadPlan.chunk_value_and_grad``) of fp32 ``logits`` (overwritten) with the plan of
    :func:`trainer_plan` (``*args``, ``**options``): value and logit gradient."""
    return _chunk_value_and_grad(trainer_plan(*args, **options), logits)


def _chunk_value_and_grad(plan, logits: Tensor) -> tuple[Tensor, Tensor]:
    return plan.chunk_value_and_grad(logits, slice(0, logits.shape[0]), True)


def compiled_hand_derived(logits: Tensor, *args: Any, **options: Any) -> tuple[Tensor, Tensor]:
    """:func:`hand_derived` as ``sft.compile_pass_b`` runs it (``sft.token_stats.compiled_chunk_objective_and_grad``:
    the chunk's shape static, a graph break at the ``nonzero`` of its reference rows)."""
    return _chunk_value_and_grad(trainer_plan(*args, compiled=True, **options), logits)


def peak_extra_bytes(function: Callable[[], Any], device: str) -> int:
    """Bytes ``function`` allocates at its peak beyond what was allocated before it (its result included): CUDA's
    allocator peak, or on a CPU the profiler's allocation events (``bench.sft_memory_estimate.allocated_peak``)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        function()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    return allocated_peak(function)


def timed_in_rounds(functions: dict[str, Callable[[Tensor], Any]], fresh: Callable[[], Tensor], repeats: int, clock,
                    synchronize) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
    """Median seconds of ``repeats`` calls ``function(fresh())`` of each function (``fresh()`` made outside the
    clock), in rounds of one call of each, so that a shared machine's load changes weigh on all alike; after one
    untimed call of each (which compiles). Returns the medians, each one's last result, and the error of each
    function that failed to run."""
    results, failed = {}, {}
    for name, function in functions.items():
        try:
            results[name] = function(fresh())
        except Exception as error:  # a candidate that fails to build here leaves the others' figures
            failed[name] = f"{type(error).__name__}: {error}"
    times: dict[str, list[float]] = {name: [] for name in results}
    for _ in range(repeats):
        for name in times:
            logits = fresh()
            synchronize()
            started = clock()
            results[name] = functions[name](logits)
            synchronize()
            times[name].append(clock() - started)
    return {name: statistics.median(values) for name, values in times.items()}, results, failed


@dataclass
class EKSFTChunk:
    """One chunk as pass B gets it: compute-dtype policy and reference logits ``[C, V]`` (pass A's products), the
    targets, pass A's fp32 statistics, and EKSFT's coefficients from the real loss weighing them."""

    logits: Tensor
    ref_logits: Tensor
    targets: Tensor
    statistics: dict[str, Tensor]
    coefs: dict[str, Tensor]
    term_options: dict[str, Any]


def eksft_chunk(rows: int, vocab: int, hidden: int, device: str = "cpu") -> EKSFTChunk:
    """The chunk of ``bench.statistics_pass.make_inputs`` (bf16 head matmuls on CUDA, fp32 on a CPU), every row
    supervised, weighed by ``sft/method=eksft`` (``logp`` on T∖M, ``entropy`` and ``kl`` on the top-ρ union M)."""
    from common.config import compose
    from sft.losses import build_loss
    from sft.token_stats import TokenStats, online_chunk_statistics

    loss = build_loss(compose(["sft/method=eksft"]).sft.method)
    inputs = make_inputs(rows, vocab, hidden, torch.bfloat16 if device == "cuda" else torch.float32, device)
    targets = inputs["targets"]
    with torch.no_grad():
        logits = inputs["hidden"] @ inputs["weight"].T
        ref_logits = inputs["ref_hidden"] @ inputs["ref_weight"].T
        values = online_chunk_statistics(logits, targets, loss.stats, torch.float32, ref_logits=ref_logits)
    every_row = torch.ones_like(targets, dtype=torch.bool)
    stats = TokenStats(values=values, targets=targets, has_target=every_row, is_label_position=every_row,
                       sequence=torch.zeros_like(targets), num_sequences=1, vocab_size=vocab)
    return EKSFTChunk(logits=logits, ref_logits=ref_logits, targets=targets, statistics=values,
                      coefs=loss.weigh(stats).coefs, term_options=dict(loss.term_options))


def candidates(chunk: EKSFTChunk) -> dict[str, Callable[[Tensor], tuple[Tensor, Tensor]]]:
    """Name → pass B of ``chunk`` as a function of fresh fp32 policy logits, returning value and logit gradient."""
    from sft.token_stats import REUSED_TERMS

    coefs, targets = chunk.coefs, chunk.targets
    frozen = {"ref_logits": chunk.ref_logits, **chunk.term_options}
    reused = {"statistics": {name: chunk.statistics[name] for name in REUSED_TERMS}}

    def once(differentiate):
        return lambda z: written_once(z, targets, coefs, differentiate=differentiate, **frozen)

    return {
        "today": lambda z: hand_derived(z, coefs, targets, **frozen, **reused),
        "today, summed": lambda z: hand_derived(z, coefs, targets, **frozen),
        "today, compiled": lambda z: compiled_hand_derived(z, coefs, targets, **frozen, **reused),
        "once, eager": once(objective_value_and_grad),
        "once, compiled": once(compiled_objective_value_and_grad),
        "once, recomputed": once(recomputed_objective_value_and_grad),
        "once, grad_and_value": once(grad_and_value),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_chunk_arguments(parser, repeats=7)
    args = parser.parse_args(argv)

    from common.tracking import configure_cpu_threads

    configure_cpu_threads(args.threads)
    cuda = args.device == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    chunk = eksft_chunk(args.rows, args.vocab, args.hidden, args.device)
    logits, active = chunk.logits, reference_rows(chunk.coefs)
    fresh = lambda: logits.to(torch.float32, copy=True)  # noqa: E731
    exact_value, exact_grad = written_once(logits.double(), chunk.targets, chunk.coefs, chunk.ref_logits.double(),
                                           differentiate=objective_value_and_grad, **chunk.term_options)
    passes = candidates(chunk)
    seconds, results, failed = timed_in_rounds(passes, fresh, args.repeats, clock, synchronize)
    value_error = {name: (value.double() - exact_value).abs().item() for name, (value, _) in results.items()}
    grad_error = {name: ((grad.double() - exact_grad).abs().max() / exact_grad.abs().max()).item()
                  for name, (_, grad) in results.items()}
    del results
    peak = {}
    for name in seconds:
        fresh_logits = fresh()
        peak[name] = peak_extra_bytes(lambda: passes[name](fresh_logits), args.device)

    print(f"device {args.device}, EKSFT pass B, chunk {args.rows} x {args.vocab} ({active.numel()} masked rows with "
          f"reference terms), hidden {args.hidden}, {args.repeats} rounds (median), "
          f"{'wall' if cuda else 'CPU'} clock, {args.threads} thread(s)")
    chunk_mib = args.rows * args.vocab * 4 / 2 ** 20
    print(f"  (one fp32 chunk of logits: {chunk_mib:.1f} MiB; deviations from chunk_objective in fp64: value absolute, "
          "gradient relative to its largest entry)")
    for name in seconds:
        print(f"  {name:21s} {1e3 * seconds[name]:9.3f} ms   peak extra {peak[name] / 2 ** 20:8.1f} MiB "
              f"({peak[name] / 2 ** 20 / chunk_mib:4.2f} chunks)   |value - fp64| {value_error[name]:.2e}   "
              f"|grad - fp64| {grad_error[name]:.2e}")
    for name, error in failed.items():
        print(f"  {name:21s} FAILED: {error[:1000]}")
    best = min((name for name in seconds if name.startswith("once")), key=seconds.get, default=None)
    if "today" in seconds and best is not None:
        print(f"pass B speed-up (today / fastest written-once candidate, {best}): "
              f"{seconds['today'] / seconds[best]:.2f}x")
    return {"seconds": seconds, "peak_bytes": peak, "value_error": value_error, "grad_error": grad_error,
            "failed": failed, "masked_rows": active.numel()}


if __name__ == "__main__":
    main()
