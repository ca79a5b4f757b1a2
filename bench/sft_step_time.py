"""EKSFT optimiser-step time ÷ plain-SFT step time, live reference and reference cache, through the real trainer step.

    python -m bench.sft_step_time                                  # CPU: tiny random Qwen3
    python -m bench.sft_step_time --size small --seq-len 512 --micro-batch-size 2   # CPU, 29M-parameter Qwen3
    python -m bench.sft_step_time --device cuda --size qwen3-1.7b --seq-len 4096 --peak-tflops 989
    python -m bench.sft_step_time --device cuda --size qwen3-1.7b --methods sft --micro-batch-size 8 --peak-tflops 989

Three trainers run ``sft.trainer.train_step`` on FSDP2-wrapped roots (a 1-rank group), with AdamW, clipping and the
chunked loss head: plain SFT (no statistics pass, no reference), EKSFT with the live reference (its trunk forward
every micro-batch plus the statistics pass) and EKSFT with ``sft.reference_cache`` (the reference's hidden states
read from a cache built once, before timing, by ``sft.reference_cache.build_reference_cache``; only the reference's
LM head runs). The cached variant's timed step includes reading its rows from the cache. The three are timed in
alternation (SFT, EKSFT live, EKSFT cache, SFT, ...) after warm-up steps, so load on a shared machine hits all
alike; the ratios of the median and of the fastest step times are printed (on a contended machine the fastest
steps are the least disturbed). Targets on a GPU: live ≤ 1.30 (the official EKSFT code's three forwards cost
≈ 1.67×), cache ≤ 1.10. ``--compile-layers``, ``--compile-statistics`` and ``--frozen-dtype`` are the trainer's
``sft.*`` keys of the same names. The one-off cache build time and its disk per token are printed too. On CUDA ``--peak-tflops`` adds
MFU = 6 · params · tokens/s ÷ peak FLOP/s (reference work counts as overhead). Models are random (no hub access).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.tiny_model import random_qwen3
from common.config.sft import ADAM_IMPLEMENTATIONS, CHECKPOINTING_POLICIES

SIZES = {
    # name: (hidden, intermediate, layers, heads, kv heads, head_dim, vocab)
    "tiny": (128, 384, 4, 2, 1, 64, 512),
    "small": (512, 1536, 8, 8, 4, 64, 8192),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936),
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936),
}
UNTIED = {"qwen3-8b"}
"""Sizes whose LM head is a weight of its own, as in Qwen3-8B (the others tie it to the embeddings)."""
TARGETS = {"eksft": 1.30, "eksft_cache": 1.10}
"""Step-time targets of each EKSFT variant ÷ SFT."""
METHODS = ("sft", "eksft", "eksft_cache")
"""The trainers timed: plain SFT, EKSFT with the live reference, EKSFT with the reference cache."""


def build_model(size: str, seed: int, num_layers: int | None = None):
    """A random model of ``size`` (its own layer count unless ``num_layers``)."""
    hidden, intermediate, layers, heads, kv_heads, head_dim, vocab = SIZES[size]
    return random_qwen3(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                        num_layers=num_layers or layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                        max_position_embeddings=32768, seed=seed, tie_word_embeddings=size not in UNTIED)


def random_micro_batches(args: argparse.Namespace, vocab: int, device: torch.device) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(args.grad_accum):
        input_ids = torch.randint(0, vocab, (args.micro_batch_size, args.seq_len), generator=generator)
        labels = input_ids.clone()
        labels[:, :args.seq_len // 8] = -100  # the prompt
        batches.append({"input_ids": input_ids.to(device), "attention_mask": None, "labels": labels.to(device)})
    return batches


def build_trainer(method, args: argparse.Namespace, env, cached_reference: bool = False, lora: bool = False):
    """The SFT stage's own root (``sft.train.root_from_base``: policy and frozen models on the meta device, sharded,
    filled from one full base model, LoRA adapters with ``lora``) on a random base of ``args.size`` built on the CPU
    (``args.layers`` of its layers if set, as ``scripts/gpu_smoke.py`` does), in train mode; with its AdamW and the
    ``sft.*`` config of ``args``."""
    from common.config import SFTConfig
    from common.config.sft import LoRAConfig
    from sft.losses import build_loss
    from sft.optim import build_optimizer
    from sft.train import BaseModel, root_from_base

    sft = SFTConfig(method=method, lr=1e-5, micro_batch_size=args.micro_batch_size, grad_accum=args.grad_accum,
                    chunk_size=args.chunk_size, mixed_precision=args.mixed_precision,
                    gradient_checkpointing=args.gradient_checkpointing,
                    gradient_checkpointing_policy=args.gradient_checkpointing_policy, reference_cache=cached_reference,
                    compile_layers=args.compile_layers, compile_statistics=args.compile_statistics,
                    online_statistics=args.online_statistics, compile_pass_b=args.compile_pass_b,
                    kept_logits_chunks=args.kept_logits_chunks,
                    frozen_dtype=args.frozen_dtype, adam_implementation=args.adam_implementation,
                    lora=LoRAConfig(enabled=lora))
    sft.validate()
    base = build_model(args.size, seed=0, num_layers=getattr(args, "layers", None))
    root = root_from_base(sft, build_loss(method), BaseModel(base, base.config, base.generation_config), env,
                          cached_reference)
    root.train()
    return root, build_optimizer(root, sft), sft


def build_cache(folder: Path, batches: list[dict], args: argparse.Namespace, env, clock):
    """The reference cache of the bench's sequences (row ``m · micro_batch_size + b`` = sequence b of micro-batch
    m), built by the sharded reference trunk; returns (reader, build seconds, bytes per token)."""
    from sft.reference_cache import ReferenceCache, build_reference_cache, cache_identity
    from sft.policy import sharded_reference_trunk

    identity = cache_identity(base_model_sha256=f"bench-random-{args.size}", sft_tokens_sha256="bench-random-batches",
                              attn_implementation="sdpa", gguf_file=None, device_type=env.device.type,
                              mixed_precision=args.mixed_precision, frozen_dtype=args.frozen_dtype, kernels={})
    with env.device:
        reference = build_model(args.size, seed=0)
    hidden_states = sharded_reference_trunk(reference, env, args.mixed_precision, args.frozen_dtype)
    sequences = [row.tolist() for batch in batches for row in batch["input_ids"].cpu()]
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    started = clock()
    manifest = build_reference_cache(folder, identity, input_ids=sequences, hidden_size=SIZES[args.size][0],
                                     hidden_states=hidden_states, rank=env.rank, world_size=env.world_size,
                                     announce=lambda message: None)
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    build_s = clock() - started
    del reference, hidden_states
    return ReferenceCache(folder, identity), build_s, manifest.details["bytes_per_token"]


def with_cached_rows(batches: list[dict], sft, cache, device: torch.device) -> list[dict]:
    """A trainer's micro-batches for one step: under ``sft.reference_cache`` each plus its rows' cached reference
    hidden states (what ``sft.trainer.fit`` does per step), else ``batches`` as they are."""
    if not sft.reference_cache:
        return batches
    out = []
    for m, batch in enumerate(batches):
        size, length = batch["input_ids"].shape
        indices = range(m * size, (m + 1) * size)
        out.append({**batch, "ref_hidden": cache.batch(indices, length).to(device)})
    return out


def add_trainer_options(parser: argparse.ArgumentParser) -> None:
    """The ``sft.*`` keys of the same names that :func:`build_trainer` reads besides the shape and batch."""
    parser.add_argument("--compile-layers", action="store_true", help="sft.compile_layers: compiled decoder layers")
    parser.add_argument("--compile-statistics", action="store_true",
                        help="sft.compile_statistics: the loss head's statistics pass compiled")
    parser.add_argument("--adam-implementation", choices=ADAM_IMPLEMENTATIONS, default="default",
                        help="sft.adam_implementation: torch's default AdamW step or the fused one")
    parser.add_argument("--compile-pass-b", action="store_true",
                        help="sft.compile_pass_b: the loss head's gradient pass compiled")
    parser.add_argument("--kept-logits-chunks", type=int, default=1,
                        help="sft.kept_logits_chunks: chunks of the statistics pass's logits the gradient pass takes")
    parser.add_argument("--online-statistics", action="store_true",
                        help="sft.online_statistics: EKSFT's statistics by an online log-sum-exp over vocabulary "
                             "blocks")
    parser.add_argument("--frozen-dtype", choices=("fp32", "bf16"), default="fp32",
                        help="sft.frozen_dtype: storage of the frozen reference and old policy")
    parser.add_argument("--gradient-checkpointing-policy", choices=CHECKPOINTING_POLICIES, default="full",
                        help="sft.gradient_checkpointing_policy: what --gradient-checkpointing recomputes")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="the trainers to time (all three for the ratios; one alone for MFU at a size where "
                             "three copies of the model's optimiser state would not fit)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--mixed-precision", choices=("auto", "bf16", "fp32"), default="auto",
                        help="auto: bf16 on CUDA and on CPUs with AVX-512 (oneDNN bf16 kernels), else fp32 (an "
                             "AVX2-only CPU runs bf16 matmuls ~50x slower than fp32)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    add_trainer_options(parser)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per method first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="accelerator peak (dense bf16) for MFU")
    parser.add_argument("--profile", type=Path, default=None,
                        help="after the timed steps, one step per trainer under torch.profiler; tables to this file")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this process's CPU seconds (with --threads 1 on a CPU shared with other jobs, "
                             "what the step computes, not how long it waited for a core)")
    args = parser.parse_args(argv)
    if args.mixed_precision == "auto":
        fast_bf16 = args.device == "cuda" or "AVX512" in torch.backends.cpu.get_cpu_capability()
        args.mixed_precision = "bf16" if fast_bf16 else "fp32"
    return args


def time_steps(args: argparse.Namespace, env) -> dict:
    """The trainers of ``args.methods`` stepped in alternation: per method the median and fastest step seconds,
    with the parameter count, tokens per step, the cache build (seconds, bytes per token) and, on CUDA, the peak
    memory of all trainers. The trainers are released (:func:`release`) before it returns."""
    from common.config.sft import EKSFTMethod, SFTMethod
    from sft.trainer import train_step

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    batches = random_micro_batches(args, SIZES[args.size][-1], env.device)
    result: dict = {"build_s": None, "bytes_per_token": None}
    with tempfile.TemporaryDirectory(prefix="reference_cache_") as folder:
        cache = None
        if "eksft_cache" in args.methods:
            cache, result["build_s"], result["bytes_per_token"] = build_cache(Path(folder), batches, args, env, clock)
            print(f"reference cache built in {result['build_s']:.2f} s", flush=True)
        variants = {"sft": (SFTMethod(), False), "eksft": (EKSFTMethod(), False),
                    "eksft_cache": (EKSFTMethod(), True)}  # method, cached reference
        trainers = {name: build_trainer(method, args, env, cached_reference=cached)
                    for name, (method, cached) in variants.items() if name in args.methods}
        result["num_params"] = sum(p.numel() for p in next(iter(trainers.values()))[0].policy.parameters())
        result["tokens_per_step"] = args.grad_accum * args.micro_batch_size * args.seq_len
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for step in range(args.warmup + args.steps):
            for name, (root, optimizer, sft) in trainers.items():
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                started = clock()
                step_batches = with_cached_rows(batches, sft, cache, env.device)
                train_step(root, optimizer, step_batches, sft=sft, env=env)
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                if step >= args.warmup:
                    times[name].append(clock() - started)
            print(f"round {step + 1}/{args.warmup + args.steps}"
                  + ("" if step < args.warmup else ": " + ", ".join(f"{name} {values[-1]:.3f} s"
                                                                    for name, values in times.items())),
                  flush=True)
        if args.profile is not None:
            profile_steps(args.profile, trainers, batches, cache, env)
        del trainers, cache
    release(env)
    result["median_s"] = {name: statistics.median(values) for name, values in times.items()}
    result["fastest_s"] = {name: min(values) for name, values in times.items()}
    result["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30 if env.device.type == "cuda" else None
    return result


def profile_steps(path: Path, trainers: dict, batches, cache, env) -> None:
    """One more step of each trainer under ``torch.profiler``: each one's 25 costliest operators and kernels by
    self time (the device's on CUDA), one table per trainer, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    from sft.trainer import train_step

    cuda = env.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    tables = []
    for name, (root, optimizer, sft) in trainers.items():
        with profile(activities=activities) as profiler:
            train_step(root, optimizer, with_cached_rows(batches, sft, cache, env.device), sft=sft, env=env)
            if cuda:
                torch.cuda.synchronize()
        table = profiler.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                              row_limit=25, max_name_column_width=70)
        tables.append(f"## {name}\n{table}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(tables))
    print(f"profiles of one step per trainer in {path}", flush=True)


def release(env) -> None:
    """Frees what dropped trainers held: an FSDP2 root sits in reference cycles (its hooks refer to its modules), so
    ``del`` alone leaves its weights, and a second trainer's memory would add to the first's."""
    gc.collect()
    if env.device.type == "cuda":
        torch.cuda.empty_cache()


def static_bytes_per_parameter(args: argparse.Namespace, env) -> float:
    """Memory an EKSFT trainer holds between steps (after one step), per policy parameter: CUDA's allocated bytes
    on a GPU, else the bytes of every parameter and optimiser state."""
    from common.config.sft import EKSFTMethod
    from sft.trainer import train_step

    release(env)
    before = torch.cuda.memory_allocated() if env.device.type == "cuda" else 0
    root, optimizer, sft = build_trainer(EKSFTMethod(), args, env)
    train_step(root, optimizer, random_micro_batches(args, SIZES[args.size][-1], env.device), sft=sft,
               env=env)
    num_params = sum(p.numel() for p in root.policy.parameters())
    if env.device.type == "cuda":
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
    else:
        held = trainer_bytes(root, optimizer)
    del root, optimizer, sft
    release(env)
    return held / num_params


def trainer_bytes(root, optimizer) -> int:
    """Bytes of the root's parameters (each once; local shards) and of every optimiser state tensor."""
    def local(tensor):
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    params = sum(local(p).numel() * local(p).element_size() for p in root.parameters())
    states = sum(local(v).numel() * local(v).element_size() for state in optimizer.state.values()
                 for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return params + states


def report(args: argparse.Namespace, result: dict) -> None:
    print(f"device {args.device}, model {args.size} ({result['num_params'] / 1e6:.2f}M params), {args.grad_accum} x "
          f"{args.micro_batch_size} x {args.seq_len} tokens per step, {args.mixed_precision}, chunk "
          f"{args.chunk_size}, {args.steps} timed steps per method (median), {args.clock} clock, "
          f"{args.threads} thread(s)")
    medians, fastest = result["median_s"], result["fastest_s"]
    for name, median in medians.items():
        line = (f"  {name:12s} step {median:8.4f} s (fastest {fastest[name]:.4f} s)   "
                f"{result['tokens_per_step'] / median:10.0f} tokens/s")
        if args.peak_tflops:
            line += f"   MFU {100 * mfu(result, name, args.peak_tflops):5.1f}%"
        print(line)
    if result["peak_gib"] is not None:
        print(f"peak GPU memory allocated {result['peak_gib']:.1f} GiB (all trainers)")
    for name, target in TARGETS.items():
        if name in medians and "sft" in medians:
            print(f"{name} / sft step time: {medians[name] / medians['sft']:.3f} (medians), "
                  f"{fastest[name] / fastest['sft']:.3f} (fastest steps)  (target <= {target:.2f})")
    if result["build_s"] is not None and "sft" in medians:
        print(f"reference cache: built once in {result['build_s']:.2f} s for {result['tokens_per_step']} tokens "
              f"({result['build_s'] / medians['sft']:.2f} SFT steps; "
              f"{1e3 * result['build_s'] / result['tokens_per_step']:.3f} ms per token), "
              f"{result['bytes_per_token']} bytes per token on disk")


def mfu(result: dict, name: str, peak_tflops: float) -> float:
    """Model FLOP utilisation of ``name``'s median step: 6 · params · tokens/s ÷ peak (reference work is overhead)."""
    return 6 * result["num_params"] * result["tokens_per_step"] / result["median_s"][name] / (peak_tflops * 1e12)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from common.tracking import configure_cpu_threads
    from sft.distributed import close_distributed, init_distributed

    configure_cpu_threads(args.threads)
    env = init_distributed(args.device)
    try:
        result = time_steps(args, env)
    finally:
        close_distributed(env)
    report(args, result)


if __name__ == "__main__":
    main()
