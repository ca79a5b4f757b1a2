"""Peak host memory (RSS) per SFT rank while the trainer's models are loaded and sharded: every rank loading the
full base model per trainer copy (the loading before sharded loading) against ``sft.train.build_root`` (meta-device
models, sharded, filled from rank 0's one full copy).

    python -m bench.sft_load_memory                                     # tiny random Qwen3, EKSFT, 2 gloo ranks
    python -m bench.sft_load_memory --size qwen3-0.6b --method eksft    # the Qwen3-0.6B shape, ~2.4 GB on disk

A random model of the given shape (``bench.sft_step_time.SIZES``, tied embeddings) is saved with
``save_pretrained`` to a temporary folder (free disk checked first), or ``--model-dir`` is read. Each variant runs
in its own ``torchrun --nproc_per_node=N`` launch on gloo, so ``ru_maxrss`` (the process's peak resident set)
covers that variant's loading only; the RSS after imports and the load time are printed too. Only loading is
measured, no training step. ``--method`` picks the models: ``sft`` the policy, ``eksft`` policy + reference,
``psft`` policy + old policy.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("full", "sharded")
GIB = 2 ** 30


def full_load_root(cfg, model_dir: str, env):
    """Every rank loads one full float32 model per trainer copy, then shards them (``sft.policy.shard_models``)."""
    from sft.losses import build_loss
    from sft.train import load_base_model
    from sft.policy import PolicyWithTokenLoss, freeze, shard_models

    def load():
        return load_base_model(cfg, model_dir)

    token_loss = build_loss(cfg.sft.method)
    root = PolicyWithTokenLoss(load(), token_loss, cfg.sft.chunk_size,
                               reference=freeze(load()) if token_loss.needs_reference else None,
                               old_policy=freeze(load()) if token_loss.needs_old_policy else None)
    shard_models(root, env, cfg.sft.mixed_precision)
    return root


def worker(args: argparse.Namespace) -> None:
    """One rank of one variant: loads, then rank 0 writes every rank's figures to ``args.out`` as JSON."""
    import torch.distributed as dist

    from common.config import compose
    from sft.train import build_root
    from sft.distributed import close_distributed, init_distributed

    rss_after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    env = init_distributed("cpu")
    cfg = compose(["profile=toy", f"sft/method={args.method}", f"model.path={args.model_dir}", "model.name=bench",
                   "model.source=hub", "sft.mixed_precision=fp32"])
    started = time.perf_counter()
    if args.worker == "full":
        root = full_load_root(cfg, args.model_dir, env)
    else:
        root, _ = build_root(cfg, args.model_dir, env)
    dist.barrier()
    figures = {"rank": env.rank, "load_s": time.perf_counter() - started, "rss_after_imports": rss_after_imports,
               "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "local_parameter_bytes": sum(p.to_local().nbytes for p in root.parameters())}
    gathered = [None] * env.world_size
    dist.all_gather_object(gathered, figures)
    if env.is_main:
        Path(args.out).write_text(json.dumps(gathered))
    close_distributed(env)


def save_random_model(size: str, folder: Path) -> int:
    """A random tied-embedding Qwen3 of ``size`` saved in float32 to ``folder``; returns its parameter count."""
    from bench.sft_step_time import build_model

    model = build_model(size, seed=0)
    num_params = sum(p.numel() for p in model.parameters())
    needed, free = 1.05 * 4 * num_params, shutil.disk_usage(folder).free
    if needed > free:
        raise SystemExit(f"{folder}: the {size} model needs {needed / GIB:.1f} GiB on disk, {free / GIB:.1f} GiB "
                         "free; pass --tmp-dir on a larger disk, or --model-dir")
    model.save_pretrained(folder)
    return num_params


def launch(variant: str, args: argparse.Namespace, model_dir: Path, out: Path) -> list[dict]:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--standalone", f"--nproc_per_node={args.nproc}", "-m", "bench.sft_load_memory",
               "--worker", variant, "--model-dir", str(model_dir), "--method", args.method, "--out", str(out)]
    subprocess.run(command, check=True)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", help="a shape of bench.sft_step_time.SIZES")
    parser.add_argument("--method", default="eksft", help="an sft/method name (which models are loaded)")
    parser.add_argument("--nproc", type=int, default=2, help="gloo ranks")
    parser.add_argument("--model-dir", help="an existing HF folder instead of a random model")
    parser.add_argument("--tmp-dir", help="where the random model and results go (default: the system temp dir)")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    with tempfile.TemporaryDirectory(prefix="sft_load_memory_", dir=args.tmp_dir) as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else Path(tmp) / "model"
        if not args.model_dir:
            model_dir.mkdir()
            started = time.perf_counter()
            num_params = save_random_model(args.size, model_dir)
            print(f"random {args.size} model ({num_params / 1e6:.1f}M parameters) saved in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        disk_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
        results = {variant: launch(variant, args, model_dir, Path(tmp) / f"{variant}.json") for variant in VARIANTS}

    print(f"model {args.model_dir or args.size}: {disk_bytes / GIB:.2f} GiB of safetensors; method {args.method}, "
          f"{args.nproc} gloo ranks, float32; peak RSS = ru_maxrss")
    print(f"{'variant':8s} {'rank':>4s} {'RSS after imports':>18s} {'peak RSS':>9s} {'own shards':>11s} "
          f"{'load':>7s}")
    for variant, ranks in results.items():
        for figures in ranks:
            print(f"{variant:8s} {figures['rank']:4d} {figures['rss_after_imports'] / GIB:14.2f} GiB "
                  f"{figures['peak_rss'] / GIB:5.2f} GiB {figures['local_parameter_bytes'] / GIB:7.2f} GiB "
                  f"{figures['load_s']:6.1f} s")
    for rank in range(args.nproc):
        before, after = (results[variant][rank]["peak_rss"] for variant in VARIANTS)
        print(f"rank {rank}: sharded / full peak RSS = {after / before:.2f} ({(before - after) / GIB:.2f} GiB less)")


if __name__ == "__main__":
    main()
