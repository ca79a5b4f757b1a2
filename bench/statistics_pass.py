"""The loss head's statistics pass on one logits chunk: eager ``row_terms`` against the compiled pass, with the head
matmuls timed apart.

    python -m bench.statistics_pass                                  # CPU: 256 rows x 32,768, one thread, CPU clock
    python -m bench.statistics_pass --device cuda --rows 1024 --vocab 151936 --hidden 2048

For one chunk of ``--rows`` prediction rows: the policy's and the reference's head matmuls (``hidden @ Wᵀ``, compute
dtype: bf16 on CUDA, fp32 on CPU) are timed on their own, then the statistics of ``--method`` from those logits
(``sft.token_stats.chunk_statistics``, the casts to fp32 included) eager and under ``torch.compile``
(``compiled_chunk_statistics``, compiled before timing, static shapes as the trainer compiles it; a dynamic row
count was slower on a GPU: docs/results/2026-11-27-sft-compiled-gpu.md); for EKSFT also the compiled online pass
(``compiled_online_chunk_statistics``) and the candidates of ``bench.statistics_candidates`` (compiled without
split reductions; on CUDA the Triton kernel). Printed: each median, the elementwise speed-up eager ÷ compiled, and
each pass's largest deviation from the same statistics in fp64 (all are fp32 computations; none is the
reference). ``sft.compile_statistics`` turns the compiled pass on in training, with ``sft.online_statistics`` the
online one.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common.config.sft import SFT_METHOD_SCHEMAS


def make_inputs(rows: int, vocab: int, hidden: int, dtype: torch.dtype, device: str) -> dict:
    """A chunk's hidden states and head weights for policy and reference (the reference a perturbed policy, so its
    KL is not 0) and random targets."""
    generator = torch.Generator(device=device).manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=generator, device=device)  # noqa: E731
    weight = randn(vocab, hidden) / hidden ** 0.5
    hidden_states = 3.0 * randn(rows, hidden)
    return {"hidden": hidden_states.to(dtype), "weight": weight.to(dtype),
            "ref_hidden": (hidden_states + 0.3 * randn(rows, hidden)).to(dtype),
            "ref_weight": (weight + 0.01 * randn(vocab, hidden) / hidden ** 0.5).to(dtype),
            "targets": torch.randint(0, vocab, (rows,), generator=generator, device=device)}


def add_chunk_arguments(parser: argparse.ArgumentParser, repeats: int) -> None:
    """The options of a bench timing one logits chunk: its device, shape, repeats and CPU threads."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rows", type=int, default=256, help="rows of the chunk (sft.chunk_size)")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")


def timed(function, repeats: int, clock, synchronize) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls of ``function`` (after one untimed call) and its last result."""
    result = function()
    times = []
    for _ in range(repeats):
        synchronize()
        started = clock()
        result = function()
        synchronize()
        times.append(clock() - started)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=sorted(SFT_METHOD_SCHEMAS), default="eksft",
                        help="the loss whose statistics are computed (eksft: logp, entropy, KL to the reference)")
    add_chunk_arguments(parser, repeats=5)
    args = parser.parse_args(argv)

    from bench import statistics_candidates as candidates
    from common.config import compose
    from common.tracking import configure_cpu_threads
    from sft.losses import build_loss
    from sft.token_stats import (ONLINE_TERMS, REFERENCE_TERMS, chunk_statistics, compiled_chunk_statistics,
                                 compiled_online_chunk_statistics)

    loss = build_loss(compose([f"sft/method={args.method}"]).sft.method)
    names = tuple(loss.stats)
    if not names:
        with_statistics = sorted(name for name, schema in SFT_METHOD_SCHEMAS.items() if build_loss(schema()).stats)
        parser.error(f"--method {args.method} declares no statistics, so it has no statistics pass to time; "
                     f"methods with one: {', '.join(with_statistics)}")
    configure_cpu_threads(args.threads)
    cuda = args.device == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    needs_ref = bool(REFERENCE_TERMS & set(names))
    inputs = make_inputs(args.rows, args.vocab, args.hidden, torch.bfloat16 if cuda else torch.float32, args.device)
    with torch.no_grad():
        matmul_s, logits = timed(lambda: inputs["hidden"] @ inputs["weight"].T, args.repeats, clock, synchronize)
        ref_matmul_s, ref_logits = timed(lambda: inputs["ref_hidden"] @ inputs["ref_weight"].T, args.repeats, clock,
                                         synchronize)
        if not needs_ref:
            ref_logits, ref_matmul_s = None, 0.0
        trainer = lambda function: lambda: function(  # noqa: E731
            logits, inputs["targets"], names, torch.float32, ref_logits=ref_logits, **loss.term_options)
        candidate = lambda function: lambda: function(logits, ref_logits, inputs["targets"])  # noqa: E731
        passes = {"eager": trainer(chunk_statistics), "compiled": trainer(compiled_chunk_statistics())}
        if ONLINE_TERMS.issuperset(names):
            passes["online"] = trainer(compiled_online_chunk_statistics())
        candidate_passes = {}
        if names == candidates.NAMES:
            candidate_passes["unsplit"] = trainer(candidates.compiled_unsplit_statistics())
            candidate_passes |= {"triton": candidate(candidates.triton_statistics)} if cuda else {}
        seconds, values, failed = {}, {}, {}
        for name, function in passes.items():
            seconds[name], values[name] = timed(function, args.repeats, clock, synchronize)
        for name, function in candidate_passes.items():
            try:
                seconds[name], values[name] = timed(function, args.repeats, clock, synchronize)
            except Exception as error:  # a candidate that fails to build here leaves the other passes' figures
                failed[name] = f"{type(error).__name__}: {error}"
        exact = chunk_statistics(logits, inputs["targets"], names, torch.float64, ref_logits=ref_logits,
                                 **loss.term_options)
    print(f"device {args.device}, method {args.method} (statistics {', '.join(names)}), chunk {args.rows} x "
          f"{args.vocab}, hidden {args.hidden}, {args.repeats} repeats (median), "
          f"{'wall' if cuda else 'CPU'} clock, {args.threads} thread(s)")
    print(f"  head matmul      policy {1e3 * matmul_s:9.3f} ms   reference {1e3 * ref_matmul_s:9.3f} ms")
    deviation = {name: max(((values[name][stat].double() - exact[stat]).abs().max().item() for stat in names),
                           default=0.0)
                 for name in seconds}
    for name in seconds:
        print(f"  statistics {name:9s} {1e3 * seconds[name]:9.3f} ms   max |x - fp64| {deviation[name]:.2e}")
    for name, error in failed.items():
        print(f"  statistics {name:9s} FAILED: {error[:1000]}")
    print("  (compiled: static shapes, as the trainer runs it; online: sft.online_statistics, compiled; unsplit,"
          " triton: bench.statistics_candidates)")
    speedup = seconds["eager"] / seconds["compiled"]
    print(f"compiled statistics speed-up (eager / compiled, elementwise part): {speedup:.2f}x")
    return {"matmul_s": matmul_s, "ref_matmul_s": ref_matmul_s, "statistics_s": seconds, "deviation": deviation,
            "speedup": speedup, "failed": failed}


if __name__ == "__main__":
    main()
