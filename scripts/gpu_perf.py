"""What EKSFT costs over SFT on one GPU, and SFT's MFU, at the Qwen3-1.7B shape: one run, one results file.

    python scripts/gpu_perf.py [--out FILE] [--steps 4]      # on one GPU (make gpu-perf), about 6 minutes on an H200
    python scripts/gpu_perf.py --dry-run                     # any machine: the same code at the tiny CPU size

Needs a CUDA torch and transformers (no vLLM, no verl). Parts, all through the bench modules' own code:

* statistics: ``bench.statistics_pass`` on one chunk of the real vocabulary (151,936) at hidden 2048, 1,024 and
  4,096 rows: the head matmuls apart, the statistics pass eager, compiled, online (compiled) and the candidates of
  ``bench.statistics_candidates`` (the Triton kernel among them).
* static bytes per parameter of an EKSFT trainer (policy, frozen reference, AdamW moments after one step; the
  gradients are freed by the step), with the reference stored in fp32 and in bf16 (``sft.frozen_dtype``).
* step time (``bench.sft_step_time.time_steps``): SFT, EKSFT with the live reference and EKSFT with the reference
  cache, 2 × 4 × 4,096 tokens per step, bf16, activation checkpointing, in the configurations named (two by
  default, :data:`DEFAULT_ORDER`) of nine: the eager trainer (chunk 1,024); the statistics compiled and the frozen
  models in bf16; that plus compiled decoder layers; that with the online statistics pass
  (``sft.online_statistics``, the paper profile); that with the gradient pass compiled (``sft.compile_pass_b``) and
  AdamW fused (``sft.adam_implementation=fused``); that with every chunk's pass-A logits kept for the gradient pass
  (``sft.kept_logits_chunks=16``, a micro-batch's 16 chunks); compiled layers at chunk 4,096; and SFT alone under
  selective activation checkpointing (``sft.gradient_checkpointing_policy=selective``: no matmul recomputed), in
  the paper profile or with the gradient pass compiled and AdamW fused, for its MFU (a micro-batch keeps 19 GiB
  more activations by ``common.preflight``'s formula, and with the three trainers' ~68 GiB of state it would need
  ~96 GiB, more than an 80 GB card holds). Ratios to
  SFT (targets live ≤ 1.30, cached ≤ 1.10) and SFT's MFU (6 · params · tokens/s over ``--peak-tflops``;
  torchtitan's 33-39% is the anchor, 40% the target). After the first configuration's timed steps, one more step
  of each of its trainers runs under ``torch.profiler``; the tables go beside the results file (``.profile.txt``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bench import sft_step_time, statistics_pass  # noqa: E402
from bench.sft_step_time import TARGETS, mfu, release, static_bytes_per_parameter, time_steps  # noqa: E402

PAPER_PROFILE = dict(compile_statistics=True, online_statistics=True, frozen_dtype="bf16", compile_layers=True,
                     chunk_size=1024)
"""The paper profile's loss-head and trunk keys (``conf/sft/paper.yaml``)."""
LEVERS = dict(PAPER_PROFILE, compile_pass_b=True, adam_implementation="fused")
"""The paper profile with its gradient pass compiled and AdamW fused."""
SFT_SELECTIVE = dict(checkpointing="selective", methods=("sft",))
"""SFT alone under selective checkpointing, for its MFU."""
CONFIGURATIONS = {
    "eager": dict(compile_statistics=False, frozen_dtype="fp32", compile_layers=False, chunk_size=1024),
    "compiled statistics, bf16 frozen": dict(compile_statistics=True, frozen_dtype="bf16", compile_layers=False,
                                             chunk_size=1024),
    "+ compiled layers": dict(compile_statistics=True, frozen_dtype="bf16", compile_layers=True, chunk_size=1024),
    "+ online statistics": PAPER_PROFILE,
    "+ chunk 4096": dict(compile_statistics=True, frozen_dtype="bf16", compile_layers=True, chunk_size=4096),
    "+ compiled pass B, fused AdamW": LEVERS,
    "+ selective checkpointing": dict(PAPER_PROFILE, **SFT_SELECTIVE),
    "+ every chunk's logits kept": dict(LEVERS, kept_logits_chunks=16),
    "selective, compiled pass B, fused AdamW": dict(LEVERS, **SFT_SELECTIVE),
}
"""The trainer configurations timed, by the ``sft.*`` keys that tell them apart (and ``methods``, the trainers timed
when not all three)."""
DEFAULT_ORDER = ("+ every chunk's logits kept", "+ compiled pass B, fused AdamW")
"""What one run times by default: the paper profile with its gradient pass compiled, AdamW fused and every chunk's
logits kept, profiled (the profile times each apart), and the same without the kept logits, in one run. On an H200
the statistics and static-memory parts and the first configuration took 259 s and a further configuration about 2
minutes (three trainers built and compiled: docs/results/2026-11-27-online-statistics-gpu.md), so more do not fit 6
minutes; SFT alone under selective checkpointing is a configuration to name."""


def step_args(dry_run: bool, steps: int, **options) -> argparse.Namespace:
    """``bench.sft_step_time``'s options at the Qwen3-1.7B shape (the tiny CPU size on a dry run)."""
    if dry_run:
        return sft_step_time.parse_args(["--size", "tiny", "--seq-len", "64", "--micro-batch-size", "2", "--steps", "1",
                                         "--warmup", "1", "--mixed-precision", "fp32", "--chunk-size", "64",
                                         "--gradient-checkpointing"] + option_flags(options))
    return sft_step_time.parse_args(["--device", "cuda", "--size", "qwen3-1.7b", "--seq-len", "4096",
                                     "--micro-batch-size", "4", "--grad-accum", "2", "--gradient-checkpointing",
                                     "--steps", str(steps), "--warmup", "2", "--chunk-size",
                                     str(options.get("chunk_size", 1024))] + option_flags(options))


def option_flags(options: dict) -> list[str]:
    flags = ["--frozen-dtype", options["frozen_dtype"],
             "--gradient-checkpointing-policy", options.get("checkpointing", "full")]
    flags += ["--methods", *options["methods"]] if "methods" in options else []
    flags += ["--compile-statistics"] if options["compile_statistics"] else []
    flags += ["--online-statistics"] if options.get("online_statistics") else []
    flags += ["--compile-pass-b"] if options.get("compile_pass_b") else []
    flags += ["--adam-implementation", options.get("adam_implementation", "default")]
    flags += ["--kept-logits-chunks", str(options.get("kept_logits_chunks", 1))]
    return flags + (["--compile-layers"] if options["compile_layers"] else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the tiny CPU size through the same code")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per trainer")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="dense bf16 peak of the GPU for MFU (H100/H200 SXM datasheet: 989)")
    parser.add_argument("--configurations", nargs="+", choices=list(CONFIGURATIONS), default=list(DEFAULT_ORDER),
                        help="the configurations timed, in this order; the first is profiled")
    parser.add_argument("--statistics-rows", type=int, nargs="*", default=[1024, 4096],
                        help="rows of the statistics part's logits chunk, one measurement each (none: skip the part)")
    parser.add_argument("--out", type=Path, default=None, help="results file (default runs/gpu_perf/<UTC time>.json)")
    args = parser.parse_args(argv)
    from common.tracking import configure_cpu_threads
    from gpu_smoke import script_start, versions  # scripts/gpu_smoke.py, beside this file
    from sft.distributed import close_distributed, init_distributed

    device, stamp, out = script_start("gpu_perf", args.dry_run, args.out)
    configure_cpu_threads(2)
    results: dict = {"date_utc": stamp, "dry_run": args.dry_run, "versions": versions(), "statistics": {},
                     "static_bytes_per_parameter": {}, "step_time": {}}
    print("gpu_perf: " + ", ".join(f"{key} {value}" for key, value in results["versions"].items()), flush=True)
    started = time.perf_counter()

    def save() -> None:  # after every part, so a run stopped at its time limit keeps what it measured
        results["seconds"] = time.perf_counter() - started
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")

    statistics_rows = ([64] if args.statistics_rows else []) if args.dry_run else args.statistics_rows
    for rows in statistics_rows:  # a dry run: one 64-row chunk, unless the part is skipped
        shape = ["--rows", str(rows)] + (["--vocab", "512", "--hidden", "64"] if args.dry_run else
                                         ["--device", "cuda", "--vocab", "151936", "--hidden", "2048"])
        results["statistics"][rows] = statistics_pass.main(shape + ["--repeats", "3" if args.dry_run else "10"])
        save()

    env = init_distributed(device)
    try:
        for dtype in ("fp32", "bf16"):
            options = dict(compile_statistics=False, frozen_dtype=dtype, compile_layers=False)
            per_param = static_bytes_per_parameter(step_args(args.dry_run, args.steps, **options), env)
            results["static_bytes_per_parameter"][dtype] = per_param
            print(f"[static] EKSFT trainer, frozen reference in {dtype}: {per_param:.2f} bytes per parameter",
                  flush=True)
        save()
        for name in args.configurations:
            step = step_args(args.dry_run, args.steps, **CONFIGURATIONS[name])
            if name == args.configurations[0]:  # one step per trainer of the first configuration, profiled
                step.profile = results["profile"] = out.with_suffix(".profile.txt")
            print(f"[step] {name}", flush=True)
            try:
                result = time_steps(step, env)
            except Exception as error:  # one configuration failing (a compile error, memory) leaves the others
                print(f"[step] {name} FAILED: {type(error).__name__}: {str(error)[:2000]}", flush=True)
                result = {"error": f"{type(error).__name__}: {error}"}
            if "error" in result:
                results["step_time"][name] = result
                release(env)  # outside the except block: its traceback no longer holds the trainers
                continue
            medians = result["median_s"]
            result["ratios"] = {method: medians[method] / medians["sft"] for method in TARGETS if method in medians}
            result["sft_mfu"] = mfu(result, "sft", args.peak_tflops)
            results["step_time"][name] = result
            save()
    finally:
        close_distributed(env)
    save()

    def cell(values: dict, key: str, width: int) -> str:  # "-" for a trainer the configuration did not time
        return f"{values[key]:{width}.3f}" if key in values else f"{'-':>{width}s}"

    print(f"\n{'configuration':34s} {'SFT s':>8s} {'live s':>8s} {'cache s':>8s} {'live/SFT':>9s} {'cache/SFT':>10s} "
          f"{'SFT MFU':>8s} {'peak GiB':>9s}")
    for name, result in results["step_time"].items():
        if "error" in result:
            print(f"{name:34s} failed: {result['error'][:200]}")
            continue
        seconds, ratios = result["median_s"], result["ratios"]
        peak = f"{result['peak_gib']:9.1f}" if result["peak_gib"] is not None else f"{'-':>9s}"
        print(f"{name:34s} {cell(seconds, 'sft', 8)} {cell(seconds, 'eksft', 8)} {cell(seconds, 'eksft_cache', 8)} "
              f"{cell(ratios, 'eksft', 9)} {cell(ratios, 'eksft_cache', 10)} {100 * result['sft_mfu']:7.1f}% {peak}")
    print(f"targets: live/SFT <= {TARGETS['eksft']}, cache/SFT <= {TARGETS['eksft_cache']}, SFT MFU >= 40%; "
          f"static bytes per parameter " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                    results["static_bytes_per_parameter"].items()))
    print(f"gpu_perf: done in {results['seconds']:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
