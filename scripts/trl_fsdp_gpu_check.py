"""TokenLossSFTTrainer under FSDP2 on one GPU: EKSFT for a few steps as one process under ``accelerate launch`` with
FSDP2, and as a plain process; their per-step losses must agree (fp32: 1e-4 relative, bf16: 3e-2). About a minute
on an H100, mostly imports; accelerate never selects FSDP on a CPU, so this path has no CPU test (docs/trl.md).

    python scripts/trl_fsdp_gpu_check.py [--steps 5] [--precisions fp32 bf16]   # one CUDA GPU, exit 0 when they agree
    python scripts/trl_fsdp_gpu_check.py --dry-run                             # any machine: the commands only

Needs torch, transformers, accelerate and the ``trl`` extra (trl==1.12.0) beside the project's base dependencies.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}
"""Largest relative difference of a step's loss between the FSDP2 and the plain run."""
ROWS = [("Compute 3 + 4 * 5.", "4 * 5 = 20. 3 + 20 = 23. The answer is \\boxed{23}."),
        ("What is \\frac{1}{2} + \\frac{1}{3}?", "The answer is \\boxed{\\frac{5}{6}}."),
        ("Evaluate \\sqrt{16} - 2^{3}.", "We get 4 - 8 = -4, so \\boxed{-4}."),
        ("Let x = 12. What is x^2?", "x^2 = 144, and the final answer is \\boxed{144}.")]


def fsdp2_launch(precision: str) -> list[str]:
    """``accelerate launch`` of one process with FSDP2: each decoder layer a unit, the model the root unit."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
            "--mixed_precision", "bf16" if precision == "bf16" else "no", "--dynamo_backend", "no",
            "--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
            "--fsdp_transformer_layer_cls_to_wrap", "Qwen3DecoderLayer", "--fsdp_reshard_after_forward", "true",
            "--fsdp_state_dict_type", "SHARDED_STATE_DICT", "--fsdp_cpu_ram_efficient_loading", "false"]


def commands(model_dir: Path, out_dir: Path, precision: str, steps: int) -> dict[str, list[str]]:
    """The plain and the FSDP2 run of one precision, each writing ``<out_dir>/<run>-<precision>.json``."""
    worker = [str(Path(__file__).resolve()), "--worker", "--model", str(model_dir), "--steps", str(steps),
              "--precision", precision]
    return {"plain": [sys.executable, *worker, "--out", str(out_dir / f"plain-{precision}.json")],
            "fsdp2": [*fsdp2_launch(precision), *worker, "--expect-fsdp", "--out",
                      str(out_dir / f"fsdp2-{precision}.json")]}


def train(model_dir: str, precision: str, steps: int, expect_fsdp: bool, out: str) -> None:
    """EKSFT, batch 2 × accumulation 2, a frozen reference copy; writes the per-step losses."""
    import torch
    from datasets import Dataset
    from torch.distributed.fsdp import FSDPModule
    from trl import SFTConfig

    from common.models import load_causal_lm, load_tokenizer
    from sft.integrations.trl import TokenLossSFTTrainer

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q, _ in ROWS] * 8,
                                 "completion": [[{"role": "assistant", "content": a}] for _, a in ROWS] * 8})
    args = SFTConfig(output_dir=str(Path(out).parent / Path(out).stem), max_steps=steps, per_device_train_batch_size=2,
                     gradient_accumulation_steps=2, learning_rate=1e-4, logging_steps=1, save_strategy="no",
                     report_to="none", bf16=precision == "bf16", seed=0)
    torch.backends.cuda.matmul.allow_tf32 = False
    trainer = TokenLossSFTTrainer(load_causal_lm(model_dir), args=args, train_dataset=dataset,
                                  processing_class=load_tokenizer(model_dir), token_loss="eksft",
                                  token_loss_options={"rho": 0.2})
    if trainer.is_fsdp_enabled != expect_fsdp:
        raise SystemExit(f"FSDP enabled: {trainer.is_fsdp_enabled}, expected {expect_fsdp}")
    trainer.train()
    sharded = isinstance(trainer.model_wrapped, FSDPModule) and isinstance(trainer.loss_root.reference, FSDPModule)
    if expect_fsdp and not sharded:
        raise SystemExit("the policy or the reference is not an FSDP2 module")
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    Path(out).write_text(json.dumps({"losses": losses, "fsdp2": sharded,
                                     "iou": [e["stats/iou"] for e in trainer.state.log_history if "loss" in e]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", choices=sorted(TOLERANCE), default=["fp32", "bf16"])
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--expect-fsdp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        train(cli.model, cli.precision, cli.steps, cli.expect_fsdp, cli.out)
        return
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        model_dir = work / "tiny"
        runs = {precision: commands(model_dir, work, precision, cli.steps) for precision in cli.precisions}
        if cli.dry_run:
            for precision, pair in runs.items():
                for name, command in pair.items():
                    print(f"{name} {precision}: {' '.join(command)}")
            return
        from bench.tiny_model import build_tiny_qwen3

        build_tiny_qwen3(model_dir, hidden_size=256, num_layers=4, dtype="float32")
        failures = []
        for precision, pair in runs.items():
            for command in pair.values():
                subprocess.run(command, cwd=REPO, check=True)
            plain, fsdp2 = (json.loads((work / f"{name}-{precision}.json").read_text())["losses"]
                            for name in ("plain", "fsdp2"))
            worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(plain, fsdp2))
            ok = len(plain) == len(fsdp2) == cli.steps and worst <= TOLERANCE[precision]
            print(f"{precision}: plain {plain}\n{precision}: fsdp2 {fsdp2}\n{precision}: largest relative "
                  f"difference {worst:.2e} (tolerance {TOLERANCE[precision]:.0e}) {'OK' if ok else 'FAILED'}")
            failures += [] if ok else [precision]
        if failures:
            raise SystemExit(f"FSDP2 and plain losses disagree: {failures}")


if __name__ == "__main__":
    main()
