"""The paper profile's GPU path on one GPU, meant to take under 8 minutes on an H100: run by ``scripts/gpu_smoke.sh``.

Needs a CUDA torch, transformers and the project's base dependencies (no vLLM, no verl). Parts:

* A, head gradient: a 2-layer Qwen3 at Qwen3-4B width (2560) with the real 151,936-token vocabulary, tied and untied
  head, 8,192 and 20,480 tokens, SFT and EKSFT: the LM-head weight gradient of the trainer's chunked bf16 head
  (chunk 256) and of plain bf16 autograd against fp64 (``bench.head_grad_accuracy``). Passes when the chunked
  head's error is within 2x plain autograd's (:data:`HEAD_TOLERANCE`).
* B, memory and time: the trainer's step (``sft.trainer.train_step``, FSDP2 on one rank, bf16 mixed precision,
  the frozen models stored in bf16 as in the paper profile, activation checkpointing, chunk 256) on one
  20,480-token sequence, EKSFT (live reference) and PSFT (old policy), each trainer released before the next
  (``bench.sft_step_time.release``), 2 and 4 layers of the Qwen3-8B shape (untied head), inside
  ``sdpa_kernel(FLASH_ATTENTION)`` so that a fallback from the flash kernel raises. Memory splits as in ``bench.longest_sequence``; the sharded part and the activation
  part are extrapolated linearly in the layer count to 36 layers and divided as FSDP2 divides them on 8 GPUs.
  Passes when that per-GPU estimate is under 70 GB.
* C, trainer: ``sft.train`` under torchrun (1 rank, NCCL) for 2 EKSFT steps on an untied random Qwen3 with the real
  vocabulary, checkpoint every step, verified export; then the same run crashed after step 1 resumes from that
  checkpoint and must end complete with the uninterrupted run's weights (within bf16 round-off).

Prints the CUDA, driver and NCCL versions and writes one JSON results file (``--out``). ``--dry-run`` runs on the CPU
in under a minute: argument parsing, imports, the shapes and parameter counts of A and B, A and B on tiny CPU sizes through
the same code, and C's configuration and command (not run).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import tempfile
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "integration")]  # the project, and the SFT test helpers (part C)

from bench.head_grad_accuracy import head_grad_errors  # noqa: E402
from bench.longest_sequence import measure  # noqa: E402
from bench.sft_step_time import build_model, build_trainer, release  # noqa: E402
from bench.sft_step_time import parse_args as trainer_args  # noqa: E402

GB = 1e9
QWEN3_VOCAB = 151_936
HEAD_TOKENS = (8192, 20480)
HEAD_CHUNK = 256
HEAD_TOLERANCE = 2.0
"""Part A passes when the chunked head's error is at most this times plain bf16 autograd's: the per-chunk bf16
products and the final cast add to plain autograd's one rounding (1.2-1.4x measured on CPUs); a bf16 running sum
over the chunks was 4-5x."""
STEP_TOKENS = 20480
STEP_LAYERS = (2, 4)
FULL_LAYERS, GPUS = 36, 8
LIMIT_GB = 70.0
"""Part B passes when the 36-layer, 8-GPU per-GPU estimate is under this."""
TRAINER_STEPS = 2


def versions() -> dict:
    from common.preflight import nvidia_driver_version

    cuda = torch.cuda.is_available()
    nccl = torch.cuda.nccl.version() if cuda else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "driver": nvidia_driver_version(),
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "gpu": torch.cuda.get_device_name(0) if cuda else None, "python": platform.python_version()}


def script_start(name: str, dry_run: bool, out: Path | None) -> tuple[str, str, Path]:
    """A GPU script's device (``cuda``; ``cpu`` for ``--dry-run``, exiting in one line when no CUDA GPU is visible),
    its UTC stamp, and its results file: ``out``, or ``runs/<name>/<stamp>[-dry-run].json``."""
    device = "cpu" if dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{name}: no CUDA GPU visible (torch {torch.__version__}); --dry-run checks the script on a CPU")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return device, stamp, out or REPO / "runs" / name / f"{stamp}{'-dry-run' if dry_run else ''}.json"


def flash_only(device: str):
    """SDPA restricted to the flash kernel on CUDA: a call the flash kernel cannot take raises."""
    if device != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


# ------------------------------------------------------------------------------------------------------- part A
def part_a(device: str, dry_run: bool) -> dict:
    from common.config.sft import EKSFTMethod, SFTMethod
    from sft.losses import build_loss

    width = dict(hidden_size=2560, intermediate_size=9728, num_heads=32, num_kv_heads=8, head_dim=128,
                 vocab_size=QWEN3_VOCAB) if not dry_run else dict(hidden_size=64, intermediate_size=128, num_heads=1,
                                                                   num_kv_heads=1, head_dim=64, vocab_size=512)
    token_counts = HEAD_TOKENS if not dry_run else (256, 320)
    chunk = HEAD_CHUNK if not dry_run else 4
    cases, passed = [], True
    for tied in (True, False):
        with torch.device(device):
            model = build_tiny_trunk(width, tied)
        weight = model.get_output_embeddings().weight.detach()
        for method in (SFTMethod(), EKSFTMethod()):
            loss = build_loss(method)
            for tokens in token_counts:
                hidden, head, labels, ref_hidden, ref_head = head_inputs(model, weight, tokens, loss.needs_reference,
                                                                         device)
                errors = head_grad_errors(loss, hidden, head, labels, chunk, ref_hidden, ref_head)
                ok = errors["chunked"] <= HEAD_TOLERANCE * errors["plain"]
                passed &= ok
                cases.append({"head": "tied" if tied else "untied", "method": method.name, "tokens": tokens,
                              "chunks": -(-tokens // chunk), **errors, "ok": ok})
                print(f"[A] {cases[-1]['head']:6s} {method.name:5s} {tokens:6d} tokens ({cases[-1]['chunks']} "
                      f"chunks): chunked {errors['chunked']:.2e}, plain bf16 autograd {errors['plain']:.2e} -> "
                      f"{'ok' if ok else 'FAIL'}", flush=True)
                del hidden, head, labels, ref_hidden, ref_head
        del model, weight
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"cases": cases, "tolerance": HEAD_TOLERANCE, "ok": passed}


def build_tiny_trunk(width: dict, tied: bool):
    """A 2-layer random Qwen3 in bf16 with ``width``'s shape."""
    from bench.tiny_model import random_qwen3

    return random_qwen3(num_layers=2, dtype="bfloat16", seed=0, tie_word_embeddings=tied, **width).eval()


@torch.no_grad()
def head_inputs(model, weight: torch.Tensor, tokens: int, reference: bool, device: str) -> tuple:
    """(hidden, weight, labels, ref_hidden, ref_weight): the trunk's bf16 final hidden states of random tokens, the
    head, random targets; a perturbed reference (so EKSFT's KL mask is not empty) when ``reference``."""
    generator = torch.Generator(device=device).manual_seed(tokens)
    vocab = weight.shape[0]
    input_ids = torch.randint(0, vocab, (1, tokens), generator=generator, device=device)
    hidden = model.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
    labels = torch.randint(0, vocab, (1, tokens), generator=generator, device=device)
    labels[:, :tokens // 8] = -100
    if not reference:
        return hidden, weight, labels, None, None
    noise = lambda t, scale: (t.float() + scale * torch.randn(t.shape, generator=generator, device=device)  # noqa: E731
                              ).to(t.dtype)
    return hidden, weight, labels, noise(hidden, 0.3), noise(weight, 0.05 * weight.float().std().item())


# ------------------------------------------------------------------------------------------------------- part B
def part_b(device: str, dry_run: bool) -> dict:
    from common.config.sft import EKSFTMethod, PSFTMethod
    from sft.distributed import close_distributed, init_distributed

    size, tokens = ("qwen3-8b", STEP_TOKENS) if not dry_run else ("tiny", 256)
    shapes = {layers: count_parameters(size, layers) for layers in STEP_LAYERS}
    print(f"[B] {size} shape, {STEP_LAYERS} layers: {', '.join(f'{n / 1e9:.3f}B' for n in shapes.values())} "
          f"parameters; {tokens} tokens, chunk {HEAD_CHUNK}, activation checkpointing", flush=True)
    env = init_distributed(device)
    methods, passed = {}, True
    try:
        for method in (EKSFTMethod(), PSFTMethod()):
            rows = {}
            for layers in STEP_LAYERS:
                args = trainer_args(["--size", size, "--chunk-size", str(HEAD_CHUNK), "--micro-batch-size", "1",
                                     "--grad-accum", "1", "--gradient-checkpointing", "--frozen-dtype", "bf16",
                                     "--mixed-precision", "bf16" if device == "cuda" else "fp32"])
                args.layers = layers
                root, optimizer, sft = build_trainer(method, args, env)
                gradients = sum(p.numel() * p.element_size() for p in root.policy.parameters() if p.requires_grad)
                with flash_only(device):
                    row = measure(root, optimizer, sft, env, args, tokens)
                row["gradients"] = gradients
                rows[layers] = row
                print(f"[B] {method.name:5s} {layers} layers: step {row['seconds']:.2f} s, forward/backward peak "
                      f"{row['peak_backward'] / GB:.1f} GB, optimiser peak {row['peak_optimizer'] / GB:.1f} GB",
                      flush=True)
                del root, optimizer, sft
                release(env)
            estimate = extrapolate(rows)
            ok = device != "cuda" or estimate["per_gpu_gb"] < LIMIT_GB
            passed &= ok
            methods[method.name] = {"layers": {str(k): v for k, v in rows.items()}, **estimate, "ok": ok}
            print(f"[B] {method.name:5s} {FULL_LAYERS} layers on {GPUS} GPUs: {estimate['per_gpu_gb']:.1f} GB per GPU "
                  f"(limit {LIMIT_GB:.0f}), one-GPU step of all {FULL_LAYERS} layers about "
                  f"{estimate['step_s_full_one_gpu']:.1f} s -> {'ok' if ok else 'FAIL'}", flush=True)
    finally:
        close_distributed(env)
    return {"size": size, "tokens": tokens, "parameters": {str(k): v for k, v in shapes.items()},
            "methods": methods, "limit_gb": LIMIT_GB, "ok": passed}


def count_parameters(size: str, layers: int) -> int:
    """Parameters of ``layers`` layers of ``size`` (built on the meta device: no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(size, seed=0, num_layers=layers).parameters())


def extrapolate(rows: dict[int, dict]) -> dict:
    """The 36-layer, 8-GPU per-GPU memory from the measured layer counts, each part linear in the layers:
    sharded = static + gradients (divided by the GPUs), activation = forward/backward peak − sharded (not divided),
    optimiser = its step's peak − sharded (divided); per GPU = max(sharded/N + activation, (sharded + optimiser)/N)."""
    (few, low), (many, high) = sorted(rows.items())

    def at_full(value) -> float:
        slope = (value(high) - value(low)) / (many - few)
        return value(high) + slope * (FULL_LAYERS - many)

    sharded = at_full(lambda row: row["static"] + row["gradients"])
    activation = at_full(lambda row: row["peak_backward"] - row["static"] - row["gradients"])
    optimizer = at_full(lambda row: row["peak_optimizer"] - row["static"] - row["gradients"])
    per_gpu = max(sharded / GPUS + activation, (sharded + optimizer) / GPUS)
    return {"sharded_gb": sharded / GB, "activation_gb": activation / GB, "optimizer_gb": optimizer / GB,
            "per_gpu_gb": per_gpu / GB, "step_s_full_one_gpu": at_full(lambda row: row["seconds"])}


# ------------------------------------------------------------------------------------------------------- part C
def trainer_overrides(run_root: Path, model_dir: Path, device: str) -> list[str]:
    profile = ["profile=paper", "profile.nproc_per_node=1"] if device == "cuda" else ["profile=toy"]
    return [*profile, "sft/method=eksft", f"experiment.run_root={run_root}", "experiment.name=gpu_smoke",
            "model.source=hub", f"model.path={model_dir}", "model.name=qwen3_untied", "logging.progress=false",
            "sft.micro_batch_size=2", "sft.grad_accum=1", f"sft.max_steps={TRAINER_STEPS}", "sft.checkpoint_every=1",
            "sft.keep_checkpoints=2", "sft.warmup_ratio=0", "sft.lr=1e-4"]


def part_c(device: str, dry_run: bool, workdir: Path) -> dict:
    from common.config import compose
    from common.manifest import read_manifest, write_manifest
    from common.paths import sft_dir
    from sft.checkpoint import CHECKPOINTS_DIR
    from sft_helpers import final_weights, run_torchrun, sft_command, write_sft_tokens

    model_dir = workdir / "qwen3_untied"
    overrides = trainer_overrides(workdir / "runs", model_dir, device)
    cfg = compose(overrides)
    command = " ".join(sft_command(overrides, nproc=1))
    if dry_run:
        print(f"[C] would build an untied random Qwen3 (vocabulary {QWEN3_VOCAB}) in {model_dir} and run:\n    "
              f"{command}", flush=True)
        return {"command": command, "run_folder": str(sft_dir(cfg)), "ok": True}
    build_untied_model(model_dir)
    write_sft_tokens(cfg, num_rows=2 * TRAINER_STEPS)
    started = time.perf_counter()
    result = run_torchrun(overrides, nproc=1, timeout=600)
    if result.returncode != 0:
        print(result.stdout[-4000:], flush=True)
        return {"command": command, "ok": False, "error": f"torchrun exited {result.returncode}"}
    first = read_manifest(sft_dir(cfg))
    weights = final_weights(cfg)
    print(f"[C] {TRAINER_STEPS} steps and the export in {time.perf_counter() - started:.0f} s; export check "
          f"{first.details['export']['max_abs_logprob_diff']:.3g} (tolerance {first.details['export']['tolerance']})",
          flush=True)

    out_dir = sft_dir(cfg)  # crash after step 1: drop the later checkpoint and the export, mark the run failed
    for checkpoint in (out_dir / CHECKPOINTS_DIR).iterdir():
        if int(checkpoint.name.removeprefix("step_")) > 1:
            shutil.rmtree(checkpoint)
    shutil.rmtree(out_dir / "hf")
    first.status, first.error = "failed", "simulated crash after step 1"
    write_manifest(out_dir, first)
    result = run_torchrun(overrides, nproc=1, timeout=600)
    resumed = read_manifest(out_dir)
    diff = max((weights[name].float() - tensor.float()).abs().max().item()
               for name, tensor in final_weights(cfg).items()) if result.returncode == 0 else math.inf
    ok = (result.returncode == 0 and resumed.complete and resumed.details.get("resumed_from_step") == 1
          and resumed.details["export"]["max_abs_logprob_diff"] <= resumed.details["export"]["tolerance"]
          and "lm_head.weight" in weights and diff <= 1e-2)
    print(f"[C] resumed from step {resumed.details.get('resumed_from_step')}, complete {resumed.complete}, final "
          f"weights within {diff:.2e} of the uninterrupted run -> {'ok' if ok else 'FAIL'}", flush=True)
    return {"command": command, "export": first.details["export"], "resumed_from_step":
            resumed.details.get("resumed_from_step"), "max_abs_weight_diff": diff, "ok": ok}


def build_untied_model(folder: Path) -> None:
    """4 layers, hidden 256, bf16, an LM head of its own (Qwen3-8B's layout), the test tokenizer."""
    from bench.tiny_model import build_tiny_tokenizer, random_qwen3

    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(folder)
    model = random_qwen3(vocab_size=QWEN3_VOCAB, hidden_size=256, num_layers=4, intermediate_size=512,
                         max_position_embeddings=1024, dtype="bfloat16", seed=0, tie_word_embeddings=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)


# ------------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU, in under a minute: imports, shapes, A and B at tiny sizes, C's command")
    parser.add_argument("--parts", nargs="+", choices=("A", "B", "C"), default=["A", "B", "C"],
                        help="the parts to run, in this order (the results file is written after each)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default runs/gpu_smoke/<UTC time>.json)")
    parser.add_argument("--workdir", type=Path, default=None, help="part C's model and runs (default: a temp folder)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, stamp, out = script_start("gpu_smoke", args.dry_run, args.out)
    results = {"date_utc": stamp, "dry_run": args.dry_run, "versions": versions()}
    print("gpu_smoke: " + ", ".join(f"{key} {value}" for key, value in results["versions"].items()), flush=True)
    started = time.perf_counter()

    def save() -> None:  # after every part, so a run stopped at its time limit keeps the parts it finished
        results["seconds"] = time.perf_counter() - started
        results["ok"] = all(results[part]["ok"] for part in args.parts if part in results)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as scratch:
        workdir = args.workdir or Path(scratch)
        parts = {"A": lambda: part_a(device, args.dry_run), "B": lambda: part_b(device, args.dry_run),
                 "C": lambda: part_c(device, args.dry_run, workdir)}
        for part in dict.fromkeys(args.parts):
            part_started = time.perf_counter()
            results[part] = parts[part]()
            results[part]["seconds"] = time.perf_counter() - part_started
            save()
    print(f"gpu_smoke: {'PASSED' if results['ok'] else 'FAILED'} in {results['seconds']:.0f} s; results in {out}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
