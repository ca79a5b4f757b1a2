"""What the evaluation stage's two benchmark families share (the math benchmarks of :mod:`eval.run`, the BFCL
categories of :mod:`eval.bfcl.evaluate`): the model a run evaluates, the benchmarks it selects, the one resumable
sampling loop that writes ``samples.jsonl``, and the wandb summary.

The loop (:func:`sample_problems`): a fresh run deletes the file; a resumed one keeps every problem whose ``n``
samples are all there (:func:`read_finished`) and samples only the others, ``eval.problems_per_batch`` × engines
problems per generate call, with the seed ``derive_seed(seed, "eval/<benchmark>/<problem id>")`` per problem. Each
problem's records are appended, flushed and fsynced as soon as its batch returns, so a crash or Ctrl-C loses no
finished problem. It also returns how long its generate calls took and how many tokens they generated (the
manifest's ``details.sampling``, read by ``bench/stage_overhead.py``).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from common.config import Config
from common.manifest import Manifest, StageInputError, require_complete
from common.paths import (EVAL_METRICS_FILE, HELDOUT_NLL_DIR, base_run, eval_dir, evaluated_run, hf_export_dir,
                          report_benchmarks, trained_method)
from common.seeding import derive_seed
from common.tracking import progress, start_wandb
from eval.sample import Completion, LazySampler, engine_count

Problem = TypeVar("Problem")


# ------------------------------------------------------------------------------------------------ inputs
def resolve_model(cfg: Config) -> tuple[str, dict[str, Any]]:
    """What to load (HF folder or hub id) and what the evaluation's manifests record of it: ``model`` (that path and
    the upstream run folder whose complete manifest vouches for it: :func:`common.paths.evaluated_run`, the one the
    plan hands down, or the toy base model's run) and ``sft_method``, read from that manifest (None for a base model
    and for ``eval.model_path``)."""
    upstream = None if cfg.eval.model_path else evaluated_run(cfg)
    if upstream is None and not cfg.eval.model_path and (base := base_run(cfg)) is not None:
        upstream = base.directory
    if upstream is not None:
        require_complete(upstream, f"model to evaluate ({cfg.eval.phase} {cfg.eval.variant})")
        path = str(hf_export_dir(upstream))
    else:
        path = cfg.eval.model_path or cfg.model.path
    method = trained_method(upstream)
    return path, {"model": {"path": path, "upstream_run": str(upstream) if upstream is not None else None},
                  "sft_method": asdict(method) if method is not None else None}


def benchmark_names(cfg: Config) -> list[str]:
    """``eval.benchmarks`` (names from ``data.benchmarks`` or ``data.extra_benchmarks``, checked when the config is
    validated), else every one of ``data.benchmarks``: :func:`common.paths.report_benchmarks`."""
    return report_benchmarks(cfg)


# ----------------------------------------------------------------------------------------------- samples
def read_finished(path: Path, n: int) -> dict[str, list[dict[str, Any]]]:
    """Problems with all ``n`` samples in ``path``; the lines of unfinished problems are removed from the file.

    A torn last line (a crash mid-write) is dropped; a malformed line elsewhere raises, naming the line.
    """
    if not path.exists():
        return {}
    by_problem: dict[str, list[dict[str, Any]]] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for line_number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            by_problem.setdefault(record["problem_id"], []).append(record)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            if line_number == len(lines):
                break
            raise StageInputError(f"{path}:{line_number}: malformed sample record ({exc}); "
                                  "delete the file to re-sample this benchmark") from exc
    finished = {pid: sorted(records, key=lambda r: r["sample_index"]) for pid, records in by_problem.items()
                if sorted(r["sample_index"] for r in records) == list(range(n))}
    if sum(len(r) for r in finished.values()) != len(lines):
        write_samples(path, finished)
    return finished


def write_samples(path: Path, by_problem: dict[str, list[dict[str, Any]]]) -> None:
    """Replaces ``path`` with the records of ``by_problem`` (in its order), atomically (temp file + ``os.replace``)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for records in by_problem.values()
                           for r in records), encoding="utf-8")
    os.replace(tmp, path)


def in_batches(items: list, size: int) -> Iterator[list]:
    """``items`` in consecutive slices of ``size`` (the last may be shorter)."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def sample_problems(cfg: Config, benchmark: str, samples_path: Path, problems: Sequence[Problem], n: int,
                    engine: LazySampler, *, resumed: bool, problem_id: Callable[[Problem], str],
                    prompt_ids: Callable[[Problem], list[int]],
                    score: Callable[[Problem, list[Completion], int], list[dict[str, Any]]],
                    unit: str = "problem") -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Problem id → its ``n`` scored records (``score(problem, completions, seed)``, one per sample), for every one
    of ``problems``: those already in ``samples_path`` when ``resumed``, the others sampled and appended (the
    module docstring has the rule); and this call's ``{"seconds", "generated_tokens"}`` of generation (the engine's
    start excluded)."""
    if not resumed:
        samples_path.unlink(missing_ok=True)
    finished = read_finished(samples_path, n)
    todo = [problem for problem in problems if problem_id(problem) not in finished]
    if finished:
        print(f"[eval/{benchmark}] {len(finished)} of {len(problems)} {unit}s already sampled; "
              f"sampling the other {len(todo)}")
    if todo:
        engine.sampler()  # started before the bar, whose rate and ETA then measure sampling alone
    bar = progress(total=len(problems), initial=len(finished), desc=f"eval {cfg.eval.variant}/{benchmark}",
                   enabled=cfg.logging.progress, unit=unit)
    sampling = {"seconds": 0.0, "generated_tokens": 0}
    with bar, open(samples_path, "a", encoding="utf-8") as samples:
        for batch in in_batches(todo, cfg.eval.problems_per_batch * engine_count(cfg)):
            seeds = [derive_seed(cfg.seed, f"eval/{benchmark}/{problem_id(problem)}") for problem in batch]
            sampler = engine.sampler()
            started = time.perf_counter()
            ticked = [0]  # problems the engine reported done while it sampled the batch (it may report none)

            def tick() -> None:
                ticked[0] += 1
                bar.update(1)

            completions = sampler.sample([prompt_ids(problem) for problem in batch], seeds, n, finished=tick)
            sampling["seconds"] += time.perf_counter() - started
            sampling["generated_tokens"] += sum(c.num_tokens for per_problem in completions for c in per_problem)
            bar.update(len(batch) - ticked[0])
            for problem, seed, problem_completions in zip(batch, seeds, completions):
                records = score(problem, problem_completions, seed)
                samples.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
                samples.flush()
                os.fsync(samples.fileno())
                finished[problem_id(problem)] = records
    return finished, sampling


def backend_record(engine: LazySampler, manifest: Manifest) -> dict[str, Any]:
    """The sampling backend's name, version and settings: from the engine when this run started one, else what the
    manifest recorded before (a run whose problems were all sampled already starts none)."""
    if engine.started is not None:
        return {"name": engine.started.backend, "version": engine.started.version,
                "max_model_len": engine.max_model_len, "start_s": engine.start_s, **engine.started.settings}
    return manifest.details.get("backend", {})


def add_benchmark(summary: Manifest, cfg: Config, benchmark: str, manifest: Manifest) -> None:
    """Adds one benchmark's run to the stage's summary manifest: its headline metrics and folder; an incomplete run
    gives the summary its status."""
    summary.metrics[benchmark] = manifest.metrics
    summary.outputs[str(eval_dir(cfg, benchmark))] = f"{benchmark}: samples, metrics, manifest"
    if not manifest.complete:
        summary.status = manifest.status


def result_lines(cfg: Config, summary: Manifest) -> list[str]:
    """Where one evaluation's results are, one line per benchmark: its headline numbers (avg@n and pass@n; a BFCL
    category's accuracy and counts) and its ``metrics.json``."""
    lines = []
    for benchmark, metrics in summary.metrics.items():
        if benchmark == HELDOUT_NLL_DIR or "n" not in metrics:
            continue
        n = metrics["n"]
        if "accuracy" in metrics:
            headline = f"accuracy {metrics['accuracy']:.1f}% ({metrics['correct']}/{metrics['total']})"
        else:
            headline = ", ".join(f"{key} {metrics[key]:.3f}" for key in (f"avg@{n}", f"pass@{n}") if key in metrics)
        lines.append(f"{benchmark}: {headline} over {metrics['num_problems']} problems -> "
                     f"{eval_dir(cfg, benchmark) / EVAL_METRICS_FILE}")
    return lines


# ------------------------------------------------------------------------------------------------- wandb
def log_to_wandb(cfg: Config, summary: Manifest, model_record: dict[str, Any], directory: Path) -> None:
    """Under ``logging.wandb_mode`` (nothing when disabled): one wandb run ``<experiment>/eval_<phase>/<variant>`` in
    the experiment's group with each benchmark's headline metrics as ``<benchmark>/<metric>`` (avg@n, pass@k,
    truncation and no-answer rates, mean response tokens) and the same as the table ``eval/metrics``."""
    name = f"{cfg.experiment.name}/eval_{cfg.eval.phase}/{cfg.eval.variant}"
    tracker = start_wandb(cfg.logging.wandb_mode, project=cfg.logging.wandb_project, group=cfg.experiment.name,
                          name=cfg.logging.run_name or name,
                          config={"eval": asdict(cfg.eval), "model": model_record, "seed": cfg.seed},
                          directory=directory)
    if tracker is None:
        return
    import wandb

    rows = [[benchmark, key, value] for benchmark, metrics in summary.metrics.items() for key, value in metrics.items()
            if isinstance(value, (int, float))]
    tracker.log({f"{benchmark}/{key}": value for benchmark, key, value in rows})
    tracker.log({"eval/metrics": wandb.Table(columns=["benchmark", "metric", "value"], data=rows)})
    tracker.finish()
