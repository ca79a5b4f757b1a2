"""The report's "Runs" section: on which commit and machine, and in how much time, the runs behind its numbers ran.

Read from the manifests of the run folders the report reads (``common.grid.report_run``'s inputs and the data run):

* per stage (data, base, tokens, sft, eval_sft, rl, eval_rl): runs, attempts, work = Σ over attempts of
  (ended_at − started_at), and the longest run's work;
* working time: how long at least one of these runs was working, the length of the union of their attempts. A run
  reused from an earlier experiment counts its own time, not the time between; a process's start-up before its
  manifest opens (imports) and the orchestrator's own time are not in it, so it is a little below the orchestrator's
  wall time for an experiment run from an empty run root;
* the commits and machines (``Manifest.machine``) the runs record, each with its count of runs;
* ``run_times.csv``: one row per run.

An attempt killed outright (status "running", no ``ended_at``) counts nothing and is named. A manifest written before
``attempts`` existed counts as one attempt from its ``started_at`` to its ``ended_at``.
"""
from __future__ import annotations

import csv
import datetime as dt
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from common.manifest import Manifest, read_manifest

STAGE_ORDER = ("data", "base", "tokens", "sft", "eval_sft", "rl", "eval_rl")
"""Table order of the stages; any other stage follows in the order met."""
CSV_NAME = "run_times.csv"


@dataclass(frozen=True)
class Attempt:
    started: dt.datetime
    ended: dt.datetime | None
    """None for an attempt killed outright."""
    status: str


@dataclass(frozen=True)
class RunTime:
    """One run folder (``name``: relative to the run root) as its manifest records it."""

    name: str
    stage: str
    status: str
    commit: str
    machine: str
    attempts: tuple[Attempt, ...]

    @property
    def work_s(self) -> float:
        return sum((a.ended - a.started).total_seconds() for a in self.attempts if a.ended is not None)

    @property
    def killed(self) -> int:
        return sum(a.ended is None for a in self.attempts)


def _time(text: str) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text) if text else None


def attempts_of(manifest: Manifest) -> tuple[Attempt, ...]:
    """The manifest's attempts; one from ``started_at`` to ``ended_at`` where it lists none (older manifests)."""
    records = manifest.attempts or [{"started_at": manifest.started_at, "ended_at": manifest.ended_at,
                                     "status": manifest.status}]
    return tuple(Attempt(_time(r["started_at"]), _time(r.get("ended_at", "")), r.get("status", ""))
                 for r in records)


def commit_text(git: Mapping[str, Any]) -> str:
    """``7ac42f9`` (clean), ``7ac42f9+dirty``, or ``unknown``."""
    short = str(git.get("commit") or "unknown")[:7]
    return f"{short}+dirty" if git.get("dirty") else short


def machine_text(machine: Mapping[str, Any]) -> str:
    """``AMD EPYC, 2 CPUs (avx2), 24 GiB[, GPUs: …]``, or ``not recorded`` (manifests from before it was)."""
    if not machine:
        return "not recorded"
    flags = ", ".join(machine.get("cpu_flags", [])) or "no avx2"
    text = f"{machine.get('cpu') or 'CPU'}, {machine.get('cpus')} CPUs ({flags})"
    if "memory_gib" in machine:
        text += f", {machine['memory_gib']} GiB"
    if machine.get("gpus"):
        counts = Counter(machine["gpus"])
        text += ", GPUs: " + ", ".join(f"{n} × {model}" for model, n in counts.items())
    return text


def read_run_times(folders: Mapping[str, Path]) -> list[RunTime]:
    """A :class:`RunTime` for every folder (name -> path) that holds a manifest, in the order given."""
    runs = []
    for name, folder in folders.items():
        manifest = read_manifest(folder)
        if manifest is not None:
            runs.append(RunTime(name, manifest.stage, manifest.status, commit_text(manifest.git),
                                machine_text(manifest.machine), attempts_of(manifest)))
    return runs


def working_seconds(runs: list[RunTime]) -> float:
    """Length of the union of every finished attempt's [started, ended]."""
    spans = sorted((a.started, a.ended) for run in runs for a in run.attempts if a.ended is not None)
    total, current = 0.0, None
    for start, end in spans:
        if current is None or start > current[1]:
            if current is not None:
                total += (current[1] - current[0]).total_seconds()
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        total += (current[1] - current[0]).total_seconds()
    return total


def _stages(runs: list[RunTime]) -> list[str]:
    met = list(dict.fromkeys(run.stage for run in runs))
    return [s for s in STAGE_ORDER if s in met] + [s for s in met if s not in STAGE_ORDER]


def _counted(counter: Counter, total: int) -> str:
    return "; ".join(f"{key} ({n} of {total} runs)" if len(counter) > 1 else f"{key} (all {total} runs)"
                     for key, n in counter.most_common())


def write_csv(runs: list[RunTime], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "stage", "status", "commit", "machine", "attempts", "killed_attempts", "work_s",
                         "first_started_at", "last_ended_at"])
        for run in runs:
            ends = [a.ended for a in run.attempts if a.ended is not None]
            writer.writerow([run.name, run.stage, run.status, run.commit, run.machine, len(run.attempts), run.killed,
                             f"{run.work_s:.0f}", min(a.started for a in run.attempts).isoformat(),
                             max(ends).isoformat() if ends else ""])


def run_times_section(runs: list[RunTime], out_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """``report.md``'s "Runs" lines and the numbers for the report's manifest; writes ``run_times.csv``."""
    if not runs:
        return ["No run folder of this report has a manifest.", ""], {}
    write_csv(runs, out_dir / CSV_NAME)
    working = working_seconds(runs)
    finished = [a for run in runs for a in run.attempts if a.ended is not None]
    lines = [f"* Commit: {_counted(Counter(run.commit for run in runs), len(runs))}",
             f"* Machine: {_counted(Counter(run.machine for run in runs), len(runs))}"]
    if finished:
        first, last = (f"{moment:%Y-%m-%d %H:%M:%S}" for moment in (min(a.started for a in finished),
                                                                    max(a.ended for a in finished)))
        lines.append(f"* Working time: **{working / 60:.1f} min** ({working:.0f} s) in which at least one of these "
                     f"runs was working (the union of their attempts, {first} to {last} UTC); the processes' "
                     "start-up before their manifests open is not in it")
    lines += ["", "| stage | runs | attempts | work (s) | longest run (s) |", "|---|:---:|:---:|:---:|:---:|"]
    for stage in _stages(runs):
        of_stage = [run for run in runs if run.stage == stage]
        lines.append(f"| {stage} | {len(of_stage)} | {sum(len(run.attempts) for run in of_stage)} | "
                     f"{sum(run.work_s for run in of_stage):.0f} | {max(run.work_s for run in of_stage):.0f} |")
    killed = [run.name for run in runs if run.killed]
    lines += ["", f"Work: the sum over a stage's runs of each attempt's end − start (resumes included, the time "
                  f"between attempts not). Per run: [{CSV_NAME}]({CSV_NAME})."]
    if killed:
        lines.append(f"Attempts killed without an end (not counted): {', '.join(killed)}.")
    numbers = {"working_s": round(working), "runs": len(runs),
               "commits": list(dict.fromkeys(run.commit for run in runs)),
               "machines": list(dict.fromkeys(run.machine for run in runs))}
    return [*lines, ""], numbers
