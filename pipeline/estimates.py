"""What a plan will cost before it starts, printed by the orchestrator (the dry run, and every run before its first
stage): on the toy profile its time on a 2-core CPU, on a GPU profile the GPU-hours of its SFT runs. Each figure is a
measured rate times the plan's size, and says which measurement it stands on.

* Toy profile: the sum over the runs of the pending commands of :data:`TOY_STAGE_SECONDS` (a run's work in the demo's
  quiet run on 2 cores), two commands at a time scaled by that run's measured wall / work share.
* GPU profiles, SFT: ``6 · P · tokens / (MFU · peak)`` per SFT run, P the base model's parameters
  (:func:`common.preflight.model_parameters`), tokens at most ``data.num_sft_rows × sft.epochs`` rows (or
  ``sft.max_steps`` steps of ``micro_batch_size × grad_accum × nproc_per_node × nnodes`` rows) of ``data.max_length``
  tokens: an upper bound, as rows are shorter than the limit. EKSFT-family runs (they compute entropy and KL over the
  vocabulary) cost :data:`EKSFT_STEP_RATIO` times an SFT step. RL and evaluation are generation-bound and have no
  measured rate on a GPU yet: not estimated.
"""
from __future__ import annotations

from typing import Iterable

from common.preflight import model_parameters
from pipeline.stages import StageCommand

TOY_STAGE_SECONDS = {"data": 7, "base": 383, "tokens": 10, "sft": 112, "eval_sft": 27, "rl": 669, "eval_rl": 20,
                     "report": 22}
"""Seconds of work per run of each stage (a run's ``RunSpec.stage``): `make demo` from an empty run root on a 2-core
AMD EPYC (avx2), 2 SFT runs, 9 Table 1 evaluations, 2 DAPO runs of 8 steps side by side, 6 Table 2 evaluations
(docs/results/2026-11-27-demo-time.md: each stage's "finished in" over its runs)."""
TOY_WALL_PER_WORK = 1400 / 2347
"""That run's wall time over its summed work with two commands at a time (``experiment.parallel=2``)."""
SFT_MFU = 0.314
"""SFT's model FLOPs utilisation with compiled layers, one H200 (docs/results/2026-11-27-sft-compiled-gpu.md)."""
PEAK_FLOPS = 989e12
"""Dense bf16 peak of an H100 / H200 SXM, the MFU's denominator in that measurement."""
EKSFT_STEP_RATIO = 1.48
"""EKSFT's step time over SFT's with compiled layers, live statistics, same measurement."""


def toy_minutes(commands: Iterable[StageCommand], parallel: int) -> float:
    """Minutes the ``commands`` take on a 2-core CPU (:data:`TOY_STAGE_SECONDS` per run); two at a time scaled by the
    demo's :data:`TOY_WALL_PER_WORK`."""
    work = sum(TOY_STAGE_SECONDS.get(run.stage, 0) for command in commands for run in command.runs)
    return work * (TOY_WALL_PER_WORK if parallel > 1 else 1.0) / 60


def sft_gpu_hours(commands: Iterable[StageCommand]) -> float | None:
    """GPU-hours of the SFT runs among ``commands``, an upper bound (module docstring); None when a model's size is
    unknown."""
    total = 0.0
    for command in commands:
        if command.stage != "sft":
            continue
        cfg = command.config
        params = model_parameters(cfg)
        if params is None:
            return None
        rows = cfg.data.num_sft_rows * cfg.sft.epochs
        if cfg.sft.max_steps > 0:
            per_step = cfg.sft.micro_batch_size * cfg.sft.grad_accum * cfg.profile.nproc_per_node * cfg.profile.nnodes
            rows = min(rows, cfg.sft.max_steps * per_step)
        ratio = EKSFT_STEP_RATIO if cfg.sft.method.name.startswith("eksft") else 1.0
        total += 6 * params * rows * cfg.data.max_length * ratio / (SFT_MFU * PEAK_FLOPS) / 3600
    return total


def estimate_line(commands: list[StageCommand], profile: str, parallel: int) -> str:
    """One line: the toy plan's minutes, or the GPU plan's SFT GPU-hours (both from :mod:`pipeline.estimates`)."""
    if not commands:
        return "estimate: nothing to run"
    if profile == "toy":
        return (f"estimate: about {toy_minutes(commands, parallel):.0f} min for the {len(commands)} pending commands "
                "on a quiet 2-core CPU (the demo's measured stage times, pipeline.estimates; a busy or larger "
                "machine differs)")
    hours = sft_gpu_hours(commands)
    sft = "SFT: unknown (a model of unknown size)" if hours is None else \
        f"SFT at most {hours:.0f} GPU-hours (H100/H200 at SFT's measured {SFT_MFU:.0%} MFU, rows of data.max_length)"
    return f"estimate: {sft}; RL and evaluation: not estimated (no measured GPU rate yet; pipeline.estimates)"
