"""The stage plan of an experiment: every stage command, in order, with the folders whose manifests it writes.

An experiment lists stages (``experiment.stages``) and SFT methods (``experiment.methods``); the profile lists
models. The plan expands them::

    data      python -m data.prepare                                   (once)
    base      python -m toy.base (toy models only), python -m data.tokenize_sft        (per model)
    sft       [srun ...] torchrun ... -m sft.train  sft/method=<m>     (per model x method; srun: multi-node)
    eval_sft  python -m eval.run eval.phase=sft eval.variant=<v>       (per model x [base] + methods)
    rl        python -m rl.train rl.init=<v>                           (per model x [base] + rl_methods)
    eval_rl   python -m eval.run eval.phase=rl eval.variant=<v>        (per model x [base] + rl_methods)
    report    python -m report.run                                    (once)

Every command carries the user's overrides plus its own, so each stage composes exactly the config the
plan was built from; a stage's command line is all it needs to be re-run by hand.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from common.config import Config, ConfigError, compose
from common.paths import (
    BASE_VARIANT,
    RunSpec,
    base_run,
    data_run,
    eval_run,
    heldout_nll_run,
    method_label,
    model_configs,
    report_run,
    rl_run,
    rl_variants,
    sft_run,
    tokens_run,
    variants,
)


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
    """The sampling settings; the command's own phase and variant are on its command line, the report's labels and
    analyses are not sampling."""
    shown = {key: value for key, value in vars(cfg.eval).items()
             if key not in ("phase", "variant", "benchmark_labels", "row_labels", "analysis")}
    return {"sampling": shown}


def _rl_settings(cfg: Config, variant: str) -> dict[str, object]:
    from rl.verl_args import build_command  # the exact verl argv; pure, no Ray

    return {"verl": " ".join(build_command(cfg, variant))}


def build_plan(cfg: Config, overrides: list[str]) -> list[StageCommand]:
    """Expands ``cfg.experiment`` into the ordered list of stage commands (user ``overrides`` go to every stage).

    The grid is the report's (:func:`common.paths.model_configs`, :func:`common.paths.variants`); each command
    composes its own config from ``overrides``, and an override that would make the two differ is refused. SFT,
    evaluation and RL commands run once per seed of ``cfg.run_seeds()`` (``seed=<s>`` is added when the experiment
    lists ``experiment.seeds``). Each command's ``needs`` names the commands in this plan that produce its inputs; a
    producer left out of ``experiment.stages`` is not waited for (the stage itself checks its inputs).
    """
    stages = set(cfg.experiment.stages)
    seeds = cfg.run_seeds()
    per_seed = bool(cfg.experiment.seeds)
    grid_models = {mcfg.model.name: mcfg.model for mcfg in model_configs(cfg)}
    grid_variants, grid_rl_variants = variants(cfg), rl_variants(cfg)
    plan: list[StageCommand] = []
    if "data" in stages:
        plan.append(StageCommand("data", "data", _python_module("data.prepare", overrides), [data_run(cfg)], cfg,
                                 {"source": cfg.data.source, "split_seed": cfg.data.split_seed,
                                  "num_sft_rows": cfg.data.num_sft_rows, "benchmarks": list(cfg.data.benchmarks)}))
    for model in cfg.profile.models:
        model_overrides = [*overrides, f"model={model}"]
        mcfg = compose(model_overrides)
        if mcfg.model != grid_models[model]:
            raise ConfigError(f"profile.models: a model.* override in {overrides} reaches {model} in its stage "
                              f"commands but only {cfg.model.name} in the report; run one model per experiment")
        base = base_run(mcfg)
        base_model = [f"base/{model}"] if base is not None else []
        if "base" in stages:
            if base is not None:
                plan.append(StageCommand("base", f"base/{model}", _python_module("toy.base", model_overrides),
                                         [base], mcfg, {"toy": vars(mcfg.toy)}))
            plan.append(StageCommand("base", f"tokenize/{model}", _python_module("data.tokenize_sft", model_overrides),
                                     [tokens_run(mcfg)], mcfg, {"max_length": mcfg.data.max_length},
                                     needs=["data", *base_model]))
        for seed in seeds:
            suffix = f"/seed{seed}" if per_seed else ""
            seed_overrides = [*model_overrides, f"seed={seed}"] if per_seed else model_overrides
            seed_cfg = compose(seed_overrides) if per_seed else mcfg
            for method, label in zip(cfg.experiment.methods, grid_variants[1:]):
                method_overrides = [*seed_overrides, f"sft/method={method}"]
                scfg = compose(method_overrides)
                if method_label(scfg.sft.method) != label:
                    raise ConfigError(f"experiment.methods: an sft.method.* override in {overrides} makes {method} "
                                      f"train as {method_label(scfg.sft.method)} but the report looks for {label} (it "
                                      f"applies only to {cfg.sft.method.name} there); use sft.* settings, or run one "
                                      "method per experiment")
                if "sft" in stages:
                    argv = [*node_launcher(scfg), *torchrun_prefix(scfg), "-m", "sft.train", *method_overrides]
                    plan.append(StageCommand("sft", f"sft/{model}/{label}{suffix}", argv, [sft_run(scfg)], scfg,
                                             _sft_settings(scfg), needs=[f"tokenize/{model}"]))
            start_model = {variant: ["data", *base_model] if variant == BASE_VARIANT else
                           [f"sft/{model}/{variant}{suffix}"] for variant in grid_variants}
            if "eval_sft" in stages:
                plan.extend(_eval_commands(seed_cfg, seed_overrides, "sft", grid_variants, start_model, suffix))
            for variant in grid_rl_variants:
                if "rl" in stages:
                    rl_overrides = [*seed_overrides, f"rl.init={variant}"]
                    plan.append(StageCommand("rl", f"rl/{model}/{variant}{suffix}",
                                             _python_module("rl.train", rl_overrides), [rl_run(seed_cfg, variant)],
                                             seed_cfg, _rl_settings(seed_cfg, variant), needs=start_model[variant]))
                if "eval_rl" in stages:
                    plan.extend(_eval_commands(seed_cfg, seed_overrides, "rl", [variant],
                                               {variant: ["data", f"rl/{model}/{variant}{suffix}"]}, suffix))
    if "report" in stages:
        plan.append(StageCommand("report", "report", _python_module("report.run", overrides), [report_run(cfg)], cfg,
                                 needs=[command.name for command in plan], refresh=lambda: [report_run(cfg)]))
    names = {command.name for command in plan}
    for command in plan:
        command.needs = [need for need in command.needs if need in names]
    return plan


def _eval_commands(cfg: Config, overrides: list[str], phase: str, variants: list[str],
                   needs: dict[str, list[str]], suffix: str) -> list[StageCommand]:
    commands = []
    for variant in variants:
        argv = _python_module("eval.run", [*overrides, f"eval.phase={phase}", f"eval.variant={variant}"])
        runs = [eval_run(cfg, phase, variant, bench) for bench in cfg.data.benchmarks]
        heldout = heldout_nll_run(cfg, variant) if phase == "sft" else None  # it reads the tokenised held-out slice
        commands.append(StageCommand(f"eval_{phase}", f"eval/{cfg.model.name}/{phase}/{variant}{suffix}", argv,
                                     runs + ([heldout] if heldout else []), cfg,
                                     {**_eval_settings(cfg), "benchmarks": list(cfg.data.benchmarks)},
                                     needs=needs[variant] + ([f"tokenize/{cfg.model.name}"] if heldout else [])))
    return commands
