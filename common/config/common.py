"""Schemas shared by every stage: experiment, profile, model, logging; and the validation helpers."""
from __future__ import annotations

import re
from dataclasses import MISSING as NO_DEFAULT, Field, dataclass, field, fields, is_dataclass
from typing import Any, Iterable, Optional

from omegaconf import MISSING

from common.errors import ConfigError
from common.hub import looks_local
from common.numerics import CPU_ISAS

PROFILES = ("toy", "paper")
"""Every profile (``conf/profile/*.yaml``): toy (CPU) and paper (GPU cluster)."""
STAGES = ("data", "base", "sft", "eval_sft", "rl", "eval_rl", "report")
"""Every stage the orchestrator knows, in execution order."""


SUPERVISION = {"supervision": True}
"""Field metadata of a setting that changes how a run is supervised (timeouts, checkpoint cadence, threads, display),
not what it computes: :func:`computation_config` leaves it out, so it never changes a run's identity."""
IDENTITY_WHEN_SET = {"identity_when_set": True}
"""Field metadata of a setting added after runs already exist: :func:`computation_config` leaves it out while it
holds its default, so existing run identities do not change, and includes it once set."""
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")
"""Names that become path components: letters, digits and ``_ . = + -``, not starting with a dot."""


def computation_config(section: Any) -> Any:
    """A config section as plain data without its :data:`SUPERVISION` fields, nor its :data:`IDENTITY_WHEN_SET`
    fields at their defaults (what identifies a run)."""
    if is_dataclass(section):
        return {f.name: computation_config(getattr(section, f.name)) for f in fields(section)
                if not f.metadata.get("supervision")
                and not (f.metadata.get("identity_when_set") and getattr(section, f.name) == _default(f))}
    if isinstance(section, dict):
        return {key: computation_config(value) for key, value in section.items()}
    if isinstance(section, (list, tuple)):
        return [computation_config(value) for value in section]
    return section


def _default(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not NO_DEFAULT else f.default


def check_name(key: str, value: Any) -> None:
    """Raises :class:`ConfigError` naming ``key`` unless ``value`` is a safe path component (:data:`SAFE_NAME`)."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(f"{key} becomes a folder name and must match {SAFE_NAME.pattern} without '..'; "
                          f"got {value!r}")


def check_range(key: str, value: Any, low: float | None = None, high: float | None = None,
                *, low_open: bool = False, high_open: bool = False) -> None:
    """Raises :class:`ConfigError` naming ``key`` unless ``low <(=) value <(=) high``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number; got {value!r}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise ConfigError(f"{key} must be in {left}{lo}, {hi}{right}; got {value!r}")


def check_choice(key: str, value: Any, allowed: Iterable[Any]) -> None:
    """Raises :class:`ConfigError` naming ``key`` unless ``value`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {list(allowed)}; got {value!r}")


@dataclass
class SamplingConfig:
    """The sampling settings of evaluation (``eval.*``) and of DAPO's rollouts (``rl.*``): both schemas extend this
    one, so each field is declared once."""

    temperature: float = 1.0
    """Sampling temperature (evaluation: 0 is greedy; DAPO's rollouts need more than 0)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""

    def validate_sampling(self, section: str, *, greedy: bool) -> None:
        """Checks the fields under ``<section>.``; ``greedy`` allows temperature 0."""
        check_range(f"{section}.temperature", self.temperature, 0.0, low_open=not greedy)
        check_range(f"{section}.top_p", self.top_p, 0.0, 1.0, low_open=True)


@dataclass
class ExperimentConfig:
    """An experiment: which stages run, for which SFT methods and models (``conf/experiment/*.yaml``)."""

    name: str = MISSING
    """Experiment name; also the folder under ``run_root``."""
    stages: list[str] = field(default_factory=lambda: ["data"])
    """Stages to run, a subset of data, base, sft, eval_sft, rl, eval_rl, report (run in that order)."""
    methods: list[str] = field(default_factory=lambda: ["sft"])
    """SFT methods (``conf/sft/method/*.yaml`` names) trained, evaluated and handed to RL."""
    first_model_only: list[str] = field(default_factory=list)
    """Entries of ``methods`` trained and evaluated for the first model of ``profile.models`` only (the paper ran its
    random-masking and ρ ablations on Qwen3-4B alone); the other models' plans and tables leave them out."""
    rl_methods: list[str] = field(default_factory=list)
    """Methods whose SFT models go on to RL and its evaluation (Table 2): the entries of ``methods`` named here
    (``conf/sft/method/*.yaml`` names; one not in ``methods`` has no SFT run to start from and is passed over);
    empty: all of ``methods``."""
    rl_from_base: bool = True
    """Whether the base model gets an RL arm too (Table 2's Base row)."""
    run_root: str = "runs"
    """Folder holding every run directory (``<run_root>/<experiment>/<stage>/<variant>``)."""
    train_in: str = ""
    """Experiment folder that holds the data, tokens and SFT runs (default: this experiment's own). Table 2 trains
    in ``table1``, so ``reproduce-table2`` after ``reproduce-table1`` reuses every SFT checkpoint whose identity
    matches."""
    seeds: list[int] = field(default_factory=list)
    """Seeds of a multi-seed experiment: every SFT, RL and evaluation command runs once per seed (``seed=<s>``),
    each in its own folders, and the report aggregates them. Empty: the single top-level ``seed``."""
    base_seeds: list[int] = field(default_factory=list)
    """Base-model seeds (``toy.base_seed``) of a toy experiment whose base model is a random factor: one base model
    per entry, and every seed of ``seeds`` nested in each (its SFT, RL and evaluation runs start from that base
    model); the report's seed-level intervals and p take the base seed as the top-level unit (docs/evaluation.md).
    Empty: the single ``toy.base_seed``."""
    profiles: list[str] = field(default_factory=lambda: list(PROFILES), metadata=SUPERVISION)
    """The profiles the experiment is meant for (the toy-world experiments: ``[toy]``); composing it with another
    profile is an error naming both, unless ``any_profile`` is set."""
    any_profile: bool = field(default=False, metadata=SUPERVISION)
    """Run the experiment on a profile outside ``profiles`` on purpose (``experiment.any_profile=true``)."""
    parallel: int = field(default=1, metadata=SUPERVISION)
    """Stage commands run at the same time. On a 2-core CPU machine 2 overlaps vLLM's one-thread sampling and
    verl's start-up with training; on GPUs keep 1 (every stage uses all of a node's GPUs)."""

    def validate(self) -> None:
        check_name("experiment.name", self.name)
        if self.train_in:
            check_name("experiment.train_in", self.train_in)
        check_range("experiment.parallel", self.parallel, 1)
        for stage in self.stages:
            check_choice("experiment.stages[]", stage, STAGES)
        for profile in self.profiles:
            check_choice("experiment.profiles[]", profile, PROFILES)
        if not self.methods:
            raise ConfigError("experiment.methods must list at least one SFT method")
        if len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"experiment.methods has duplicates: {self.methods}")
        for method in self.first_model_only:
            check_choice("experiment.first_model_only[]", method, self.methods)
        if len(set(self.rl_methods)) != len(self.rl_methods):
            raise ConfigError(f"experiment.rl_methods has duplicates: {self.rl_methods}")
        for seed in self.seeds:
            check_range("experiment.seeds[]", seed, 0, 2**31 - 1)
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"experiment.seeds has duplicates: {self.seeds}")
        for seed in self.base_seeds:
            check_range("experiment.base_seeds[]", seed, 0, 2**31 - 1)
        if len(set(self.base_seeds)) != len(self.base_seeds):
            raise ConfigError(f"experiment.base_seeds has duplicates: {self.base_seeds}")


@dataclass
class ProfileConfig:
    """Scale and hardware of a run (``conf/profile/{toy,paper}.yaml``)."""

    name: str = MISSING
    """toy (CPU, synthetic arithmetic world) or paper (GPU cluster, Qwen3, OpenR1-Math)."""
    device: str = "cpu"
    """cpu (gloo, vLLM-CPU) or cuda (NCCL, CUDA vLLM)."""
    models: list[str] = field(default_factory=lambda: ["toy"])
    """Model configs (``conf/model/*.yaml``) an experiment runs for; Table 1 uses Qwen3-4B and -8B."""
    nproc_per_node: int = 1
    """Processes (GPUs) per node for torchrun and verl."""
    nnodes: int = 1
    """Nodes for torchrun's rendezvous and verl's Ray cluster."""
    num_threads: int = field(default=2, metadata=SUPERVISION)
    """torch CPU threads for single-process stages (CPU profile). The numbers do not depend on it."""
    cpu_isa: str = CPU_ISAS[0]
    """Instruction set of the CPU kernels (ATen, MKL, oneDNN) on a CPU profile: avx2 pins them, so every x86-64 CPU
    with AVX2 computes the same numbers; native lets each library pick the machine's best, and the run identities
    then name the instruction set found (common/numerics.py)."""

    def validate(self) -> None:
        check_choice("profile.name", self.name, PROFILES)
        check_choice("profile.device", self.device, ("cpu", "cuda"))
        if not self.models:
            raise ConfigError("profile.models must list at least one model config name")
        check_range("profile.nproc_per_node", self.nproc_per_node, 1, 1024)
        check_range("profile.nnodes", self.nnodes, 1, 4096)
        check_range("profile.num_threads", self.num_threads, 1, 1024)
        check_choice("profile.cpu_isa", self.cpu_isa, CPU_ISAS)


@dataclass
class ModelConfig:
    """The base model (``conf/model/*.yaml``)."""

    name: str = MISSING
    """Short name used in run folders and tables (e.g. qwen3_4b)."""
    source: str = "hub"
    """hub (a hub id or local folder for ``from_pretrained``), toy (built by the base stage) or gguf."""
    path: str = ""
    """Hub id or local folder (hub/gguf sources); empty for toy."""
    gguf_file: str = ""
    """File name inside ``path`` for the gguf source (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)."""
    display_name: str = field(default="", metadata=SUPERVISION)
    """Name shown in tables (e.g. Qwen3-4B)."""
    dtype: str = "bfloat16"
    """Weights and compute dtype for generation, RL (actor, reference, rollout) and exports: bfloat16 or float32."""
    export_dtype: str = ""
    """Weights dtype of the SFT export when it differs from ``dtype`` (the toy model exports float32 so the exported
    log-probs match the trained model's exactly)."""
    attn_implementation: str = "sdpa"
    """transformers attention implementation (sdpa works everywhere; flash_attention_2 on GPUs)."""

    def check_label(self) -> None:
        """A hub model's label (``name`` for folders, ``display_name`` for tables and plots) is its own: a hub id
        ``org/<display_name>``. Refuses ``model.path`` set to another hub model under a preset's labels (every folder
        and the report would name the preset's model), naming the two ways out."""
        if self.source != "hub" or not self.display_name or looks_local(self.path):
            return
        model = self.path.rsplit("/", 1)[1]
        if model != self.display_name:
            name = re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")
            raise ConfigError(f"model.path={self.path} is not the model of model.name={self.name} "
                              f"({self.display_name}), whose labels its folders and report would carry; choose its "
                              f"preset where conf/model/{name}.yaml exists: profile.models=[{name}]; or label it: "
                              f"model.name={name} model.display_name={model} profile.models=[{name}]")

    def validate(self) -> None:
        check_name("model.name", self.name)
        check_choice("model.source", self.source, ("hub", "toy", "gguf"))
        if self.source in ("hub", "gguf") and not self.path:
            raise ConfigError(f"model.path must be set for model.source={self.source}")
        if self.source == "gguf" and not self.gguf_file:
            raise ConfigError("model.gguf_file must be set for model.source=gguf")
        if self.source != "gguf" and self.gguf_file:
            raise ConfigError(f"model.gguf_file is only read for model.source=gguf; got model.source={self.source}")
        self.check_label()
        check_choice("model.dtype", self.dtype, ("bfloat16", "float32"))
        check_choice("model.export_dtype", self.export_dtype, ("", "bfloat16", "float32"))
        check_choice("model.attn_implementation", self.attn_implementation,
                     ("sdpa", "eager", "flash_attention_2"))


@dataclass
class LoggingConfig:
    """Where metrics go: JSONL always, wandb by mode, progress bars."""

    wandb_mode: str = "disabled"
    """online, offline or disabled. The JSONL file is always written and is the source of truth."""
    wandb_project: str = "eksft"
    """wandb project name."""
    progress: bool = True
    """Show progress bars with ETA (tqdm) on long loops."""
    log_every: int = 1
    """Write a metrics line every N optimiser steps."""
    run_name: Optional[str] = None
    """Display name for wandb; defaults to <experiment>/<stage>/<variant>."""

    def validate(self) -> None:
        check_choice("logging.wandb_mode", self.wandb_mode, ("online", "offline", "disabled"))
        check_range("logging.log_every", self.log_every, 1)
