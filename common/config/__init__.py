"""The typed configuration of every stage: dataclass schemas registered in Hydra's ConfigStore.

Hydra composes ``conf/config.yaml``; :func:`to_config` turns the composed ``DictConfig`` into a
:class:`Config` object and validates it before any compute. Every error names the key to change,
e.g. ``sft.method.rho must be in [0, 1]; got 1.5``.

Each stage's schema lives in its own module of this package (``data``, ``toy``, ``sft``, ``rl``,
``eval``, ``report``); this package is a leaf: it imports no stage package, so every stage may import it.
"""
from __future__ import annotations

import copy
import functools
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from common.config.common import (
    ConfigError,
    ExperimentConfig,
    LoggingConfig,
    ModelConfig,
    ProfileConfig,
    check_choice,
    check_range,
)
from common.config.data import DataConfig
from common.config.eval import EvalConfig
from common.config.report import ReportConfig, refuse_moved_keys
from common.config.rl import RLConfig
from common.config.sft import SFT_METHOD_SCHEMAS, SFTConfig
from common.config.toy import ToyConfig
from common.errors import user_errors_in_one_line
from common.locks import unwritable
from common.numerics import pin_this_process
from common.processes import die_with_agent, termination_signals_interrupt

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

__all__ = [
    "CONF_DIR",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ExperimentConfig",
    "LoggingConfig",
    "ModelConfig",
    "ProfileConfig",
    "RLConfig",
    "ReportConfig",
    "SFTConfig",
    "ToyConfig",
    "check_choice",
    "check_range",
    "compose",
    "override_value",
    "refusing_unknown_choices",
    "require_writable_run_root",
    "stage_main",
    "to_config",
]


@dataclass
class Config:
    """Root of the composed configuration (``conf/config.yaml``)."""

    experiment: ExperimentConfig = MISSING
    """What to run: the stage list, the SFT methods and the run root."""
    profile: ProfileConfig = MISSING
    """Scale and hardware: toy (CPU, minutes) or paper (GPU cluster)."""
    model: ModelConfig = MISSING
    """The base model every stage starts from."""
    data: DataConfig = MISSING
    """Training data source, split and formatting."""
    toy: ToyConfig = field(default_factory=ToyConfig)
    """The synthetic arithmetic world and its tiny base model (used when ``model.source == toy``)."""
    sft: SFTConfig = MISSING
    """Supervised fine-tuning: method, optimiser, FSDP2."""
    rl: RLConfig = MISSING
    """DAPO with verl on Ray."""
    eval: EvalConfig = MISSING
    """vLLM sampling, math-verify scoring, avg@n and pass@k."""
    report: ReportConfig = MISSING
    """The report's tables, analyses and primary comparisons."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """JSONL metrics (always), wandb mode, progress bars."""
    seed: int = 0
    """Training seed (model init, data order, sampling). The data split has its own ``data.split_seed``."""
    dry_run: bool = False
    """Print every stage and its exact command without running anything."""
    preflight: bool = False
    """Orchestrator only: run the checks of common/preflight.py for the pending stages, then stop (they also run
    before the first stage of every run)."""
    force: list[str] = field(default_factory=list)
    """Orchestrator only: commands to redo from scratch, as glob patterns over command names or stage names
    (``force=[sft/toy/eksft*]``, ``force=[eval_rl]``); everything that reads their outputs re-runs as a consequence."""

    def run_seeds(self) -> list[int]:
        """The seeds every SFT, RL and evaluation command runs for: ``experiment.seeds``, else ``[seed]``."""
        return list(self.experiment.seeds) or [self.seed]

    def validate(self) -> "Config":
        check_range("seed", self.seed, 0, 2**31 - 1)
        self.experiment.validate()
        presets = sorted(path.stem for path in (CONF_DIR / "sft" / "method").glob("*.yaml"))
        for method in self.experiment.rl_methods:
            check_choice("experiment.rl_methods[]", method, presets)
        for method in self.report.primary_arms:
            check_choice("report.primary_arms[]", method, presets)
        self.profile.validate()
        if self.profile.name not in self.experiment.profiles and not self.experiment.any_profile:
            meant = "|".join(self.experiment.profiles)
            raise ConfigError(f"experiment={self.experiment.name} is meant for profile={meant} (experiment.profiles); "
                              f"got profile={self.profile.name}: choose profile={meant}, or add "
                              "experiment.any_profile=true to run it on this profile on purpose")
        self.model.validate()
        self.data.validate()
        self.toy.validate()
        self.sft.validate()
        self.rl.validate()
        self.check_rl_algorithm_name()
        self.eval.validate()
        self.report.validate()
        for name in self.eval.benchmarks:
            check_choice("eval.benchmarks[] (a name from data.benchmarks or data.extra_benchmarks)", name,
                         [*self.data.benchmarks, *self.data.extra_benchmarks])
        self.logging.validate()
        if self.experiment.base_seeds and self.model.source != "toy":
            raise ConfigError(f"experiment.base_seeds={list(self.experiment.base_seeds)} needs a base model the "
                              f"pipeline trains (model.source=toy); model {self.model.name} is "
                              f"{self.model.source!r}: leave experiment.base_seeds empty")
        if self.model.source == "toy" and self.profile.name != "toy":
            raise ConfigError(f"model=toy needs profile=toy; got profile={self.profile.name}")
        return self


    def check_rl_algorithm_name(self) -> None:
        """``rl.algorithm`` names the preset whose estimator and policy loss run: ``rl.algorithm=gspo`` (a dot) would
        only rename DAPO, in the run identity and in Table 2."""
        preset = group_node("rl/algorithm", self.rl.algorithm)
        for key in ("adv_estimator", "policy_loss_mode"):
            if getattr(self.rl, key) != preset[key]:
                raise ConfigError(f"rl.algorithm={self.rl.algorithm} runs rl.{key}={getattr(self.rl, key)}, not its "
                                  f"preset's {preset[key]}: choose an algorithm with rl/algorithm=<name> (a slash), "
                                  f"and change rl.{key} only with the preset that has it")


def _register() -> None:
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    store.store(group="experiment", name="base_experiment", node=ExperimentConfig)
    store.store(group="profile", name="base_profile", node=ProfileConfig)
    store.store(group="model", name="base_model", node=ModelConfig)
    store.store(group="data", name="base_data", node=DataConfig)
    store.store(group="sft", name="base_sft", node=SFTConfig)
    for name, schema in SFT_METHOD_SCHEMAS.items():
        store.store(group="sft/method", name=f"base_{name}", node=schema)
    store.store(group="rl", name="base_rl", node=RLConfig)
    store.store(group="eval", name="base_eval", node=EvalConfig)
    store.store(group="report", name="base_report", node=ReportConfig)


_register()
# imported after the schemas are registered; the import registers the ``catalogue`` resolver
from common.config.catalogue import group_node, refuse_unknown_choices  # noqa: E402


def to_config(cfg: DictConfig) -> Config:
    """Converts a composed Hydra config into a validated :class:`Config` (raises :class:`ConfigError`)."""
    if HydraConfig.initialized():  # a command line (a compose() call checks its overrides itself)
        refuse_unknown_choices(HydraConfig.get().overrides.task)
        refuse_moved_keys(HydraConfig.get().overrides.task)
    try:
        obj = OmegaConf.to_object(cfg)
    except Exception as exc:  # omegaconf's own type/missing-value errors already name the key
        raise ConfigError(str(exc)) from exc
    if not isinstance(obj, Config):
        raise ConfigError(f"the composed config is not a Config (got {type(obj).__name__}); "
                          "is 'base_config' first in conf/config.yaml's defaults?")
    unknown = list(unknown_keys(obj))
    if unknown:
        raise ConfigError(f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: no schema field "
                          "has that name (a '+key=value' override adds a key that nothing reads); check the spelling")
    return obj.validate()


def unknown_keys(obj: Any, prefix: str = "") -> Iterator[str]:
    """Dotted keys of ``obj`` (a converted config) that its dataclass schemas do not declare: Hydra's ``+`` adds keys
    to struct configs, and ``OmegaConf.to_object`` sets them as attributes."""
    if is_dataclass(obj):
        declared = {f.name for f in fields(obj)}
        for key in sorted(vars(obj)):
            if key not in declared:
                yield f"{prefix}{key}"
        for name in sorted(declared):
            yield from unknown_keys(getattr(obj, name), f"{prefix}{name}.")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from unknown_keys(value, f"{prefix}{key}.")


def require_writable_run_root(cfg: Config) -> None:
    """Raises :class:`ConfigError` naming ``experiment.run_root`` and the fix when this user cannot create or write it
    (checked before any manifest is read or lock taken there)."""
    reason = unwritable(cfg.experiment.run_root)
    if reason is not None:
        raise ConfigError(f"experiment.run_root={cfg.experiment.run_root}: {reason}; fix: set experiment.run_root to "
                          "a folder you can write (or fix its permissions)")


def stage_main(run: Callable[[Config], Any]) -> Callable[[], None]:
    """A stage's command-line entry point: Hydra composes ``conf/config.yaml`` with the arguments, the process
    computes with the kernels ``profile.cpu_isa`` names (:func:`common.numerics.pin_this_process`), checks that
    ``experiment.run_root`` can be written, then ``run(to_config(cfg))``, with SIGTERM and SIGHUP acting as Ctrl-C
    (:func:`termination_signals_interrupt`) and a worker of torchrun's agent ending with it
    (:func:`die_with_agent`). A :class:`common.errors.UserError` ends it with its message alone
    (:func:`common.errors.user_errors_in_one_line`).
    Use as ``main = stage_main(run)`` in the stage module."""

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
    def main(cfg: DictConfig) -> None:
        die_with_agent()
        with termination_signals_interrupt(), user_errors_in_one_line():
            config = to_config(cfg)
            pin_this_process(config.profile.device, config.profile.cpu_isa)
            require_writable_run_root(config)
            run(config)

    return refusing_unknown_choices(main)


def refusing_unknown_choices(main: Callable[[], None]) -> Callable[[], None]:
    """A Hydra entry point that first refuses a command-line choice naming no option of its group, in one line
    (:func:`common.config.catalogue.refuse_unknown_choices`)."""

    @functools.wraps(main)
    def checked() -> None:
        with user_errors_in_one_line():
            refuse_unknown_choices(sys.argv[1:])
        main()

    return checked


def override_value(value: Any) -> str:
    """A Python value as a Hydra override value: true/false, repr floats, [a,b] lists, {k:v} dicts, quoted odd
    strings (a path with ``=`` or a space, e.g.)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{override_value(item)}" for key, item in value.items()) + "}"
    text = str(value)
    if text == "" or any(char in text for char in " ,[]{}()='\"\\$*?<>|&;#"):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Composes ``conf/config.yaml`` with command-line style overrides and validates it (a fresh copy each call:
    the orchestrator composes the same few configs many times, and one Hydra composition takes ~0.3-0.7 s)."""
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.lru_cache(maxsize=512)
def _composed(overrides: tuple[str, ...]) -> Config:
    return to_config(compose_dict(overrides))


def compose_dict(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Composes ``conf/config.yaml`` with overrides, without converting it.

    As Hydra composes: the overrides that choose configs (``profile=paper``, ``sft/method=eksft``, ``hydra.*``)
    build the defaults list, then the value overrides (``sft.lr=1e-5``, ``+key=v``, ``~key``) are applied in their
    order to the result, by Hydra's own function. Each set of choices is composed once per process, so the planner's
    configs that differ only in values (seeds, run roots) cost one Hydra composition."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    refuse_unknown_choices(overrides)
    refuse_moved_keys(overrides)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    cfg = copy.deepcopy(_composed_choices(tuple(o.input_line for o in parsed if _chooses_configs(o))))
    ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if not _chooses_configs(o)], cfg)
    return cfg


def _chooses_configs(override: Override) -> bool:
    """Whether a parsed override is Hydra's to resolve while it builds the defaults list (a config group's choice,
    a package, a sweep, a ``hydra`` key) rather than a value set on the composed config."""
    return (override.is_hydra_override() or override.package is not None or override.is_sweep_override()
            or (CONF_DIR / override.key_or_group).is_dir())


@functools.lru_cache(maxsize=128)
def _composed_choices(overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name="config", overrides=list(overrides))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def to_yaml(cfg: Any) -> str:
    """The resolved YAML of a config object or DictConfig (what the manifest hashes)."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    return OmegaConf.to_yaml(node, resolve=True, sort_keys=True)
