"""The experiment grid: its models (``profile.models``), seeds (``cfg.run_seeds()``) and arms (``base``, each of
``experiment.methods``, then the sweep points), and each arm's run folders, computed once from the config.

    grid = experiment_grid(cfg)
    for model in grid.models:                  # ModelGrid: the model's config and its seeds
        for seed, scfg in model.seeds.items():
            for variant, a in model.arms[seed].items():   # Arm: a.sft (Table 1's model), a.rl (Table 2's)
                ...

The plan (``pipeline.stages.build_plan``) launches the commands of ``experiment_grid(cfg, sweep_points=False)``; the
report (``report.run``, ``report.bfcl``) and its identity (:func:`report_run`) read the same grid, with the sweep
points when the sweep analysis is on. A label is a name only: what a stage reads is the run folder an :class:`Arm`
holds (common/paths.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Union

from common.config import Config, ConfigError, compose
from common.config.common import computation_config
from common.config.sft import SFTMethod
from common.manifest import MANIFEST_NAME, StageInputError, read_manifest
from common.paths import (
    BASE_VARIANT,
    RunSpec,
    base_run,
    data_run,
    eval_run,
    heldout_nll_run,
    method_label,
    report_benchmarks,
    report_dir,
    rl_run,
    sft_run,
    tokens_run,
    trained_method,
    training_dir,
)

PHASES = ("sft", "rl")
"""The evaluation phases: ``sft`` (Table 1: the base model and the SFT runs), ``rl`` (Table 2: the RL runs)."""


def with_method(cfg: Config, method: SFTMethod) -> Config:
    """``cfg`` training ``method`` (an entry of ``experiment.methods``, or a sweep point read from a manifest)."""
    return replace(cfg, sft=replace(cfg.sft, method=method))


def model_configs(cfg: Config) -> list[Config]:
    """``cfg`` once per model of ``profile.models`` (the command line's model keeps its overrides)."""
    configs = []
    for name in cfg.profile.models:
        model = cfg.model if name == cfg.model.name else \
            compose([f"profile={cfg.profile.name}", f"model={name}"]).model
        configs.append(replace(cfg, model=model))
    return configs


def experiment_method_names(cfg: Config) -> list[str]:
    """The ``experiment.methods`` entries ``cfg.model`` trains: all of them for the first model of
    ``profile.models``, all but ``experiment.first_model_only`` for the others."""
    first = cfg.model.name == cfg.profile.models[0]
    return [name for name in cfg.experiment.methods if first or name not in cfg.experiment.first_model_only]


def experiment_methods(cfg: Config) -> list[SFTMethod]:
    """The method config of each entry of :func:`experiment_method_names` (the command line's method keeps its
    overrides)."""
    return [cfg.sft.method if name == cfg.sft.method.name else compose([f"sft/method={name}"]).sft.method
            for name in experiment_method_names(cfg)]


def method_labels(cfg: Config) -> list[str]:
    """The label of each entry of :func:`experiment_method_names`."""
    return [method_label(method) for method in experiment_methods(cfg)]


def variants(cfg: Config) -> list[str]:
    """``base`` then every method label: the rows of Table 1."""
    return [BASE_VARIANT, *method_labels(cfg)]


def rl_variants(cfg: Config) -> list[str]:
    """``base`` (unless ``experiment.rl_from_base`` is false) then the label of every entry of
    :func:`experiment_method_names` that ``experiment.rl_methods`` names (every one when it is empty): the RL arms,
    the rows of Table 2."""
    chosen = cfg.experiment.rl_methods or cfg.experiment.methods
    return [*([BASE_VARIANT] if cfg.experiment.rl_from_base else []),
            *(label for name, label in zip(experiment_method_names(cfg), method_labels(cfg)) if name in chosen)]




@dataclass(frozen=True)
class Arm:
    """One row of Tables 1 and 2 for one model and seed: a variant and the run folders behind it."""

    variant: str
    """``base`` or the method's label (a name only)."""
    method: SFTMethod | None
    """The SFT method; None for the base model."""
    sft: Path | None
    """The SFT run folder (Table 1's model); None for the base model."""
    rl: Path
    """The RL run folder that starts from it (Table 2's model)."""

    def model(self, phase: str) -> Path | None:
        """The run folder phase ``sft`` or ``rl`` evaluates (None: the base model itself)."""
        return self.sft if phase == "sft" else self.rl


def arm(cfg: Config, method: SFTMethod | None) -> Arm:
    """The arm of ``method`` (None: the base model) under ``cfg`` (its model and seed)."""
    if method is None:
        return Arm(BASE_VARIANT, None, None, rl_run(cfg, BASE_VARIANT, None).directory)
    variant, sft = method_label(method), sft_run(with_method(cfg, method)).directory
    return Arm(variant, method, sft, rl_run(cfg, variant, sft).directory)


def arms(cfg: Config) -> list[Arm]:
    """The experiment's arms for ``cfg``'s model and seed: ``base``, then each ``experiment.methods`` entry."""
    return [arm(cfg, None), *(arm(cfg, method) for method in experiment_methods(cfg))]


def arm_named(cfg: Config, variant: str) -> Arm:
    """The experiment's arm labelled ``variant`` (``base`` or the label of an ``experiment.methods`` entry)."""
    found = {a.variant: a for a in arms(cfg)}
    if variant not in found:
        raise ConfigError(f"no arm of the experiment is labelled {variant!r}; its arms: {list(found)}")
    return found[variant]


def sweep_arms(cfg: Config) -> list[Arm]:
    """The other complete SFT runs of ``cfg.model`` that ``cfg`` would train with another method: a sweep's points
    (same data, seed and settings; the method read from each run's manifest), sorted by label."""
    known = set(method_labels(cfg))
    found = {}
    for path in sorted((training_dir(cfg) / "sft" / cfg.model.name).glob(f"*/{MANIFEST_NAME}")):
        try:
            manifest = read_manifest(path.parent)
        except StageInputError:  # written by an older pipeline version: never reused
            continue
        if manifest is None or not manifest.complete or manifest.stage != "sft":
            continue
        candidate = arm(cfg, trained_method(path.parent))
        if candidate.sft == path.parent and candidate.variant not in known:
            found[candidate.variant] = candidate
    return [found[label] for label in sorted(found)]


class NestedSeed(NamedTuple):
    """A run's seeds when the base model is a random factor (``experiment.base_seeds``): the base model's seed and
    the SFT seed nested in it. Sorted base first; the report's seed-level statistics take ``base`` as their unit."""

    base: int
    seed: int

    def __str__(self) -> str:
        return f"b{self.base}s{self.seed}"


RunSeed = Union[int, NestedSeed]
"""What keys a grid's runs: the seed, or a :class:`NestedSeed` when the experiment lists ``experiment.base_seeds``."""


def base_seeds(cfg: Config) -> list[int | None]:
    """``experiment.base_seeds``, or ``[None]`` (the configured ``toy.base_seed`` alone) when it is empty."""
    return list(cfg.experiment.base_seeds) or [None]


def with_base_seed(cfg: Config, base_seed: int | None) -> Config:
    """``cfg`` on the base model of ``base_seed`` (``toy.base_seed``; None: ``cfg`` as it is)."""
    return cfg if base_seed is None else replace(cfg, toy=replace(cfg.toy, base_seed=base_seed))


def run_seeds(cfg: Config) -> list[RunSeed]:
    """Every run's seed key: ``cfg.run_seeds()``, each nested in every ``experiment.base_seeds`` entry when the
    experiment lists some."""
    return [seed if base is None else NestedSeed(base, seed) for base in base_seeds(cfg) for seed in cfg.run_seeds()]


def top_level_unit(seed: RunSeed) -> int:
    """The independent unit a run belongs to: its base seed when the base model is a random factor, else its seed."""
    return seed.base if isinstance(seed, NestedSeed) else seed


def seed_config(cfg: Config, key: RunSeed) -> Config:
    """``cfg`` for the runs of ``key``: its seed, on its base seed's model when it is a :class:`NestedSeed`."""
    if isinstance(key, NestedSeed):
        return with_base_seed(replace(cfg, seed=key.seed), key.base)
    return replace(cfg, seed=key)


def seed_configs(cfg: Config) -> dict[RunSeed, Config]:
    """``cfg`` once per key of :func:`run_seeds` (``experiment.seeds``, else ``seed``; on the base model of each
    ``experiment.base_seeds`` entry)."""
    return {key: seed_config(cfg, key) for key in run_seeds(cfg)}


@dataclass
class ModelGrid:
    """One model of the grid: its config, its seeds' configs and, per seed, its arms by variant (the experiment's,
    then the sweep points)."""

    cfg: Config
    seeds: dict[RunSeed, Config]
    arms: dict[RunSeed, dict[str, Arm]]
    variants: list[str]
    """``base`` then every method label this model trains: its rows of Table 1 (:func:`variants`)."""
    rl_variants: list[str]
    """Its RL arms, the rows of Table 2 (:func:`rl_variants`)."""

    @property
    def first_seed(self) -> dict[str, Arm]:
        """The arms of the first seed (the analyses that compare single checkpoints read these)."""
        return next(iter(self.arms.values()))

    def has(self, variant: str) -> bool:
        """Whether this model has an arm ``variant`` (``experiment.first_model_only`` arms: the first model only)."""
        return variant in self.first_seed

    def experiment_arms(self, seed: RunSeed) -> list[Arm]:
        """The experiment's arms of ``seed`` (``base`` and each ``experiment.methods`` entry; no sweep point)."""
        return [self.arms[seed][variant] for variant in self.variants]


@dataclass
class Grid:
    """Every model of ``profile.models`` with its seeds and arms (:func:`experiment_grid`)."""

    cfg: Config
    models: list[ModelGrid]

    @property
    def variants(self) -> list[str]:
        """Every model's Table 1 rows, in order, once each."""
        return list(dict.fromkeys(variant for model in self.models for variant in model.variants))

    @property
    def rl_variants(self) -> list[str]:
        """Every model's Table 2 rows, in order, once each."""
        return list(dict.fromkeys(variant for model in self.models for variant in model.rl_variants))


def model_grid(mcfg: Config, sweep_points: bool) -> ModelGrid:
    """``mcfg``'s model with, per seed, the arms of :func:`arms` then, with ``sweep_points``, those of
    :func:`sweep_arms`."""
    seeds = seed_configs(mcfg)
    by_seed = {seed: {a.variant: a for a in arms(scfg) + (sweep_arms(scfg) if sweep_points else [])}
               for seed, scfg in seeds.items()}
    return ModelGrid(mcfg, seeds, by_seed, variants(mcfg), rl_variants(mcfg))


def experiment_grid(cfg: Config, sweep_points: bool | None = None) -> Grid:
    """The grid of ``cfg``: the :func:`model_grid` of every model of :func:`model_configs`, with the sweep points
    when ``sweep_points`` says so (default: when ``report.analysis.run`` has the sweep analysis)."""
    if sweep_points is None:
        sweep_points = "sweep" in cfg.report.analysis.run
    return Grid(cfg, [model_grid(mcfg, sweep_points) for mcfg in model_configs(cfg)])


def report_run(cfg: Config, grid: Grid | None = None) -> RunSpec:
    """The experiment's report. Its inputs are the runs the current config reads, no others: per model and seed of
    ``grid`` (default: :func:`experiment_grid` of ``cfg``), each arm's SFT and RL runs, their evaluations and held-out
    NLL, and the base model's and the tokenised split's runs. A config switched back therefore reads, and renders,
    what it read before."""
    grid = grid or experiment_grid(cfg)
    folders: list[Path] = []
    for model in grid.models:
        for base_seed in base_seeds(cfg):
            if (base := base_run(with_base_seed(model.cfg, base_seed))) is not None:
                folders.append(base.directory)
            folders.append(tokens_run(with_base_seed(model.cfg, base_seed)).directory)
        for seed, scfg in model.seeds.items():
            for a in model.arms[seed].values():
                folders += [folder for folder in (a.sft, a.rl) if folder is not None]
                folders += [eval_run(scfg, phase, a.variant, bench, a.model(phase)).directory
                            for phase in PHASES for bench in report_benchmarks(cfg)]
                if (heldout := heldout_nll_run(scfg, a.variant, a.sft)) is not None:
                    folders.append(heldout.directory)
    config = {"eval": {k: v for k, v in computation_config(cfg.eval).items()
                       if k not in ("phase", "variant", "model_path", "model_run")},
              "report": computation_config(cfg.report),
              "experiment": {"methods": method_labels(cfg), "seeds": cfg.run_seeds(),
                             "stages": list(cfg.experiment.stages),
                             **({"base_seeds": list(cfg.experiment.base_seeds)} if cfg.experiment.base_seeds else {})},
              "models": {m.cfg.model.name: m.cfg.model.display_name for m in grid.models},
              "rl": {"rollout_n": cfg.rl.rollout_n, "kept_groups_per_step": cfg.rl.kept_groups_per_step},
              "device": cfg.profile.device, "data": data_run(cfg).directory.name}
    inputs = {str(folder.relative_to(cfg.experiment.run_root)): folder for folder in folders}
    return RunSpec("report", "", report_dir(cfg), config, inputs, optional_inputs=True)
