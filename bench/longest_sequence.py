"""The longest sequence one EKSFT optimiser step fits in: GPU memory by sequence length, through the real trainer step.

    python -m bench.longest_sequence --size qwen3-4b --lengths 8192 16384 32768 65536    # CUDA, bf16, checkpointing
    python -m bench.longest_sequence --device cpu --size tiny --lengths 256 512          # the same code on CPU

One trainer (default EKSFT with the live reference; ``bench.sft_step_time.build_trainer``) is built once on a
1-rank FSDP2 group with bf16 mixed precision and activation checkpointing. For each length, shortest first, one
micro-batch of one random sequence (the first eighth is prompt) runs two ``train_step``s, so the second holds
AdamW's state; it is the second step that is measured. Per length on CUDA:

    static     = memory allocated before the step: fp32 master weights, the reference, AdamW's two moments
    gradients  = the policy's fp32 gradient shards, allocated in the backward
    activation = forward/backward peak − static − gradients: activations and checkpoints, the chunked loss head,
                 the all-gathered bf16 copies of the units being computed (not sharded by FSDP2)
    optimiser  = the optimiser step's peak − static − gradients: AdamW's temporaries (fp32, parameter-sized)

FSDP2 shards static, gradients and the optimiser's temporaries over the ranks, not the activation part, so on N
GPUs each needs about max((static + gradients) / N + activation, (static + gradients + optimiser) / N); the table
gives that for ``--world-sizes`` (at N = 1 it is the measured peak). The search stops at the first length that runs
out of memory.
"""
from __future__ import annotations

import argparse
import time

import torch

from bench.sft_step_time import SIZES, add_trainer_options, build_trainer, random_micro_batches

GIB = 2 ** 30


def measure(root, optimizer, sft, env, args: argparse.Namespace, seq_len: int) -> dict:
    """Two optimiser steps on one sequence of ``seq_len`` tokens; memory and time of the second."""
    from sft.trainer import train_step

    batch_args = argparse.Namespace(grad_accum=1, micro_batch_size=1, seq_len=seq_len)
    batches = random_micro_batches(batch_args, SIZES[args.size][-1], env.device)
    train_step(root, optimizer, batches, sft=sft, env=env)
    cuda = env.device.type == "cuda"
    peaks = {}

    def end_of_backward(*_):
        """The forward/backward peak, then a fresh count for the optimiser step's own temporaries."""
        if cuda:
            peaks["backward"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    hook = optimizer.register_step_pre_hook(end_of_backward)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    static = torch.cuda.memory_allocated() if cuda else 0
    started = time.perf_counter()
    try:
        train_step(root, optimizer, batches, sft=sft, env=env)
    finally:
        hook.remove()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {"seq_len": seq_len, "seconds": seconds, "static": static, "peak_backward": peaks.get("backward", 0),
            "peak_optimizer": torch.cuda.max_memory_allocated() if cuda else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default="qwen3-4b")
    parser.add_argument("--method", choices=("sft", "eksft"), default="eksft")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768, 49152, 65536])
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="the GPU the estimate is for (H100: 80)")
    add_trainer_options(parser)
    args = parser.parse_args()
    args.mixed_precision = "bf16" if args.device == "cuda" else "fp32"
    args.micro_batch_size, args.grad_accum = 1, 1

    from common.config.sft import EKSFTMethod, SFTMethod
    from sft.distributed import close_distributed, init_distributed

    env = init_distributed(args.device)
    rows = []
    try:
        method = EKSFTMethod() if args.method == "eksft" else SFTMethod()
        root, optimizer, sft = build_trainer(method, args, env)
        gradients = sum(p.numel() * p.element_size() for p in root.policy.parameters() if p.requires_grad)
        num_params = sum(p.numel() for p in root.policy.parameters())
        print(f"{args.size} ({num_params / 1e9:.2f}B params), {args.method}, {args.mixed_precision}, activation "
              f"checkpointing {'on' if args.gradient_checkpointing else 'off'}, chunk {args.chunk_size}", flush=True)
        for seq_len in sorted(args.lengths):
            try:
                row = measure(root, optimizer, sft, env, args, seq_len)
            except torch.OutOfMemoryError as error:
                print(f"{seq_len:>7d} tokens: out of memory ({str(error).splitlines()[0]})", flush=True)
                break
            row["activation"] = row["peak_backward"] - row["static"] - gradients
            row["optimizer"] = row["peak_optimizer"] - row["static"] - gradients
            rows.append(row)
            memory = (f", forward/backward peak {row['peak_backward'] / GIB:.1f} GiB = static "
                      f"{row['static'] / GIB:.1f} + gradients {gradients / GIB:.1f} + activation "
                      f"{row['activation'] / GIB:.1f}; optimiser step peak {row['peak_optimizer'] / GIB:.1f} GiB"
                      if env.device.type == "cuda" else "")
            print(f"{seq_len:>7d} tokens: step {row['seconds']:.2f} s ({seq_len / row['seconds']:,.0f} tokens/s)"
                  + memory, flush=True)
    finally:
        close_distributed(env)

    if env.device.type != "cuda" or not rows:
        return
    def per_gpu_gib(row: dict, n: int) -> float:
        sharded = row["static"] + gradients
        return max(sharded / n + row["activation"], (sharded + row["optimizer"]) / n) / GIB

    print(f"\nper-GPU estimate max((static + gradients) / N + activation, (static + gradients + optimiser) / N), "
          f"GiB ('!': over {args.gpu_gib:.0f} GiB)")
    print("tokens   " + "   ".join(f"N={n:<3d}" for n in args.world_sizes))
    for row in rows:
        cells = [f"{per_gpu_gib(row, n):5.1f}{'' if per_gpu_gib(row, n) <= args.gpu_gib else '!'}"
                 for n in args.world_sizes]
        print(f"{row['seq_len']:>7d}  " + "   ".join(cells))
    for n in args.world_sizes:
        fitting = [row["seq_len"] for row in rows if per_gpu_gib(row, n) <= args.gpu_gib]
        print(f"longest measured length fitting {args.gpu_gib:.0f} GiB at N={n}: {max(fitting) if fitting else 'none'}")


if __name__ == "__main__":
    main()
