"""Loss-head peak memory, dense vs chunked: EKSFT with its reference model at Qwen3-4B head size.

    python -m bench.loss_head_memory                   # CPU: hidden 2560, vocab 151,936, 4,096 tokens, bf16
    python -m bench.loss_head_memory --device cuda
    python -m bench.loss_head_memory --tokens 1024     # smaller, for a busy machine

Each variant runs forward + backward of the loss head only (policy hidden states and head weight with grad, the
reference's hidden states and head weight frozen) in its own subprocess, so one variant's freed memory cannot
hide the other's peak. Peak = bytes above what was allocated before the loss head ran (inputs and weights):
on CUDA ``torch.cuda.max_memory_allocated``; on CPU the process's peak resident set (``ru_maxrss``) minus its
resident set before the run (torch's CPU allocator returns large blocks to the OS, so RSS tracks live tensors).
Both variants also produce the gradients of the hidden states and of the head weight (``grad bytes``), which any
implementation must hold; ``transient`` is the peak without them. The ratios printed come from this one run.

dense:   logits = h @ Wᵀ and the reference's logits in full, then ``sft.token_stats.dense_loss`` (the reference API).
chunked: ``sft.token_stats.chunked_loss`` with ``--chunk-size`` rows per chunk.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

GIB = 1024**3


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure(args: argparse.Namespace) -> dict:
    import torch

    from common.config.sft import EKSFTMethod
    from sft.losses import build_loss
    from sft.token_stats import chunked_loss, dense_loss

    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype).mul_(scale)

    hidden = randn(1, args.tokens, args.hidden).requires_grad_()
    weight = randn(args.vocab, args.hidden, scale=args.hidden**-0.5).requires_grad_()
    ref_hidden = randn(1, args.tokens, args.hidden).mul_(0.1).add_(hidden.detach())
    ref_weight = randn(args.vocab, args.hidden, scale=0.1 * args.hidden**-0.5).add_(weight.detach())
    labels = torch.randint(0, args.vocab, (1, args.tokens), generator=generator, device=device)
    labels[:, :16] = -100  # a prompt
    loss = build_loss(EKSFTMethod())

    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = _rss_bytes()
        if resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 > before + 64 * 1024**2:
            raise RuntimeError("setup left a resident peak above the baseline; the CPU measurement would be wrong")
    start = time.perf_counter()
    if args.variant == "dense":
        logits = hidden @ weight.T
        with torch.no_grad():
            ref_logits = ref_hidden @ ref_weight.T
        result = dense_loss(loss, logits, labels, ref_logits=ref_logits)
    else:
        result = chunked_loss(loss, hidden, weight, labels, chunk_size=args.chunk_size, ref_hidden=ref_hidden,
                              ref_head_weight=ref_weight)
    result.loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    grad_bytes = sum(t.grad.numel() * t.grad.element_size() for t in (hidden, weight))
    return {"variant": args.variant, "peak_bytes": peak, "grad_bytes": grad_bytes, "seconds": time.perf_counter() - start,
            "loss": result.loss.item(), "num_M": result.metrics["num_M"].item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=2560)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--variant", choices=("dense", "chunked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(_measure(args)))
        return

    print(f"EKSFT loss head with reference: {args.tokens} tokens, hidden {args.hidden}, vocab {args.vocab}, "
          f"{args.dtype}, device {args.device}, chunk {args.chunk_size}", flush=True)
    results = {}
    for variant in ("dense", "chunked"):
        command = [sys.executable, "-m", "bench.loss_head_memory", "--variant", variant] + sys.argv[1:]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
        r = results[variant]
        print(f"{variant:>8}: peak {r['peak_bytes'] / GIB:6.2f} GiB (transient {(r['peak_bytes'] - r['grad_bytes']) / GIB:6.2f}"
              f" GiB + grads {r['grad_bytes'] / GIB:.2f} GiB), {r['seconds']:.1f} s, loss {r['loss']:.5f}, "
              f"|M| {r['num_M']:.0f}", flush=True)
    dense, chunked = results["dense"], results["chunked"]
    print(f"peak ratio dense/chunked: {dense['peak_bytes'] / chunked['peak_bytes']:.1f}x; transient ratio: "
          f"{(dense['peak_bytes'] - dense['grad_bytes']) / max(chunked['peak_bytes'] - chunked['grad_bytes'], 1):.1f}x")


if __name__ == "__main__":
    main()
