"""The orchestrator: ``python -m pipeline.run experiment=<demo|table1|table2> [profile=toy|paper] [overrides]``.

Builds the experiment's stage plan (pipeline/stages.py) and runs it in order, holding the experiment's lock. A
command whose runs are all current by the run contract's rule (``common.manifest.run_state``: complete, same
identity, inputs and outputs unchanged) is skipped without starting a process; any other command is started and
the stage resumes or restarts by the same rule. A failed stage stops the run with its reason and leaves every other
folder intact; Ctrl-C, SIGTERM and SIGHUP stop every running stage's process tree and name each interrupted stage on
one line (``pipeline/launch.py`` supervises the processes). ``dry_run=true`` prints every stage, its exact command
and its resolved settings, and runs nothing. Hydra multirun (``-m``) sweeps run one full plan per point.
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from common.config import (
    CONF_DIR,
    Config,
    ConfigError,
    compose,
    refusing_unknown_choices,
    require_writable_run_root,
    to_config,
)
from common.errors import user_errors_in_one_line
from pipeline.launch import StageFailed, force_restart, is_done, manifest_states, run_command, stop_all
from common.locks import DirectoryLock
from common.paths import experiment_dir, report_benchmarks, report_dir
from common.preflight import PreflightError, estimate_bytes, memory_line, require_plan
from pipeline.estimates import estimate_line
from common.processes import interrupted_by, termination_signals_interrupt
from pipeline.migrations import retire_cpu_chosen_bf16_bases, warn_about_old_layout
from pipeline.stages import StageCommand, build_plan, check_force, check_force_in_use, force_patterns

STATUS_EVERY_S = 60
"""Seconds between status lines while commands run side by side (their own output goes to their logs)."""
PLAN_OWNED_KEYS = {"model": "profile.models=[...]", "sft/method": "experiment.methods=[...]",
                   "eval.phase": None, "eval.variant": None, "eval.model_run": None, "rl.init": None,
                   "rl.init_run": None}
"""Keys the plan sets per stage; a user override of one would be ambiguous."""
ORCHESTRATOR_KEYS = ("dry_run", "force")
"""Keys only the orchestrator reads; stage commands do not receive them."""


def stage_overrides(task_overrides: list[str], methods: list[str] | None = None, per_seed: bool = False) -> list[str]:
    """The user's overrides that every stage command receives (orchestrator-only keys removed).

    A sweep preset (``+sweep=...``) stays with the orchestrator: a stage given it would start a multirun of its
    own. Its point values reach the stages as plain task overrides, and ``methods`` (the experiment's resolved
    method list) is passed on explicitly in its place.
    """
    kept = []
    for override in task_overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in PLAN_OWNED_KEYS:
            hint = PLAN_OWNED_KEYS[key]
            raise ConfigError(f"'{override}' cannot be given to the orchestrator: the plan sets {key} per stage"
                              + (f"; use {hint} instead" if hint else ""))
        if key == "seed" and per_seed:
            raise ConfigError(f"'{override}' cannot be given with experiment.seeds: the plan sets seed per command; "
                              "list every seed in experiment.seeds=[...]")
        if key == "sweep":
            if methods is not None:
                kept.append(f"experiment.methods=[{','.join(methods)}]")
            continue
        if key in ORCHESTRATOR_KEYS or key.startswith("hydra"):
            continue
        kept.append(override)
    return kept


def describe(command: StageCommand) -> str:
    lines = [f"[{command.stage}] {command.name}", f"    $ {' '.join(command.argv)}"]
    lines += [f"    {key}: {json.dumps(value, default=str)}" for key, value in command.settings.items()]
    lines.append(f"    manifests: {', '.join(str(d) for d in command.manifest_dirs)}")
    if command.needs:
        lines.append(f"    after: {', '.join(command.needs)}")
    return "\n".join(lines)


def pending(cfg: Config, plan: list[StageCommand]) -> list[StageCommand]:
    """The commands of ``plan`` that would run: every one under ``force``, else those not done."""
    return [command for command in plan if cfg.force or not is_done(command)]


def run(cfg: Config, overrides: list[str]) -> list[StageCommand]:
    """Runs (or, with ``cfg.dry_run``, prints) the experiment's plan; returns the plan."""
    if not cfg.dry_run:
        require_writable_run_root(cfg)  # before any manifest is read or lock taken there
    plan = build_plan(cfg, overrides)
    check_force(plan, cfg.force)
    check_force_in_use(plan, cfg.force, cfg.experiment.run_root)
    header = (f"experiment={cfg.experiment.name} profile={cfg.profile.name} models={cfg.profile.models} "
              f"methods={cfg.experiment.methods}: {len(plan)} stage commands")
    print(header)
    if any(command.stage.startswith("eval") for command in plan):
        print(f"evaluation benchmarks: {', '.join(report_benchmarks(cfg))}"
              + ("" if cfg.eval.benchmarks else " (every one of data.benchmarks; eval.benchmarks=[...] picks)"))
    retire_cpu_chosen_bf16_bases(plan, dry_run=cfg.dry_run)
    waiting = pending(cfg, plan)
    if cfg.dry_run:
        shared = shared_commands(cfg, plan, overrides)
        train_in = cfg.experiment.train_in
        for index, command in enumerate(plan, 1):
            forced = force_patterns(command, cfg.force)
            state = (f"forced by force={forced}, would restart" if forced else
                     "done, would be skipped" if is_done(command) else "would run")
            where = f"; experiment={train_in} has these runs too" if command.name in shared else ""
            print(f"{index:3d}. ({state}{where}) {describe(command)}")
        if shared:
            print(f"{len(shared)} of {len(plan)} commands write only runs that experiment={train_in} (experiment."
                  f"train_in) has in its plan too, with the same identities: done there, they are reused here, not "
                  f"redone ({', '.join(sorted(shared))})")
        needed = estimate_bytes(waiting)
        if any(needed.values()):
            print(f"disk: the pending commands write about {needed['run_root'] / 1e9:.0f} GB under "
                  f"experiment.run_root and {needed['hf_cache'] / 1e9:.0f} GB into the HF cache (the preflight's "
                  "estimate, common.preflight.estimate_bytes)")
        if (memory := memory_line(waiting)) is not None:
            print(memory)
        print(estimate_line(waiting, cfg.profile.name, cfg.experiment.parallel))
        print(f"dry run: nothing was started; the run would leave its results in {results_path(cfg, plan)}")
        return plan
    try:
        require_plan(cfg, waiting)
    except PreflightError as error:
        raise SystemExit(str(error)) from None
    if cfg.preflight:
        print(f"preflight: ok for the {len(waiting)} pending stage commands")
        if (memory := memory_line(waiting)) is not None:
            print(memory)
        return plan
    print(estimate_line(waiting, cfg.profile.name, cfg.experiment.parallel))
    started = time.time()
    run_plan(plan, experiment_dir(cfg), f"orchestrator of experiment {cfg.experiment.name}",
             cfg.experiment.parallel, force=cfg.force)
    print(f"experiment {cfg.experiment.name} complete in {time.time() - started:.0f} s; results: "
          f"{results_path(cfg, plan)}")
    return plan


def results_path(cfg: Config, plan: list[StageCommand]) -> Path:
    """Where a run of ``plan`` leaves its results: the report (``<run_root>/<experiment>/report/report.md``) when the
    plan has the report stage, else the experiment's folder."""
    return report_dir(cfg) / "report.md" if any(c.stage == "report" for c in plan) else experiment_dir(cfg)


def run_plan(plan: list[StageCommand], lock_dir: Path, what: str, parallel: int,
             force: list[str] | tuple[str, ...] = ()) -> None:
    """Runs the plan holding ``lock_dir``'s lock, with SIGINT, SIGTERM and SIGHUP stopping every running stage.
    Exits 1 naming the first failure, or 130 after a signal (each interrupted stage named on one line by
    :func:`execute`, no traceback)."""
    with DirectoryLock(lock_dir, what), termination_signals_interrupt():
        try:
            warn_about_old_layout(lock_dir)
            failure = execute(plan, parallel, force=force)
        except KeyboardInterrupt:
            print(f"interrupted by {interrupted_by() or 'Ctrl-C'}: every running stage was stopped and recorded its "
                  "state; run the same command again to resume", file=sys.stderr, flush=True)
            raise SystemExit(130) from None
    if failure is not None:
        print(f"FAILED: {failure}", file=sys.stderr)
        raise SystemExit(1) from failure


def shared_commands(cfg: Config, plan: list[StageCommand], overrides: list[str]) -> set[str]:
    """Names of the commands of ``plan`` whose runs are all in the plan of the experiment it trains in
    (``experiment.train_in``, composed from ``conf/experiment/<train_in>.yaml`` with the same ``overrides``): the
    runs, in the same folders, that one experiment's run leaves for the other to reuse."""
    train_in = cfg.experiment.train_in
    if not train_in or not (CONF_DIR / "experiment" / f"{train_in}.yaml").is_file():
        return set()
    other = [o for o in overrides if o.split("=", 1)[0] != "experiment"] + [f"experiment={train_in}"]
    theirs = {directory for command in build_plan(compose(other), other) for directory in command.manifest_dirs}
    return {command.name for command in plan if set(command.manifest_dirs) <= theirs}


def critical_path_lengths(plan: list[StageCommand]) -> dict[str, int]:
    """Per command, the number of commands on the longest chain that starts with it (itself included)."""
    dependents: dict[str, list[str]] = {command.name: [] for command in plan}
    for command in plan:
        for need in command.needs:
            dependents[need].append(command.name)
    lengths: dict[str, int] = {}
    for command in reversed(plan):  # needs always point backwards in the plan
        lengths[command.name] = 1 + max((lengths[d] for d in dependents[command.name]), default=0)
    return lengths


def last_progress_line(log_path: Path, limit: int = 90) -> str:
    """The last non-empty line of a stage log, as a terminal would show it (a tqdm bar redraws after ``\\r``)."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log_path.stat().st_size - 4096))
            tail = log.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    lines = [line.strip() for line in tail.replace("\r", "\n").split("\n") if line.strip()]
    return lines[-1][:limit] if lines else ""


def status_line(running: list[StageCommand], finished: int, total: int, elapsed_s: float) -> str:
    """What a parallel run is doing: commands finished, and the latest progress line of each running one."""
    parts = [f"{c.name}: {last_progress_line(c.record_dir / 'launch.log')}" for c in running]
    return f"[{finished}/{total} done, {elapsed_s / 60:.1f} min] " + " | ".join(parts)


def execute(plan: list[StageCommand], parallel: int, force: list[str] | tuple[str, ...] = ()) -> StageFailed | None:
    """Runs the plan with up to ``parallel`` commands at a time; returns the first failure (None on success).

    A command starts once every command it needs has succeeded. With one slot the plan runs in its own order
    (Table 1 before RL); with more, the ready command heading the longest chain of dependents goes first
    (list scheduling), so the RL chain starts as soon as its inputs exist and evaluations fill the gaps. After
    a failure nothing new starts; commands already running finish, so their work is kept. Commands matching a
    ``force`` pattern (command or stage name) restart from scratch, and so, through their changed inputs, does
    everything downstream.
    """
    order = {command.name: index for index, command in enumerate(plan)}
    chain = critical_path_lengths(plan)
    priority = (lambda c: order[c.name]) if parallel == 1 else (lambda c: (-chain[c.name], order[c.name]))
    pending = sorted(plan, key=priority)
    started = time.time()
    succeeded: set[str] = set()
    failure: StageFailed | None = None
    total = len(plan)

    def label(command: StageCommand) -> str:
        return f"[{order[command.name] + 1}/{total}] {command.name}"

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        running: dict[Future, StageCommand] = {}

        def start_ready() -> None:
            """Starts (or skips, when done) ready commands in priority order while slots are free."""
            progressed = True
            while progressed and failure is None:
                progressed = False
                for command in pending:
                    if len(running) >= parallel:
                        return
                    if all(need in succeeded for need in command.needs):
                        pending.remove(command)
                        progressed = True
                        forced = force_patterns(command, force)
                        if forced:
                            force_restart(command, f"forced by force={forced}")
                        if not forced and is_done(command):
                            print(f"{label(command)}: done (manifests unchanged), skipping")
                            succeeded.add(command.name)
                        else:
                            log = "" if parallel == 1 else f" (log: {command.record_dir / 'launch.log'})"
                            print(f"{label(command)}: starting{log}", flush=True)
                            running[pool.submit(run_command, command, echo=parallel == 1)] = command
                        break

        try:
            start_ready()
            while running:
                finished, _ = wait(running, timeout=STATUS_EVERY_S if parallel > 1 else None,
                                   return_when=FIRST_COMPLETED)
                if not finished:
                    print(status_line(list(running.values()), len(succeeded), total, time.time() - started),
                          flush=True)
                for future in finished:
                    command = running.pop(future)
                    try:
                        seconds = future.result()
                    except StageFailed as error:
                        print(f"{label(command)}: {'interrupted' if error.interrupted else 'FAILED'}",
                              file=sys.stderr, flush=True)
                        failure = failure or error
                        continue
                    succeeded.add(command.name)
                    print(f"{label(command)}: finished in {seconds:.0f} s", flush=True)
                start_ready()
        except KeyboardInterrupt:
            stop_all()
            for command in sorted(running.values(), key=lambda c: order[c.name]):
                statuses = sorted({status for status, _ in manifest_states(command).values()})
                print(f"{label(command)}: interrupted (manifest: {', '.join(statuses)})", file=sys.stderr, flush=True)
            raise
    if failure is None and pending:
        raise RuntimeError(f"commands whose needs never finished: {[c.name for c in pending]}")
    return failure


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(dict_cfg: DictConfig) -> None:
    with user_errors_in_one_line():
        cfg = to_config(dict_cfg)
        run(cfg, stage_overrides(list(HydraConfig.get().overrides.task), cfg.experiment.methods,
                                 per_seed=bool(cfg.experiment.seeds)))


if __name__ == "__main__":
    refusing_unknown_choices(main)()
