"""A tiny fixed toy pipeline whose numbers are recorded in ``tests/assets/golden_numbers.json``.

Toy data (forking world), a 120-step base pretraining, SFT and EKSFT (paper eq.) for 8 steps each, and their
vLLM-CPU evaluation on Fork-Plain (16 problems × 8 samples): every stage's real entry point, in one process, on the
kernels ``profile.cpu_isa`` pins (the process restarts itself with them, as a stage does).

    python tests/integration/golden_pipeline.py --run-root /tmp/golden --threads 2            # prints the numbers
    python tests/integration/golden_pipeline.py --run-root /tmp/golden --threads 1 --record   # rewrites the file

``tests/integration/test_golden_numbers.py`` runs it with 1 thread and compares (:func:`check_against_record`);
``tests/e2e/test_golden_numbers_two_threads.py`` with 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN_FILE = REPO / "tests" / "assets" / "golden_numbers.json"
METHODS = ("sft", "eksft")
BENCHMARK = "toy_fork_plain"
OVERRIDES = [
    "experiment=forking", "profile=toy", "experiment.name=golden", "experiment.seeds=[]", "logging.progress=false",
    "toy.pretrain_steps=150", "toy.pretrain_batch_size=8", "toy.pretrain_seq_len=128", "toy.num_pretrain_docs=1000",
    "toy.pretrain_eval_problems=0", "toy.fork_entropy_problems=0", "toy.num_rows=240",
    "toy.num_benchmark_problems=16", "data.num_sft_rows=64", "data.num_rl_val_rows=8",
    "sft.max_steps=12", "sft.micro_batch_size=8", "sft.grad_accum=1", "sft.checkpoint_every=0",
    f"eval.benchmarks=[{BENCHMARK}]", "eval.n=16", "report.table_k=16", "eval.max_problems=16",
    "eval.problems_per_batch=16",
]


def run_pipeline(run_root: Path, threads: int, extra: list[str] = ()) -> dict[str, float]:
    """Runs every stage (skipping those already complete under ``run_root``) and returns the golden numbers;
    ``extra`` overrides show what a change does to them (e.g. ``toy.pretrain_dtype=bfloat16``)."""
    from common.config import compose
    from common.numerics import pin_this_process
    from common.paths import method_label

    base_overrides = [*OVERRIDES, f"experiment.run_root={run_root}", f"profile.num_threads={threads}", *extra]
    cfg = compose(base_overrides)
    pin_this_process(cfg.profile.device, cfg.profile.cpu_isa)
    from data import prepare, tokenize_sft
    from eval import run as evaluation
    from sft import train
    from toy import base

    numbers: dict[str, float] = {}
    prepare.run(cfg)
    base_manifest = base.run(cfg)
    numbers["base/final_loss"] = base_manifest.metrics["final_loss"]
    tokenize_sft.run(cfg)
    for method in METHODS:
        method_cfg = compose([*base_overrides, f"sft/method={method}"])
        numbers[f"{method}/final_loss"] = train.run(method_cfg).metrics["final_loss"]
        label = method_label(method_cfg.sft.method)
        eval_cfg = compose([*base_overrides, f"sft/method={method}", "eval.phase=sft", f"eval.variant={label}"])
        metrics = evaluation.run(eval_cfg).metrics[BENCHMARK]
        for key in ("pass@1", "pass@16", "mean_token_entropy_nats", "mean_response_tokens"):
            numbers[f"{method}/{BENCHMARK}/{key}"] = metrics[key]
    return numbers


def golden_numbers(stdout: str) -> dict[str, float]:
    """The numbers a run of this script printed (its last ``GOLDEN`` line)."""
    lines = [line for line in stdout.splitlines() if line.startswith("GOLDEN ")]
    assert lines, stdout[-3000:]
    return json.loads(lines[-1].removeprefix("GOLDEN "))


def differences(measured: dict[str, float], golden: dict, tolerance: dict) -> list[str]:
    """Every number missing, extra, or off by more than the relative tolerance (so a recorded 0 must be 0)."""
    problems = sorted(set(golden) ^ set(measured))
    for key in sorted(set(golden) & set(measured)):
        if not math.isclose(measured[key], golden[key], rel_tol=tolerance["relative"], abs_tol=0.0):
            problems.append(f"{key}: {measured[key]!r}, recorded {golden[key]!r} "
                            f"(allowed ±{tolerance['relative']:g} relative)")
    return problems


def check_against_record(run_root: Path, threads: int) -> list[str]:
    """Runs this script in its own process with ``threads`` threads; what differs from the recorded numbers."""
    recorded = json.loads(GOLDEN_FILE.read_text())
    result = subprocess.run([sys.executable, __file__, "--run-root", str(run_root), "--threads", str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:]
    return differences(golden_numbers(result.stdout), recorded["numbers"], recorded["tolerance"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-root", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--record", action="store_true", help=f"write the numbers into {GOLDEN_FILE.name}")
    parser.add_argument("overrides", nargs="*", help="extra config overrides (not with --record)")
    args = parser.parse_args()
    if args.record and args.overrides:
        parser.error("--record writes the fixed pipeline's numbers; drop the extra overrides")
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("WANDB_MODE", "disabled")
    numbers = run_pipeline(args.run_root, args.threads, args.overrides)
    print("GOLDEN " + json.dumps(numbers, sort_keys=True))
    if args.record:
        golden = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.exists() else {}
        golden["numbers"] = numbers
        GOLDEN_FILE.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
