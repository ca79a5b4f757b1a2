"""Statistics passes for EKSFT's ``logp``, ``entropy`` and ``kl`` that the trainer does not run, timed by
``bench.statistics_pass`` beside its eager, compiled and online passes (``sft.token_stats``):

* :func:`compiled_unsplit_statistics`: the trainer's ``row_terms`` pass compiled with Inductor's
  ``split_reductions`` off (one program per row reduction, not partial sums over slices of a row and a second
  kernel to combine them);
* :func:`triton_statistics`: ``sft.token_stats.online_chunk_statistics``'s recurrence as one Triton program per
  row, which streams its policy and reference logits once for ``lse``, ``lse'``, the entropy and the mean gap
  ``μ``, and once more for the accurate KL: the floor a hand-written kernel reaches (CUDA; on a CPU only under
  ``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

NAMES = ("logp", "entropy", "kl")
"""The statistics the candidates compute (EKSFT's ``TokenLoss.stats``)."""


@functools.cache
def compiled_unsplit_statistics():
    """``sft.token_stats.chunk_statistics`` compiled as the trainer compiles it, with ``split_reductions`` off."""
    from sft.token_stats import chunk_statistics

    return torch.compile(chunk_statistics, dynamic=False, fullgraph=True, options={"split_reductions": False})


@functools.cache
def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def online_statistics(z_ptr, ref_ptr, targets_ptr, out_ptr, vocab, z_stride, ref_stride, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        rows = tl.num_programs(0)
        z_row = z_ptr + row * z_stride
        ref_row = ref_ptr + row * ref_stride
        m = tl.full([], -1e30, tl.float32)
        ref_m = tl.full([], -1e30, tl.float32)
        s = tl.zeros([], tl.float32)
        a = tl.zeros([], tl.float32)
        c = tl.zeros([], tl.float32)
        ref_s = tl.zeros([], tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            z = tl.load(z_row + cols, mask=inside, other=-1e30).to(tl.float32)
            z_ref = tl.load(ref_row + cols, mask=inside, other=-1e30).to(tl.float32)
            m_new = tl.maximum(m, tl.max(z, 0))
            alpha = tl.exp(m - m_new)
            e = tl.where(inside, tl.exp(z - m_new), 0.0)
            a = alpha * (a + s * (m - m_new)) + tl.sum(e * tl.where(inside, z - m_new, 0.0), 0)
            c = alpha * c + tl.sum(e * tl.where(inside, z - z_ref, 0.0), 0)
            s = alpha * s + tl.sum(e, 0)
            m = m_new
            ref_m_new = tl.maximum(ref_m, tl.max(z_ref, 0))
            ref_s = tl.exp(ref_m - ref_m_new) * ref_s + tl.sum(tl.where(inside, tl.exp(z_ref - ref_m_new), 0.0), 0)
            ref_m = ref_m_new
        lse = m + tl.log(s)
        ref_lse = ref_m + tl.log(ref_s)
        mean_gap = c / s
        excess = tl.zeros([], tl.float32)
        peak = tl.full([], -1e30, tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            z = tl.load(z_row + cols, mask=inside, other=0.0).to(tl.float32)
            z_ref = tl.load(ref_row + cols, mask=inside, other=0.0).to(tl.float32)
            centred = mean_gap - (z - z_ref)
            peak = tl.maximum(peak, tl.max(tl.where(inside, centred, -1e30), 0))
            # expm1(y) - y and log1p by their series near 0 (libdevice's have no CPU interpreter)
            small = tl.abs(centred) < 0.1
            series = centred * centred * (0.5 + centred * (1 / 6 + centred * (1 / 24 + centred / 120)))
            excess += tl.sum(tl.where(inside, tl.exp(z - lse) * tl.where(small, series, tl.exp(centred) - 1.0
                                                                            - centred), 0.0), 0)
        target_logit = tl.load(z_row + tl.load(targets_ptr + row)).to(tl.float32)
        tl.store(out_ptr + row, target_logit - lse)
        tl.store(out_ptr + rows + row, tl.log(s) - a / s)
        log1p = tl.where(excess < 1e-3, excess * (1.0 - excess * (0.5 - excess / 3.0)), tl.log(1.0 + excess))
        kl = tl.where(peak > 80.0, mean_gap - lse + ref_lse, log1p)
        tl.store(out_ptr + 2 * rows + row, kl)

    return online_statistics


def triton_statistics(logits: Tensor, ref_logits: Tensor, targets: Tensor, block: int = 4096,
                      num_warps: int = 8) -> dict[str, Tensor]:
    """EKSFT's statistics of ``logits [C, V]`` against ``ref_logits [C, V]`` (rows contiguous, any float dtype,
    computed in fp32) by one Triton program per row, ``block`` columns a step; fp32 ``[C]`` each."""
    if logits.stride(1) != 1 or ref_logits.stride(1) != 1:
        raise ValueError("triton_statistics needs logits with contiguous rows")
    rows, vocab = logits.shape
    out = torch.empty(3, rows, dtype=torch.float32, device=logits.device)
    _triton_kernel()[(rows,)](logits, ref_logits, targets, out, vocab, logits.stride(0), ref_logits.stride(0),
                              BLOCK=block, num_warps=num_warps)
    return dict(zip(NAMES, out.unbind(0)))
