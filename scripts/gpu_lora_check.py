"""EKSFT-LoRA against EKSFT-full on one GPU at the Qwen3-1.7B shape: peak memory and step time of both, one run.

    python scripts/gpu_lora_check.py [--out FILE] [--profile]   # one GPU: NCCL, world size 1, bf16; about 2 minutes
    python scripts/gpu_lora_check.py --dry-run        # any machine: the same code at the tiny CPU size (gloo, fp32)

Both trainers are the SFT stage's own: a ``PolicyWithTokenLoss`` root built by ``sft.train.root_from_base`` (through
``bench.sft_step_time.build_trainer``) and stepped by ``sft.trainer.train_step`` (AdamW over the trainable
parameters, the chunked loss head), on one micro-batch of 4,096 tokens with activation checkpointing; random weights
(no hub access). Full: the fp32 policy, its frozen reference stored in bf16 (``sft.frozen_dtype=bf16``), AdamW on
every weight. LoRA (``sft.lora`` defaults: r 16, α 32, every linear layer of a decoder layer; ``sft/lora.py``): the
base frozen in bf16, fp32 adapters, the reference the base with the adapters disabled (no second model). Each trainer
is built, warmed up and timed alone after the one before is released, so each peak
(``torch.cuda.max_memory_allocated``) is its own; ``held_gib`` is what it holds between steps, ``estimate_gib`` the
preflight's estimate of its peak (``common.preflight.estimate_sft_memory``). With ``--profile`` one more step of each
runs under ``torch.profiler`` (``bench.sft_step_time.profile_steps``), its table beside the results file
(``.full.profile.txt``, ``.lora.profile.txt``): the host's and the device's totals say whether LoRA's step waits on
the host. Needs a CUDA torch, transformers and peft (no vLLM, no verl).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bench import sft_step_time  # noqa: E402
from bench.sft_memory_estimate import save_config, trainer_estimate  # noqa: E402
from bench.sft_step_time import (build_trainer, profile_steps, random_micro_batches, release,  # noqa: E402
                                 trainer_bytes)

TRAINERS = ("full", "lora")


def step_args(dry_run: bool) -> argparse.Namespace:
    """``bench.sft_step_time``'s options: the Qwen3-1.7B shape, 1 × 4,096 tokens, bf16 (the tiny CPU size dry)."""
    if dry_run:
        return sft_step_time.parse_args(["--size", "tiny", "--seq-len", "64", "--micro-batch-size", "1",
                                         "--grad-accum", "1", "--mixed-precision", "fp32", "--chunk-size", "64",
                                         "--frozen-dtype", "fp32"])
    return sft_step_time.parse_args(["--device", "cuda", "--size", "qwen3-1.7b", "--seq-len", "4096",
                                     "--micro-batch-size", "1", "--grad-accum", "1", "--gradient-checkpointing",
                                     "--mixed-precision", "bf16", "--chunk-size", "1024", "--frozen-dtype", "bf16"])


def measure(name: str, args: argparse.Namespace, env, warmup: int, steps: int, profile: Path | None = None) -> dict:
    """One trainer alone: its median step time, peak and held memory, trainable and total parameters; with
    ``profile``, then one more step under ``torch.profiler``, its table written there."""
    from common.config.sft import EKSFTMethod
    from sft.trainer import train_step

    cuda = env.device.type == "cuda"
    release(env)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    root, optimizer, sft = build_trainer(EKSFTMethod(), args, env, lora=name == "lora")
    batches = random_micro_batches(args, sft_step_time.SIZES[args.size][-1], env.device)
    times = []
    for step in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        train_step(root, optimizer, batches, sft=sft, env=env)
        if cuda:
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    result = {"median_step_s": statistics.median(times), "step_s": times,
              "trainable_params": sum(p.numel() for p in root.policy.parameters() if p.requires_grad),
              "params": sum(p.numel() for p in root.policy.parameters()),
              "held_gib": ((torch.cuda.memory_allocated() - before) if cuda else trainer_bytes(root, optimizer))
              / 2 ** 30,
              "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None}
    if profile is not None:
        profile_steps(profile, {name: (root, optimizer, sft)}, batches, None, env)
        result["profile"] = str(profile)
    del root, optimizer, sft
    release(env)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the tiny CPU size through the same code")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per trainer first")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default runs/gpu_lora_check/<UTC time>.json)")
    parser.add_argument("--profile", action="store_true",
                        help="one more step of each trainer under torch.profiler, a table beside the results file")
    args = parser.parse_args(argv)
    from common.tracking import configure_cpu_threads
    from gpu_smoke import script_start, versions  # scripts/gpu_smoke.py, beside this file
    from sft.distributed import close_distributed, init_distributed

    device, stamp, out = script_start("gpu_lora_check", args.dry_run, args.out)
    configure_cpu_threads(2)
    shape = step_args(args.dry_run)
    results: dict = {"date_utc": stamp, "dry_run": args.dry_run, "versions": versions(), "size": shape.size,
                     "tokens_per_step": shape.micro_batch_size * shape.seq_len * shape.grad_accum, "trainers": {}}
    started = time.perf_counter()
    env = init_distributed(device)
    try:
        for name in TRAINERS:
            print(f"[{name}] EKSFT, {shape.size}, {results['tokens_per_step']} tokens per step", flush=True)
            profile = out.with_suffix(f".{name}.profile.txt") if args.profile else None
            results["trainers"][name] = measure(name, shape, env, args.warmup, args.steps, profile)
            with tempfile.TemporaryDirectory() as tmp:  # the preflight's estimate of the same trainer
                estimate = trainer_estimate("eksft", name == "lora", shape, save_config(shape.size, Path(tmp) / "m"))
            results["trainers"][name]["estimate_gib"] = estimate.peak / 2 ** 30
            results["seconds"] = time.perf_counter() - started
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    finally:
        close_distributed(env)
    full, lora = results["trainers"]["full"], results["trainers"]["lora"]
    print(f"\n{'trainer':8s} {'step s':>8s} {'peak GiB':>9s} {'estimate':>9s} {'held GiB':>9s} {'trainable':>12s}")
    for name, result in results["trainers"].items():
        peak = f"{result['peak_gib']:9.2f}" if result["peak_gib"] is not None else f"{'-':>9s}"
        print(f"{name:8s} {result['median_step_s']:8.3f} {peak} {result['estimate_gib']:9.2f} "
              f"{result['held_gib']:9.3f} {result['trainable_params']:12,d}")
    print(f"lora/full: step time {lora['median_step_s'] / full['median_step_s']:.3f}, held memory "
          f"{lora['held_gib'] / full['held_gib']:.3f}")
    print(f"gpu_lora_check: done in {results['seconds']:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
