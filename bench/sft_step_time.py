"""EKSFT optimiser-step time ÷ plain-SFT step time, same model and data, through the real trainer step.

    python -m bench.sft_step_time                                  # CPU: tiny random Qwen3, bf16 autocast
    python -m bench.sft_step_time --size small --seq-len 512       # CPU, 26M-parameter Qwen3
    python -m bench.sft_step_time --device cuda --size qwen3-1.7b --seq-len 4096 --peak-tflops 989

Both methods run ``sft.trainer.train_step`` on the FSDP2-wrapped root (a 1-rank group), with AdamW, clipping and
the chunked loss head; EKSFT adds the frozen reference model's trunk forward and the statistics pass. The two are
timed in alternation (one SFT step, one EKSFT step, ...) after warm-up steps, so load on a shared machine hits
both alike; the ratios of the median and of the fastest step times are printed (on a contended machine the
fastest steps are the least disturbed) (target ≤ 1.40; the official EKSFT code's three
forwards per micro-batch cost ≈ 1.67× or more). On CUDA ``--peak-tflops`` adds MFU = 6 · params · tokens/s ÷
peak FLOP/s (the reference forward counts as overhead, not as model FLOPs). Models are random (no hub access).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from pipeline.tiny_model import random_qwen3

SIZES = {
    # name: (hidden, intermediate, layers, heads, kv heads, head_dim, vocab)
    "tiny": (128, 384, 4, 2, 1, 64, 512),
    "small": (512, 1536, 8, 8, 4, 64, 8192),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936),
}


def build_model(size: str, seed: int):
    hidden, intermediate, layers, heads, kv_heads, head_dim, vocab = SIZES[size]
    return random_qwen3(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers,
                        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, max_position_embeddings=32768,
                        seed=seed)


def random_micro_batches(args: argparse.Namespace, vocab: int, device: torch.device) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(args.grad_accum):
        input_ids = torch.randint(0, vocab, (args.micro_batch_size, args.seq_len), generator=generator)
        labels = input_ids.clone()
        labels[:, :args.seq_len // 8] = -100  # the prompt
        batches.append({"input_ids": input_ids.to(device), "attention_mask": None, "labels": labels.to(device)})
    return batches


def build_trainer(method, args: argparse.Namespace, env):
    from pipeline.config import SFTConfig
    from sft.losses import build_loss
    from sft.trainer import PolicyWithTokenLoss, build_optimizer, freeze, shard_models

    sft = SFTConfig(method=method, lr=1e-5, micro_batch_size=args.micro_batch_size, grad_accum=args.grad_accum,
                    chunk_size=args.chunk_size, mixed_precision=args.mixed_precision,
                    gradient_checkpointing=args.gradient_checkpointing)
    token_loss = build_loss(method)
    with env.device:  # initialise the random weights where they will live
        policy = build_model(args.size, seed=0)
        reference = freeze(build_model(args.size, seed=0)) if token_loss.needs_reference else None
        old_policy = freeze(build_model(args.size, seed=0)) if token_loss.needs_old_policy else None
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    root = PolicyWithTokenLoss(policy, token_loss, args.chunk_size, reference=reference, old_policy=old_policy)
    shard_models(root, env, args.mixed_precision)
    root.train()
    return root, build_optimizer(root, sft), sft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--mixed-precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per method first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="accelerator peak (dense bf16) for MFU")
    args = parser.parse_args()

    from pipeline.config.sft import EKSFTMethod, SFTMethod
    from pipeline.tracking import configure_cpu_threads
    from sft.trainer import close_distributed, init_distributed, train_step

    configure_cpu_threads(args.threads)
    env = init_distributed(args.device)
    try:
        trainers = {name: build_trainer(method, args, env)
                    for name, method in (("sft", SFTMethod()), ("eksft", EKSFTMethod()))}
        num_params = sum(p.numel() for p in trainers["sft"][0].policy.parameters())
        batches = random_micro_batches(args, SIZES[args.size][-1], env.device)
        tokens_per_step = args.grad_accum * args.micro_batch_size * args.seq_len
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for step in range(args.warmup + args.steps):
            for name, (root, optimizer, sft) in trainers.items():
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                train_step(root, optimizer, batches, sft=sft, env=env)
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                if step >= args.warmup:
                    times[name].append(time.perf_counter() - started)
    finally:
        close_distributed(env)

    print(f"device {args.device}, model {args.size} ({num_params / 1e6:.2f}M params), {args.grad_accum} x "
          f"{args.micro_batch_size} x {args.seq_len} tokens per step, {args.mixed_precision}, chunk "
          f"{args.chunk_size}, {args.steps} timed steps per method (median)")
    medians = {name: statistics.median(values) for name, values in times.items()}
    fastest = {name: min(values) for name, values in times.items()}
    for name, median in medians.items():
        line = (f"  {name:6s} step {median:8.4f} s (fastest {fastest[name]:.4f} s)   "
                f"{tokens_per_step / median:10.0f} tokens/s")
        if args.peak_tflops:
            mfu = 6 * num_params * tokens_per_step / median / (args.peak_tflops * 1e12)
            line += f"   MFU {100 * mfu:5.1f}%"
        print(line)
    print(f"eksft / sft step time: {medians['eksft'] / medians['sft']:.3f} (medians), "
          f"{fastest['eksft'] / fastest['sft']:.3f} (fastest steps)  (target <= 1.40; official code ~1.67+)")


if __name__ == "__main__":
    main()
