"""Where a toy pipeline's time goes: each stage's start-up against its useful work, and the toy model's sampling
throughput against its compute bound, measured in one run.

    python -m bench.stage_overhead                      # a small demo-shaped pipeline in a tmp run root (~10 min)
    python -m bench.stage_overhead --run-root /tmp/so   # keep (and re-read) the runs; --report-only re-reads them
    python -m bench.stage_overhead --compare-size 2 toy.pretrain_steps=20 sft.max_steps=2 rl.total_steps=1 ...

Trailing Hydra overrides follow the bench's own (smaller budgets: the test suite's tiny run).

The pipeline is the forking world's (toy profile) at small budgets, one seed, EKSFT only, run by the orchestrator one command at a
time (``experiment.parallel=1``), so each stage's wall time is its own. Per command:

* wall: ``launch.json`` (process start to exit, as the orchestrator timed it);
* useful work: base and SFT, the optimiser steps (first to last ``metrics.jsonl`` record, extended by one step's
  mean); evaluation, the engine's generate calls (manifest ``details.sampling``); DAPO, verl's ``timing_s/step``;
* the rest (imports, engine and Ray start-up, export, teardown) is overhead.

Sampling throughput is generated tokens per second of generation: evaluation from ``details.sampling``; DAPO from
each step's ``timing_s/gen`` and its generated tokens ≈ (groups kept + groups evicted) × ``rl.rollout_n`` ×
``response_length/mean`` (evicted groups assumed as long as the kept ones). The compute bound is what the model's
matmuls would allow at the machine's measured single-thread fp32 GEMM rate (the engines sample with one thread):
FLOPs per generated token = 2 × (decoder weights + LM head) + 4 × layers × attention width × mean context.

Last, the evaluation's batch settings in one run: the SFT model's Fork-Carry prompts (32 problems × n = 32, or
``--compare-size`` of each) sampled with the settings evaluation used before (8 problems per generate call, vLLM's
default 256 sequences at once) and with the toy profile's (32 problems per call, ``eval.max_num_seqs=1024``), their
tokens/s ratio, and whether the sampled tokens agree.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OVERRIDES = [
    "experiment=forking", "profile=toy", "experiment.name=bench", "experiment.seeds=[]", "experiment.parallel=1",
    "logging.progress=false", "experiment.stages=[data,base,sft,eval_sft,rl,eval_rl]", "experiment.methods=[eksft]",
    "experiment.rl_methods=[eksft]", "experiment.rl_from_base=false", "toy.pretrain_steps=200", "sft.max_steps=20",
    "eval.max_problems=16", "rl.total_steps=3", "rl.save_freq=3",
]


MEAN_CONTEXT = 100
"""Tokens of context per generated token assumed for the attention FLOPs (toy prompts ~45 tokens, responses
~40-110)."""


def run_pipeline(run_root: Path, overrides: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline.run", *OVERRIDES, *overrides, f"experiment.run_root={run_root}"],
                   check=True)
    return time.perf_counter() - started


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def step_seconds(records: list[dict]) -> float:
    """Time of the optimiser steps from their records' timestamps: first to last, plus one mean step."""
    times = [r["time"] for r in records if "loss" in r and "time" in r]
    if len(times) < 2:
        return 0.0
    return (times[-1] - times[0]) * len(times) / (len(times) - 1)


def stage_rows(run_root: Path) -> tuple[list[dict], list[dict]]:
    """Per launched command: stage, wall, useful work; and the sampling records (evaluation and DAPO)."""
    from common.manifest import read_manifest

    rows, sampling = [], []
    for launch in sorted(run_root.rglob("launch.json"), key=lambda p: p.stat().st_mtime):
        folder, wall = launch.parent, json.loads(launch.read_text())["wall_s"]
        manifests = [read_manifest(m.parent) for m in sorted(folder.glob("*/manifest.json"))] or \
            [read_manifest(folder)]
        stage = manifests[0].stage
        if stage in ("base", "sft"):
            work = step_seconds(read_jsonl(folder / "metrics.jsonl"))
        elif stage.startswith("eval"):
            records = [m.details.get("sampling", {}) for m in manifests]
            work = sum(r.get("seconds", 0.0) for r in records)
            tokens = sum(r.get("generated_tokens", 0) for r in records)
            sampling.append({"where": f"evaluation {folder.name}", "tokens": tokens, "seconds": work})
        elif stage == "rl":
            steps = [r for r in read_jsonl(folder / "metrics.jsonl") if "timing_s/step" in r]
            work = sum(r["timing_s/step"] for r in steps)
            sampling.append({"where": f"DAPO rollouts {folder.name}", "seconds": sum(r["timing_s/gen"] for r in steps),
                             "tokens": sum(rollout_tokens(r, manifests[0].config["rl"]) for r in steps)})
        else:
            work = 0.0
        rows.append({"stage": stage, "run": folder.name, "wall_s": wall, "work_s": work})
    return rows, sampling


def rollout_tokens(record: dict, rl: dict) -> float:
    groups = rl["train_batch_size"] + record.get("training/filter_groups/evicted_samples", 0)
    return groups * rl["rollout_n"] * record["response_length/mean"]


def flops_per_token(model_dir: Path, mean_context: float) -> float:
    """2 × matmul weights (decoder + LM head) + the attention scores and mixing at ``mean_context`` tokens."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * config.intermediate_size
    return 2 * (layers * per_layer + vocab * d) + 4 * layers * q * mean_context


def gemm_flops_per_s(hidden: int, intermediate: int, rows: int = 256, seconds: float = 2.0) -> float:
    """Single-thread fp32 GEMM rate at the model's MLP shape ([rows × hidden] @ [hidden × intermediate]), per CPU
    second of this process (so another job on the machine does not lower it)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(rows, hidden), torch.randn(hidden, intermediate)
    for _ in range(10):
        a @ b
    calls, started = 0, time.process_time()
    while time.process_time() - started < seconds:
        a @ b
        calls += 1
    return 2 * rows * hidden * intermediate * calls / (time.process_time() - started)


BATCH_SETTINGS = {"before: 8 problems per call, 256 sequences": (8, 256),
                  "now: 32 problems per call, 1024 sequences": (32, 1024)}
"""Evaluation batch settings compared by :func:`compare_batch_settings`: (problems per generate call, max_num_seqs)."""


def compare_batch_settings(run_root: Path, overrides: list[str], problems: int = 32, n: int = 32) -> None:
    """Samples the same prompts under each of :data:`BATCH_SETTINGS` in this process (one engine after the other) and
    prints tokens/s, the ratio to the first, and whether the sampled texts are the same."""
    from common.config import compose
    from common.models import load_tokenizer
    from common.seeding import derive_seed
    from eval.sample import VLLMSampler, configure_vllm_cpu_environment, render_prompt

    configure_vllm_cpu_environment()
    model = str(next(run_root.glob("bench/sft/toy/*/hf")))
    rows = read_jsonl(next(run_root.glob("bench/data/*/benchmarks/toy_fork_carry.jsonl")))[:problems]
    tokenizer = load_tokenizer(model)
    prompts = [tokenizer(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"]
               for row in rows]
    seeds = [derive_seed(0, f"eval/toy_fork_carry/{row['id']}") for row in rows]
    print(f"\nevaluation batch settings ({problems} Fork-Carry problems x n = {n}, the SFT model, one engine each; "
          "tokens per wall second, and per CPU second of this process):")
    first, texts = None, None
    for name, (per_call, max_num_seqs) in BATCH_SETTINGS.items():
        cfg = compose([*OVERRIDES, *overrides, f"eval.max_num_seqs={max_num_seqs}"])
        sampler = VLLMSampler(model, cfg, max_model_len=cfg.eval.max_tokens + max(map(len, prompts)))
        wall, cpu, sampled = time.perf_counter(), time.process_time(), []
        for start in range(0, problems, per_call):
            sampled += sampler.sample(prompts[start:start + per_call], seeds[start:start + per_call], n)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        sampler.close()
        tokens = sum(c.num_tokens for per_problem in sampled for c in per_problem)
        these = [c.text for per_problem in sampled for c in per_problem]
        first = first or tokens / cpu
        same = "" if texts is None else f"   same tokens: {these == texts}"
        texts = texts or these
        print(f"  {name:44} {tokens / wall:7.0f} /wall s {tokens / cpu:7.0f} /CPU s   x{tokens / cpu / first:.2f}{same}")


def report(run_root: Path, total_s: float | None) -> None:
    from transformers import AutoConfig

    rows, sampling = stage_rows(run_root)
    print(f"{'stage':10} {'run':34} {'wall s':>8} {'work s':>8} {'overhead s':>10} {'overhead':>9}")
    for row in rows:
        overhead = row["wall_s"] - row["work_s"]
        print(f"{row['stage']:10} {row['run'][:34]:34} {row['wall_s']:8.1f} {row['work_s']:8.1f} {overhead:10.1f} "
              f"{overhead / row['wall_s']:9.0%}")
    wall, work = sum(r["wall_s"] for r in rows), sum(r["work_s"] for r in rows)
    print(f"{'all':10} {'':34} {wall:8.1f} {work:8.1f} {wall - work:10.1f} {(wall - work) / wall:9.0%}"
          + (f"   (pipeline wall {total_s:.0f} s)" if total_s else ""))
    model_dir = next(run_root.glob("cache/base/*/hf"))
    config = AutoConfig.from_pretrained(model_dir)
    rate = gemm_flops_per_s(config.hidden_size, config.intermediate_size)
    print(f"\nsingle-thread fp32 GEMM ({config.hidden_size} x {config.intermediate_size}): {rate / 1e9:.1f} GFLOP per "
          "CPU second; sampling below is per wall second, so a loaded machine lowers its share")
    for record in sampling:
        if not record["seconds"]:
            continue
        tokens_per_s = record["tokens"] / record["seconds"]
        bound = rate / flops_per_token(model_dir, MEAN_CONTEXT)
        print(f"{record['where'][:48]:48} {tokens_per_s:8.0f} tokens/s   compute bound {bound:8.0f} tokens/s   "
              f"{tokens_per_s / bound:6.1%} of it")
    print(f"(compute bound: FLOPs per token at a mean context of {MEAN_CONTEXT} tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-root", type=Path, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--report-only", action="store_true", help="re-read the runs under --run-root")
    parser.add_argument("--compare-size", type=int, default=32,
                        help="Fork-Carry problems, and samples of each, in the batch-settings comparison")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides after the bench's own (e.g. smaller budgets)")
    args = parser.parse_args()
    if args.report_only:
        report(args.run_root, None)
        compare_batch_settings(args.run_root, args.overrides, args.compare_size, args.compare_size)
        return
    with tempfile.TemporaryDirectory() as tmp:
        run_root = args.run_root or Path(tmp)
        report(run_root, run_pipeline(run_root, args.overrides))
        compare_batch_settings(run_root, args.overrides, args.compare_size, args.compare_size)


if __name__ == "__main__":
    main()
