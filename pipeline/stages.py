"""The stage plan of an experiment: every stage command, in order, with the folders whose manifests it writes.

An experiment lists stages (``experiment.stages``) and SFT methods (``experiment.methods``); the profile lists
models. The plan expands them::

    data      python -m data.prepare                                         (once)
    base      python -m toy.base (toy models only), python -m data.tokenize_sft   (per model)
    sft       [srun ...] torchrun ... -m sft.train  sft/method=<m>           (per model x method; srun: multi-node)
    eval_sft  python -m eval.run eval.phase=sft eval.variant=<v> eval.model_run=<SFT run>
                                                                             (per model x [base] + methods)
    rl        python -m rl.train rl.init=<v> rl.init_run=<SFT run>          (per model x [base] + rl_methods)
    eval_rl   python -m eval.run eval.phase=rl eval.variant=<v> eval.model_run=<RL run>
                                                                             (per model x [base] + rl_methods)
    report    python -m report.run                                           (once)

Every command carries the user's overrides plus its own, so each stage composes exactly the config the
plan was built from; a stage's command line is all it needs to be re-run by hand. A stage that reads an upstream
run is handed its folder (``rl.init_run``, ``eval.model_run``: the :class:`common.grid.Arm` of its variant, none
for the base model); the labels ``rl.init`` and ``eval.variant`` only name its own folder.
"""
from __future__ import annotations

import os
import sys
from difflib import get_close_matches
from dataclasses import dataclass, field, replace
from pathlib import Path
from fnmatch import fnmatch
from typing import Callable

from common.config import Config, ConfigError, compose, override_value
from common.locks import describe_holder, live_holder
from common.manifest import running_runs
from common.paths import (
    BASE_VARIANT,
    BEHAVIOUR_LOGPROBS_COLUMN,
    RunSpec,
    base_run,
    configured_rl_run,
    data_run,
    eval_run,
    extra_benchmark_run,
    heldout_nll_run,
    method_label,
    report_benchmarks,
    selected_extra_benchmarks,
    sft_run,
    tokens_run,
)
from common.grid import Arm, arms, base_seeds, experiment_grid, experiment_method_names, report_run


@dataclass
class StageCommand:
    """One process the orchestrator launches."""

    stage: str
    """Stage name (data, base, sft, eval_sft, rl, eval_rl, report)."""
    name: str
    """Human-readable id, e.g. ``sft/qwen3_4b/eksft`` (``.../seed1`` in a multi-seed experiment)."""
    argv: list[str]
    """The exact command line."""
    runs: list[RunSpec]
    """The runs whose manifests the command writes; all current (``common.manifest.run_state``) means done."""
    config: Config
    """The config the command composes (for display and the stage environment)."""
    settings: dict[str, object] = field(default_factory=dict)
    """The resolved settings worth showing in a dry run."""
    needs: list[str] = field(default_factory=list)
    """Names of the plan's commands whose outputs this one reads; it starts only after they succeed."""
    refresh: Callable[[], list[RunSpec]] | None = None
    """Rebuilds ``runs`` when their inputs depend on what exists on disk (the report reads every run there is)."""

    def current_runs(self) -> list[RunSpec]:
        """``runs`` as of now (what the skip check compares)."""
        return self.refresh() if self.refresh is not None else self.runs

    @property
    def manifest_dirs(self) -> list[Path]:
        return [run.directory for run in self.runs]

    @property
    def record_dir(self) -> Path:
        """Where the orchestrator keeps this command's launch record and log."""
        return self.manifest_dirs[0] if len(self.manifest_dirs) == 1 else self.manifest_dirs[0].parent


def _python_module(module: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", module, *overrides]


def command_name(*parts: str, seed: int | None = None) -> str:
    """A command's name in the plan (what ``needs``, ``force`` and the logs use): ``sft/<model>/<label>``, then
    ``/seed<s>`` in a multi-seed experiment (``seed`` given)."""
    return "/".join([*parts, *([f"seed{seed}"] if seed is not None else [])])


def _handed_down(key: str, folder: Path | None) -> list[str]:
    """The override that hands a stage the upstream run folder it reads; none for the base model."""
    return [] if folder is None else [f"{key}={override_value(str(folder))}"]


def torchrun_prefix(cfg: Config) -> list[str]:
    """torchrun for the SFT trainer: ``--standalone`` on one node; across ``profile.nnodes`` nodes, the per-node
    command, the same on every node.

    Multi-node uses torchrun's c10d rendezvous at ``${MASTER_ADDR}:${MASTER_PORT}`` (expanded from the launching
    environment; under Slurm ``source scripts/slurm_env.sh`` exports them) with the SFT run's folder name
    ``<label>-<id>`` as rendezvous id, so two runs never share a rendezvous and a restarted run rejoins its own. c10d
    numbers the nodes itself (torchrun ignores ``--node_rank`` for it), so no per-node value is needed.
    """
    prefix = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cfg.profile.nproc_per_node}"]
    if cfg.profile.nnodes == 1:
        return [*prefix, "--standalone"]
    return [*prefix, f"--nnodes={cfg.profile.nnodes}", "--rdzv_backend=c10d",
            "--rdzv_endpoint=${MASTER_ADDR}:${MASTER_PORT}", f"--rdzv_id={sft_run(cfg).directory.name}"]


def node_launcher(cfg: Config) -> list[str]:
    """Multi-node SFT: Slurm's ``srun`` starts the per-node command once on each of ``profile.nnodes`` nodes of the
    job (and stops them all when one fails); nothing on one node."""
    nnodes = cfg.profile.nnodes
    if nnodes == 1:
        return []
    return ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]


def _sft_settings(cfg: Config) -> dict[str, object]:
    s = cfg.sft
    ranks = cfg.profile.nproc_per_node * cfg.profile.nnodes
    return {"method": vars(s.method), "lr": s.lr, "schedule": f"{s.lr_schedule} warmup {s.warmup_ratio}",
            "batch": f"{s.micro_batch_size} x GA {s.grad_accum} x {ranks} ranks",
            "epochs": s.epochs, "max_steps": s.max_steps, "loss_norm": s.effective_loss_norm(),
            "cutoff": cfg.data.max_length, "precision": s.mixed_precision}


def _eval_settings(cfg: Config) -> dict[str, object]:
    """The sampling settings; the command's own phase and variant are on its command line."""
    shown = {key: value for key, value in vars(cfg.eval).items() if key not in ("phase", "variant", "model_run")}
    return {"sampling": shown}


def _rl_settings(cfg: Config) -> dict[str, object]:
    from rl.verl_args import build_command  # the exact verl argv; pure, no Ray

    return {"verl": " ".join(build_command(cfg))}


def build_plan(cfg: Config, overrides: list[str]) -> list[StageCommand]:
    """Expands ``cfg.experiment`` into the ordered list of stage commands (user ``overrides`` go to every stage).

    It walks the experiment's grid (:func:`common.grid.experiment_grid`, the report's, without sweep points): its
    models, variants and RL arms; each command composes its own config from ``overrides`` and its arms from that
    (:func:`common.grid.arms`), and an override that would make the two differ is refused. SFT,
    evaluation and RL commands run once per seed of ``cfg.run_seeds()`` (``seed=<s>`` is added when the experiment
    lists ``experiment.seeds``), and with ``experiment.base_seeds`` the base model, tokenisation and every seed's
    commands run once per base seed (``toy.base_seed=<b>``, names ending ``/base<b>[/seed<s>]``). Each command's
    ``needs`` names the commands in this plan that produce its inputs; a producer left out of
    ``experiment.stages`` is not waited for (the stage itself checks its inputs)."""
    stages = set(cfg.experiment.stages)
    seeds = cfg.run_seeds()
    per_seed = bool(cfg.experiment.seeds)
    grid = {model.cfg.model.name: model for model in experiment_grid(cfg, sweep_points=False).models}
    plan: list[StageCommand] = []
    if "data" in stages:
        extras = [extra_benchmark_run(cfg, name) for name in selected_extra_benchmarks(cfg)]
        plan.append(StageCommand("data", "data", _python_module("data.prepare", overrides), [data_run(cfg), *extras],
                                 cfg, {"source": cfg.data.source, "split_seed": cfg.data.split_seed,
                                       "num_sft_rows": cfg.data.num_sft_rows, "benchmarks": list(cfg.data.benchmarks),
                                       **({"extra_benchmarks": [run.variant for run in extras]} if extras else {})}))
    for model, base_seed in ((model, base_seed) for model in cfg.profile.models for base_seed in base_seeds(cfg)):
        # experiment.base_seeds: one base model per base seed, its commands named .../base<b>, every seed nested in it
        scope = [] if base_seed is None else [f"base{base_seed}"]
        model_overrides = [*overrides, f"model={model}", *([f"toy.base_seed={base_seed}"] if scope else [])]
        mcfg = compose(model_overrides)
        if mcfg.model != grid[model].cfg.model:
            raise ConfigError(f"profile.models: a model.* override in {overrides} reaches {model} in its stage "
                              f"commands but only {cfg.model.name} in the report; run one model per experiment")
        grid_variants, grid_rl_variants = grid[model].variants, grid[model].rl_variants
        base = base_run(mcfg)
        base_model = [command_name("base", model, *scope)] if base is not None else []
        tokenize = command_name("tokenize", model, *scope)
        if "base" in stages:
            if base is not None:
                plan.append(StageCommand("base", command_name("base", model, *scope),
                                         _python_module("toy.base", model_overrides), [base], mcfg,
                                         {"toy": vars(mcfg.toy)}))
            plan.append(StageCommand("base", tokenize, _python_module("data.tokenize_sft", model_overrides),
                                     [tokens_run(mcfg)], mcfg, {"max_length": mcfg.data.max_length},
                                     needs=["data", *base_model]))
        for seed in seeds:
            seed_name = seed if per_seed else None
            seed_overrides = [*model_overrides, f"seed={seed}"] if per_seed else model_overrides
            seed_cfg = compose(seed_overrides) if per_seed else mcfg
            seed_arms = {a.variant: a for a in arms(seed_cfg)}  # the grid's arms as the commands compose them
            for method, label in zip(experiment_method_names(grid[model].cfg), grid_variants[1:]):
                method_overrides = [*seed_overrides, f"sft/method={method}"]
                scfg = compose(method_overrides)
                if method_label(scfg.sft.method) != label or sft_run(scfg).directory != seed_arms[label].sft:
                    raise ConfigError(f"experiment.methods: an sft.method.* override in {overrides} makes {method} "
                                      f"train as {method_label(scfg.sft.method)} but the report looks for {label} (it "
                                      f"applies only to {cfg.sft.method.name} there); use sft.* settings, or run one "
                                      "method per experiment")
                check_behaviour_logprobs(scfg, method)
                if "sft" in stages:
                    argv = [*node_launcher(scfg), *torchrun_prefix(scfg), "-m", "sft.train", *method_overrides]
                    plan.append(StageCommand("sft", command_name("sft", model, label, *scope, seed=seed_name), argv,
                                             [sft_run(scfg)], scfg, _sft_settings(scfg), needs=[tokenize]))
            start_model = {variant: ["data", *base_model] if variant == BASE_VARIANT else
                           [command_name("sft", model, variant, *scope, seed=seed_name)] for variant in grid_variants}
            if "eval_sft" in stages:
                plan.extend(_eval_commands(seed_cfg, seed_overrides, "sft", [seed_arms[v] for v in grid_variants],
                                           start_model, seed_name, scope))
            for variant in grid_rl_variants:
                rl_name = command_name("rl", model, variant, *scope, seed=seed_name)
                if "rl" in stages:
                    start = seed_arms[variant].sft
                    rl_overrides = [*seed_overrides, f"rl.init={variant}", *_handed_down("rl.init_run", start)]
                    rcfg = replace(seed_cfg, rl=replace(seed_cfg.rl, init=variant, init_run=str(start or "")))
                    plan.append(StageCommand("rl", rl_name, _python_module("rl.train", rl_overrides),
                                             [configured_rl_run(rcfg)], rcfg, _rl_settings(rcfg),
                                             needs=start_model[variant]))
                if "eval_rl" in stages:
                    plan.extend(_eval_commands(seed_cfg, seed_overrides, "rl", [seed_arms[variant]],
                                               {variant: ["data", rl_name]}, seed_name, scope))
    if "report" in stages:
        plan.append(StageCommand("report", "report", _python_module("report.run", overrides), [report_run(cfg)], cfg,
                                 needs=[command.name for command in plan], refresh=lambda: [report_run(cfg)]))
    names = {command.name for command in plan}
    for command in plan:
        command.needs = [need for need in command.needs if need in names]
    return plan


def check_behaviour_logprobs(cfg: Config, method: str) -> None:
    """Refuses ``method`` when its loss reads the SFT rows' behaviour log-probabilities (PEAR) and the configured
    data is known not to have them: only the forking toy world writes them (local rows may; the stage checks)."""
    if not cfg.sft.method.reads_behaviour_logprobs():
        return
    known_without = {"toy": cfg.toy.world != "forking", "hub": True}.get(cfg.data.source, False)
    if known_without:
        source = f"data.source=toy with toy.world={cfg.toy.world}" if cfg.data.source == "toy" else \
            f"data.source={cfg.data.source}"
        raise ConfigError(f"sft/method={method} reads the SFT rows' column {BEHAVIOUR_LOGPROBS_COLUMN} (log-probs of "
                          f"the policy that generated them), which {source} does not have: use rows that have it "
                          "(docs/data.md), or sft/method=pear_base_ref (π_β = the base model, a variant)")


def force_patterns(command: StageCommand, patterns: list[str] | tuple[str, ...]) -> list[str]:
    """The ``force`` patterns (globs over command names and stage names) that match ``command``."""
    return [pattern for pattern in patterns if fnmatch(command.name, pattern) or fnmatch(command.stage, pattern)]


def check_force(plan: list[StageCommand], patterns: list[str] | tuple[str, ...]) -> None:
    """Raises :class:`ConfigError` naming every ``force`` pattern that matches no command of ``plan`` (it would force
    nothing), with the closest names and every valid one."""
    unmatched = [pattern for pattern in patterns if not any(force_patterns(c, [pattern]) for c in plan)]
    if not unmatched:
        return
    valid = list(dict.fromkeys([command.stage for command in plan] + [command.name for command in plan]))
    close = sorted({name for pattern in unmatched for name in get_close_matches(pattern, valid, n=3, cutoff=0.6)})
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ConfigError(f"force={unmatched} matches no stage or command of this plan; {hint}valid: stage names or "
                      f"command names (globs allowed): {', '.join(valid)}")


def check_force_in_use(plan: list[StageCommand], patterns: list[str] | tuple[str, ...], run_root: str | Path) -> None:
    """Raises :class:`ConfigError` when a run that ``force`` would restart is written, or read as an input, by a live
    stage process anywhere under ``run_root`` (:func:`live_uses`). Restarting it under that process loses work: a
    reader's run, finished on the old input, is redone from scratch at its next launch; a writer's ``complete``
    overwrites the restart mark."""
    forced = [run.directory for command in plan if force_patterns(command, patterns) for run in command.runs]
    if forced and (in_use := live_uses(run_root, forced)):
        raise ConfigError(f"force={list(patterns)} would restart runs that live stage processes use: "
                          f"{'; '.join(in_use)}; restarting them now loses that work. Wait for those processes to "
                          "end (or stop them), or use another experiment.run_root")


def live_uses(run_root: str | Path, folders: list[str | Path]) -> list[str]:
    """One line per use of ``folders`` (or of anything inside one) by a live stage process under ``run_root``: a
    ``running`` run it writes there, or an input it reads from there, while its folder lock is held
    (:func:`common.locks.live_holder`)."""
    roots = [os.path.realpath(folder) for folder in folders]

    def used(path: str | Path) -> str | None:
        real = os.path.realpath(path)
        return real if any(real == root or real.startswith(root + os.sep) for root in roots) else None

    uses = []
    for folder, manifest in running_runs(run_root):
        written = used(folder)
        read = {used(record["path"]) for record in manifest.inputs.values() if "path" in record}
        paths = sorted(({written} | read) - {None})
        if paths and (holder := live_holder(folder)):
            what = f"written by {folder}" if written else f"read by {folder}"
            uses += [f"{path} ({what}: {describe_holder(holder, command=False)})" for path in paths]
    return uses


def _eval_commands(cfg: Config, overrides: list[str], phase: str, evaluated: list[Arm],
                   needs: dict[str, list[str]], seed: int | None, scope: list[str]) -> list[StageCommand]:
    """One evaluation command per arm of ``evaluated``, handed the run folder it evaluates (``eval.model_run``);
    ``scope``: ``[base<b>]`` under ``experiment.base_seeds``, else empty."""
    commands = []
    for a in evaluated:
        model = a.model(phase)
        argv = _python_module("eval.run", [*overrides, f"eval.phase={phase}", f"eval.variant={a.variant}",
                                           *_handed_down("eval.model_run", model)])
        ecfg = replace(cfg, eval=replace(cfg.eval, phase=phase, variant=a.variant, model_run=str(model or "")))
        runs = [eval_run(cfg, phase, a.variant, bench, model) for bench in report_benchmarks(cfg)]
        # it reads the tokenised held-out slice
        heldout = heldout_nll_run(cfg, a.variant, model) if phase == "sft" else None
        commands.append(StageCommand(f"eval_{phase}", command_name("eval", cfg.model.name, phase, a.variant, *scope, seed=seed),
                                     argv, runs + ([heldout] if heldout else []), ecfg,
                                     {**_eval_settings(cfg), "benchmarks": report_benchmarks(cfg)},
                                     needs=needs[a.variant] + ([command_name("tokenize", cfg.model.name, *scope)]
                                                               if heldout else [])))
    return commands
