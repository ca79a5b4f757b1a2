"""The orchestrator: ``python -m pipeline.run experiment=<demo|table1|table2> [profile=toy|paper] [overrides]``.

Builds the experiment's stage plan (pipeline/stages.py) and runs it in order. A command whose manifests are
complete and unchanged since it last succeeded is skipped without starting a process; any other command is
started and the stage itself skips, resumes or restarts from its manifest. A failed stage stops the run with
its reason and leaves every other folder intact. ``dry_run=true`` prints every stage, its exact command and
its resolved settings, and runs nothing. Hydra multirun (``-m``) sweeps run one full plan per point.
"""
from __future__ import annotations

import json
import sys
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pipeline.config import CONF_DIR, Config, ConfigError, to_config
from pipeline.launch import StageFailed, is_done, run_command
from pipeline.stages import StageCommand, build_plan

PLAN_OWNED_KEYS = {"model": "profile.models=[...]", "sft/method": "experiment.methods=[...]",
                   "eval.phase": None, "eval.variant": None, "rl.init": None}
"""Keys the plan sets per stage; a user override of one would be ambiguous."""


def stage_overrides(task_overrides: list[str], methods: list[str] | None = None) -> list[str]:
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
        if key == "sweep":
            if methods is not None:
                kept.append(f"experiment.methods=[{','.join(methods)}]")
            continue
        if key == "dry_run" or key.startswith("hydra"):
            continue
        kept.append(override)
    return kept


def describe(command: StageCommand) -> str:
    lines = [f"[{command.stage}] {command.name}", f"    $ {' '.join(command.argv)}"]
    lines += [f"    {key}: {json.dumps(value, default=str)}" for key, value in command.settings.items()]
    lines.append(f"    manifests: {', '.join(str(d) for d in command.manifest_dirs)}")
    return "\n".join(lines)


def run(cfg: Config, overrides: list[str]) -> list[StageCommand]:
    """Runs (or, with ``cfg.dry_run``, prints) the experiment's plan; returns the plan."""
    plan = build_plan(cfg, overrides)
    header = (f"experiment={cfg.experiment.name} profile={cfg.profile.name} models={cfg.profile.models} "
              f"methods={cfg.experiment.methods}: {len(plan)} stage commands")
    print(header)
    if cfg.dry_run:
        for index, command in enumerate(plan, 1):
            print(f"{index:3d}. {describe(command)}")
        print("dry run: nothing was started")
        return plan
    started = time.time()
    for index, command in enumerate(plan, 1):
        prefix = f"[{index}/{len(plan)}] {command.name}"
        if is_done(command):
            print(f"{prefix}: done (manifests unchanged), skipping")
            continue
        print(f"{prefix}: starting")
        try:
            seconds = run_command(command)
        except StageFailed as failure:
            print(f"{prefix}: FAILED: {failure}", file=sys.stderr)
            raise SystemExit(1) from failure
        print(f"{prefix}: finished in {seconds:.0f} s")
    print(f"experiment {cfg.experiment.name} complete in {time.time() - started:.0f} s")
    return plan


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(dict_cfg: DictConfig) -> None:
    cfg = to_config(dict_cfg)
    run(cfg, stage_overrides(list(HydraConfig.get().overrides.task), cfg.experiment.methods))


if __name__ == "__main__":
    main()
