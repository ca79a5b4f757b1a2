"""The preflight's SFT memory estimate (``common.preflight.estimate_sft_memory``) against the memory one real trainer
step allocates on the CPU, full fine-tuning and LoRA, plain SFT and EKSFT.

    python -m bench.sft_memory_estimate                                   # tiny and small, 256 and 1,024 tokens
    python -m bench.sft_memory_estimate --sizes small --lengths 512 --no-gradient-checkpointing
    python -m bench.sft_memory_estimate --gradient-checkpointing-policy selective
    python -m bench.sft_memory_estimate --predict --sizes qwen3-1.7b qwen3-4b qwen3-8b --lengths 4096

Each trainer is the SFT stage's own (``bench.sft_step_time.build_trainer``: ``sft.train.root_from_base`` on a 1-rank
gloo group, fp32, the chunked loss head, AdamW over the trainable parameters) on a random model of a
``bench.sft_step_time.SIZES`` shape, one micro-batch of one sequence. The first ``train_step`` creates AdamW's
state; the second is measured: what the trainer holds before it (parameters and optimiser state,
``bench.sft_step_time.trainer_bytes``) plus the peak of the bytes torch's CPU allocator hands out during it (the
profiler's allocation events, ``profile_memory``: deterministic, no timing). The estimate reads the same shape from
a config.json and the same ``sft`` keys, with ``data.max_length`` the sequence length. On a GPU the same trainer's
peak is ``torch.cuda.max_memory_allocated`` (``scripts/gpu_lora_check.py``).

``--predict`` only prints the estimate under the paper profile (bf16, activation checkpointing, chunk 1,024, frozen
models in bf16) for ``--world-sizes`` GPUs, full and LoRA, SFT and EKSFT: nothing is built or measured.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from bench.sft_step_time import SIZES, build_model, build_trainer, random_micro_batches, release, trainer_bytes
from bench.sft_step_time import parse_args as trainer_args
from common.config.sft import CHECKPOINTING_POLICIES

GIB = 2 ** 30
TRAINERS = (("sft", False), ("sft", True), ("eksft", False), ("eksft", True))
"""(method, LoRA) of the trainers compared at every size and length."""


def save_config(size: str, folder: Path) -> Path:
    """``folder`` holding the config.json of a ``SIZES`` shape (the model built on the meta device: no weights)."""
    folder.mkdir()
    with torch.device("meta"):
        build_model(size, seed=0).config.to_json_file(folder / "config.json")
    return folder


def estimate(method: str, lora: bool, model_dir: Path, seq_len: int, overrides: list[str]):
    """The preflight's estimate of one trainer (``method``, LoRA or not) on the shape in ``model_dir``, sequences of
    ``seq_len`` tokens, with the config ``overrides``."""
    from common.config import compose
    from common.preflight import estimate_sft_memory

    return estimate_sft_memory(compose([
        *overrides, f"model.path={model_dir}", f"sft/method={method}", f"sft.lora.enabled={str(lora).lower()}",
        f"data.max_length={seq_len}"]))


def trainer_estimate(method: str, lora: bool, args: argparse.Namespace, model_dir: Path):
    """The estimate of the one-rank trainer ``build_trainer`` builds from ``args`` (``bench.sft_step_time``'s
    options; the shape's config.json in ``model_dir``)."""
    return estimate(method, lora, model_dir, args.seq_len, [
        "profile=toy", "profile.nproc_per_node=1", f"sft.micro_batch_size={args.micro_batch_size}",
        f"sft.mixed_precision={args.mixed_precision}", f"sft.frozen_dtype={args.frozen_dtype}",
        f"sft.chunk_size={args.chunk_size}", f"sft.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        f"sft.gradient_checkpointing_policy={args.gradient_checkpointing_policy}"])


def cpu_trainer_args(size: str, seq_len: int, chunk_size: int = 256, gradient_checkpointing: bool = True,
                     checkpointing_policy: str = "full") -> argparse.Namespace:
    """``build_trainer``'s options of a measured trainer: one sequence of ``seq_len`` tokens, fp32 throughout, the
    other ``sft.*`` options at ``bench.sft_step_time``'s defaults."""
    return trainer_args(["--size", size, "--seq-len", str(seq_len), "--micro-batch-size", "1", "--grad-accum", "1",
                         "--chunk-size", str(chunk_size), "--mixed-precision", "fp32"]
                        + (["--gradient-checkpointing", "--gradient-checkpointing-policy", checkpointing_policy]
                           if gradient_checkpointing else []))


def allocated_peak(step) -> int:
    """The most bytes ``step()`` has allocated at once on the CPU beyond what existed before it (frees of older
    tensors are not seen, so this can only overstate)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                    if event.name() == "[memory]" and event.device_type() == DeviceType.CPU)
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def measured_bytes(method: str, lora: bool, args: argparse.Namespace, env) -> int:
    """Held bytes plus the allocation peak of the second step of one trainer."""
    from common.config.sft import EKSFTMethod, SFTMethod
    from sft.trainer import train_step

    root, optimizer, sft = build_trainer(EKSFTMethod() if method == "eksft" else SFTMethod(), args, env, lora=lora)
    batches = random_micro_batches(args, SIZES[args.size][-1], env.device)
    train_step(root, optimizer, batches, sft=sft, env=env)
    held = trainer_bytes(root, optimizer)
    peak = allocated_peak(lambda: train_step(root, optimizer, batches, sft=sft, env=env))
    del root, optimizer, sft
    release(env)
    return held + peak


def compare(method: str, lora: bool, args: argparse.Namespace, model_dir: Path, env) -> dict:
    """One trainer of :func:`cpu_trainer_args` ``args``: its measured bytes and the preflight's estimate of it."""
    predicted = trainer_estimate(method, lora, args, model_dir)
    return {"size": args.size, "tokens": args.seq_len, "method": method, "lora": lora,
            "measured": measured_bytes(method, lora, args, env), "estimate": predicted.peak}


def measure(args: argparse.Namespace) -> None:
    """The table of estimate against measurement, MiB."""
    from common.tracking import configure_cpu_threads
    from sft.distributed import close_distributed, init_distributed

    configure_cpu_threads(args.threads)
    env = init_distributed("cpu")
    checkpointing = f"on ({args.gradient_checkpointing_policy})" if args.gradient_checkpointing else "off"
    print(f"fp32, one rank, chunk {args.chunk_size}, activation checkpointing {checkpointing}; MiB")
    print("| shape | tokens | method | measured | estimate | estimate / measured |")
    print("| --- | --- | --- | --- | --- | --- |")
    try:
        with tempfile.TemporaryDirectory(prefix="sft_memory_estimate_") as tmp:
            for size in args.sizes:
                model_dir = save_config(size, Path(tmp) / size)
                for seq_len in args.lengths:
                    trainer_args = cpu_trainer_args(size, seq_len, args.chunk_size, args.gradient_checkpointing,
                                                    args.gradient_checkpointing_policy)
                    for method, lora in TRAINERS:
                        row = compare(method, lora, trainer_args, model_dir, env)
                        print(f"| {size} | {seq_len:,} | {method}{'-LoRA' if lora else ''} | "
                              f"{row['measured'] / 2 ** 20:.1f} | {row['estimate'] / 2 ** 20:.1f} | "
                              f"{row['estimate'] / row['measured']:.2f} |", flush=True)
    finally:
        close_distributed(env)


def predict(args: argparse.Namespace) -> None:
    """The estimate's table under the paper profile, GiB per GPU."""
    print("estimates (common.preflight.estimate_sft_memory), profile=paper: bf16, activation checkpointing, chunk "
          "1,024, frozen models in bf16; GiB per GPU")
    print("| shape | tokens | GPUs | SFT full | SFT LoRA | EKSFT full | EKSFT LoRA |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="sft_memory_estimate_") as tmp:
        for size in args.sizes:
            model_dir = save_config(size, Path(tmp) / size)
            for seq_len in args.lengths:
                for gpus in args.world_sizes:
                    overrides = ["profile=paper", f"profile.nproc_per_node={gpus}", "sft.micro_batch_size=1"]
                    cells = [estimate(method, lora, model_dir, seq_len, overrides).peak / GIB
                             for method, lora in TRAINERS]
                    print(f"| {size} | {seq_len:,} | {gpus} | " + " | ".join(f"{cell:.1f}" for cell in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["tiny", "small"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    parser.add_argument("--gradient-checkpointing-policy", choices=CHECKPOINTING_POLICIES, default="full",
                        help="sft.gradient_checkpointing_policy of the measured trainers")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--predict", action="store_true", help="only the estimates under the paper profile")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 8], help="GPUs of --predict")
    args = parser.parse_args()
    (predict if args.predict else measure)(args)


if __name__ == "__main__":
    main()
