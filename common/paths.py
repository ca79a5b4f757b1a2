"""Where each stage reads and writes and what identifies each run, derived from the config alone: the run layout.

    <run_root>/<experiment>/data/<source>-<id>/                            sft.parquet, rl.parquet, benchmarks/
    <run_root>/<experiment>/tokens/<model>-<id>/                           sft_tokens.parquet
    <run_root>/cache/base/<toy-config-hash>/                               toy base model (shared across experiments)
    <run_root>/cache/reference_hidden/<key>/                               frozen reference's hidden states
    <run_root>/<experiment>/sft/<model>/<method-label>-<id>/               checkpoints/, hf/, metrics.jsonl
    <run_root>/<experiment>/rl/<model>/<variant>-<id>/                     verl checkpoints, hf/, metrics.jsonl
    <run_root>/<experiment>/eval/<model>/<phase>/<variant>-<id>/<benchmark>/   samples.jsonl, metrics.json
    <run_root>/<experiment>/report/                                        tables, plots, report.md

Every folder holds a ``manifest.json``. ``<id>`` is the first 8 hex digits of the hash of the run's *identity*: its
computation config (:func:`common.config.common.computation_config`: seeds, optimiser, budgets, method fields,
model, sampling protocol; never timeouts, checkpoint cadence or logging) plus the folder names of the runs it reads,
so two computations never share a folder and a changed setting upstream gives new folders downstream. The same
identity is the manifest's ``config``; :func:`common.manifest.run_state` compares it, and the upstream manifests'
run ids and output fingerprints, before any skip.

``variant`` is ``base`` (the untrained base model) or an SFT method label; ``phase`` is ``sft`` (Table 1) or
``rl`` (Table 2).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterator

from common.config import Config, ConfigError, compose
from common.config.common import check_name, computation_config
from common.config.sft import SFT_METHOD_SCHEMAS, SFTMethod
from common.manifest import MANIFEST_NAME, config_hash

BASE_VARIANT = "base"
"""Variant name of the untrained base model (the 'Base' rows of Tables 1 and 2)."""


def _format_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def method_label(method: SFTMethod) -> str:
    """Folder/table label of an SFT method: its name plus every field that differs from the schema default.

    ``eksft`` with the paper's values is ``eksft``; a sweep point with ρ=0.1 is ``eksft_rho0.1``, so sweep
    members and ablations never share a folder.
    """
    schema = SFT_METHOD_SCHEMAS[method.name]
    defaults = schema()
    parts = [method.name]
    for f in fields(schema):
        if f.name == "name":
            continue
        value = getattr(method, f.name)
        if value != getattr(defaults, f.name):
            parts.append(f"{f.name}{_format_value(value)}")
    return "_".join(parts)


def parse_method_label(label: str) -> SFTMethod:
    """Inverse of :func:`method_label`: ``eksft_rho0.1`` → ``EKSFTMethod(rho=0.1)``, ``eksft`` → the defaults.

    Field names may contain underscores and prefix each other (``dynamic_lambda``, ``dynamic_lambda_factor``), so
    every split into fields (in schema order) and typed values is tried; the first whose :func:`method_label` is
    ``label`` again wins. Raises ``ValueError`` naming the label when none does (e.g. ``my_model``).
    """
    name, _, rest = label.partition("_")
    if name not in SFT_METHOD_SCHEMAS:
        raise ValueError(f"label {label!r} does not start with an SFT method name ({sorted(SFT_METHOD_SCHEMAS)})")
    schema = SFT_METHOD_SCHEMAS[name]
    types = typing.get_type_hints(schema)
    names = [f.name for f in fields(schema) if f.name != "name"]
    for values in _field_splits(rest, names, types):
        method = schema(**values)
        try:
            method.validate()
        except ConfigError:
            continue
        if method_label(method) == label:
            return method
    raise ValueError(f"label {label!r} is not a label of method {name} (fields {names})")


def _field_splits(text: str, names: list[str], types: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every way to read ``text`` as ``<field><value>_<field><value>...`` with fields in the order of ``names``."""
    if not text:
        yield {}
        return
    for index, name in enumerate(names):
        if not text.startswith(name):
            continue
        tail = text[len(name):]
        for end in [*(i for i, ch in enumerate(tail) if ch == "_"), len(tail)]:
            value = _typed_value(tail[:end], types[name])
            if value is _NOT_A_VALUE:
                continue
            rest = tail[end + 1:] if end < len(tail) else ""
            for values in _field_splits(rest, names[index + 1:], types):
                yield {name: value, **values}


_NOT_A_VALUE = object()


def _typed_value(text: str, annotation: Any) -> Any:
    """``text`` as written by :func:`_format_value` for a field of type ``annotation``, or ``_NOT_A_VALUE``."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else (annotation,)
    if type(None) in options and text == "None":
        return None
    for kind in options:
        if kind is bool and text in ("True", "False"):
            return text == "True"
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                continue
        if kind is str:
            return text
    return _NOT_A_VALUE


ID_LENGTH = 8
"""Hex digits of the identity hash in a run folder's name."""
TOKENISATION_FIELDS = ("max_length", "strip_leading_think")
"""data fields read only by tokenisation: part of the tokens' identity, not the data stage's."""
IGNORE_INDEX = -100
"""The ``labels`` value of a token without a training target (prompt, padding) in the tokens hand-off: HF's ignore
index."""
SFT_ROWS_FILE = "sft.parquet"
"""The data run's SFT split (LUFFY rows + ``row_id``, or tool-use rows), read by tokenisation."""
RL_TRAIN_FILE = "rl.parquet"
"""The data run's RL split as verl RLHF rows (verl's ``data.train_files``)."""
RL_VAL_FILE = "rl_val.parquet"
"""The RL rows held out for verl's validation (``data.val_files``), disjoint from :data:`RL_TRAIN_FILE`."""
SFT_TOKENS_FILE = "sft_tokens.parquet"
"""The tokenised SFT split in a tokens run folder."""
HELDOUT_ROWS_FILE = "sft_heldout.parquet"
"""The data run's held-out SFT slice (``data.num_heldout_rows`` rows SFT never trains on; LUFFY rows + ``row_id``)."""
HELDOUT_TOKENS_FILE = "heldout_tokens.parquet"
"""The held-out slice tokenised exactly as the SFT split (the columns of :data:`SFT_TOKENS_FILE`), in the tokens run."""
HELDOUT_NLL_DIR = "heldout_nll"
"""The held-out NLL's run folder inside an evaluation's ``<variant>-<id>/``, beside the benchmarks' folders."""
HELDOUT_NLL = "heldout_nll_nats"
"""Metric of a :func:`heldout_nll_run`: mean negative log-likelihood per supervised token of the held-out slice."""
SAMPLES_FILE = "samples.jsonl"
"""An evaluation's samples, one JSON line per sample (``problem_id``, ``sample_index``, ``seed``, text, verdict), in each
benchmark's run folder; appended problem by problem (``eval.stage.sample_problems``)."""
EVAL_METRICS_FILE = "metrics.json"
"""An evaluation's metrics (avg@n, pass@k, per-problem correct counts, the protocol) in each benchmark's run folder,
read by the report."""
TRAINING_METRICS_FILE = "metrics.jsonl"
"""One JSON line per logged step, written by every training stage (base pretraining, SFT, RL) and read by the report."""
RL_DISCARDED_GROUPS = "training/filter_groups/evicted_samples"
"""verl's per-step count, in an RL run's :data:`TRAINING_METRICS_FILE`, of the prompt groups DAPO's dynamic sampling
discarded because all their rollouts got one verdict (it counts groups, not rollouts, despite its name; absent on a
step that discarded none)."""
RL_GROUPS_KEPT = "groups_kept_share"
"""Metric of an RL run's manifest with group filtering: the share of the prompt groups DAPO kept
(:func:`common.tracking.dapo_groups_kept`)."""


def sft_stat_key(stat: str) -> str:
    """The key of a token-loss metric (``LossResult.metrics``) in an SFT run's :data:`TRAINING_METRICS_FILE`."""
    return f"stats/{stat}"


def set_size_stat(token_set: str) -> str:
    """The token-loss metric counting a token set (T, M_H, M_KL, M, CE) of one micro-batch: ``num_<set>``."""
    return f"num_{token_set}"


STAT_CE = "ce"
"""Mean cross-entropy of the supervised tokens (on the CE set for masking methods)."""
STAT_IOU = "iou"
"""|M_H ∩ M_KL| / |M_H ∪ M_KL| of the EKSFT masks."""
STAT_ENTROPY_ON_M, STAT_ENTROPY_REST = "entropy_mean_M", "entropy_mean_rest"
"""Mean token entropy on the masked set M and on the rest of T."""
STAT_KL_ON_M, STAT_KL_REST = "kl_mean_M", "kl_mean_rest"
"""Mean KL(π_θ‖π_ref) on M and on the rest of T."""
HF_EXPORT = "hf"
"""The HF folder (safetensors + tokenizer + generation config) a training stage hands downstream."""
BENCHMARKS_SUBDIR = "benchmarks"
"""The data run's folder of benchmark files, one :func:`benchmark_file` per benchmark, read by evaluation."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a stage: its folder, its identity (the manifest's config) and the inputs it reads."""

    stage: str
    variant: str
    """What the manifest and messages call the run, e.g. ``toy/eksft-1a2b3c4d``."""
    directory: Path
    config: dict[str, Any]
    """The computation identity; its hash names the folder and is the manifest's config hash."""
    inputs: dict[str, Path] = field(default_factory=dict)
    """Upstream run folders (identified by their manifests) and plain input files."""
    optional_inputs: bool = False
    """The report reads what exists; every other stage needs all of its inputs."""

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)


def run_folder(label: str, identity: dict[str, Any]) -> str:
    """``<label>-<id>``: a readable label plus the identity's hash."""
    check_name("run label", label)
    return f"{label}-{config_hash(identity)[:ID_LENGTH]}"


def experiment_dir(cfg: Config) -> Path:
    return Path(cfg.experiment.run_root) / cfg.experiment.name


def training_dir(cfg: Config) -> Path:
    """The experiment folder holding the data, tokens and SFT runs (``experiment.train_in``, default this one)."""
    return Path(cfg.experiment.run_root) / (cfg.experiment.train_in or cfg.experiment.name)


def with_method(cfg: Config, label: str) -> Config:
    """``cfg`` with the SFT method whose label is ``label`` (the configured one when it already has that label)."""
    if method_label(cfg.sft.method) == label:
        return cfg
    return replace(cfg, sft=replace(cfg.sft, method=parse_method_label(label)))


def model_configs(cfg: Config) -> list[Config]:
    """``cfg`` once per model of ``profile.models`` (the command line's model keeps its overrides)."""
    configs = []
    for name in cfg.profile.models:
        model = cfg.model if name == cfg.model.name else \
            compose([f"profile={cfg.profile.name}", f"model={name}"]).model
        configs.append(replace(cfg, model=model))
    return configs


def method_labels(cfg: Config) -> list[str]:
    """The label of each ``experiment.methods`` entry (the command line's method keeps its overrides)."""
    labels = []
    for name in cfg.experiment.methods:
        method = cfg.sft.method if name == cfg.sft.method.name else compose([f"sft/method={name}"]).sft.method
        labels.append(method_label(method))
    return labels


def variants(cfg: Config) -> list[str]:
    """``base`` then every method label: the rows of Table 1."""
    return [BASE_VARIANT, *method_labels(cfg)]


def rl_variants(cfg: Config) -> list[str]:
    """``base`` then the label of every ``experiment.methods`` entry that ``experiment.rl_methods`` names (every
    one when it is empty): the RL arms, the rows of Table 2."""
    chosen = cfg.experiment.rl_methods or cfg.experiment.methods
    return [BASE_VARIANT, *(label for name, label in zip(cfg.experiment.methods, method_labels(cfg))
                            if name in chosen)]


# ------------------------------------------------------------------------------------------ the runs
def data_run(cfg: Config) -> RunSpec:
    data = {k: v for k, v in computation_config(cfg.data).items() if k not in TOKENISATION_FIELDS}
    config: dict[str, Any] = {"data": data}
    if cfg.data.source == "toy" or cfg.data.benchmark_source == "toy":
        config["toy"] = computation_config(cfg.toy)
    inputs: dict[str, Path] = {}
    if cfg.data.source == "local":
        inputs["training_set"] = Path(cfg.data.path)
    if cfg.data.system_prompt_path:
        inputs["system_prompt"] = Path(cfg.data.system_prompt_path)
    if cfg.data.benchmark_source == "local":
        for name, source in cfg.data.benchmarks.items():
            inputs[f"benchmark_{name}"] = Path(cfg.data.benchmark_dir) / source.file
    folder = run_folder(cfg.data.source, config)
    return RunSpec("data", folder, training_dir(cfg) / "data" / folder, config, inputs)


def base_run(cfg: Config) -> RunSpec | None:
    """The toy base model's run (a cache shared by experiments), or None for a hub / gguf model."""
    if cfg.model.source != "toy":
        return None
    config = cfg.toy.base_model_settings()
    directory = Path(cfg.experiment.run_root) / "cache" / "base" / config_hash(config)
    return RunSpec("base", f"toy/{directory.name}", directory, config)


def base_model_identity(cfg: Config) -> tuple[Any, dict[str, Path]]:
    """What identifies the base model in a downstream identity, and its input: the toy base run folder, or the
    model config with the local folder / GGUF file when there is one (a hub id is identified by the config alone)."""
    base = base_run(cfg)
    if base is not None:
        return base.directory.name, {"base_model": base.directory}
    local = Path(cfg.model.path) / cfg.model.gguf_file if cfg.model.gguf_file else Path(cfg.model.path)
    return computation_config(cfg.model), ({"base_model": local} if local.exists() else {})


def reference_cache_dir(cfg: Config, key: str) -> Path:
    """``<run_root>/cache/reference_hidden/<key>/``: the frozen reference's final hidden states for a tokenised SFT
    split (``sft.reference_cache``); ``key`` hashes their identity (base model and split contents, precision), so
    every method and experiment on the same base model and data shares one."""
    return Path(cfg.experiment.run_root) / "cache" / "reference_hidden" / key


def base_model_path(cfg: Config) -> str:
    """What ``from_pretrained`` gets for the base model: the toy cache's ``hf/`` folder, or the hub id / local
    folder."""
    base = base_run(cfg)
    return str(base.directory / HF_EXPORT) if base is not None else cfg.model.path


def tokens_run(cfg: Config) -> RunSpec:
    data = data_run(cfg)
    base, base_input = base_model_identity(cfg)
    config = {"model": computation_config(cfg.model), "base": base, "data": data.directory.name,
              **{key: getattr(cfg.data, key) for key in TOKENISATION_FIELDS}}
    folder = run_folder(cfg.model.name, config)
    return RunSpec("tokens", f"{cfg.model.name}/{folder}", training_dir(cfg) / "tokens" / folder, config,
                   {"sft_rows": data.directory, **base_input})


def sft_run(cfg: Config, label: str | None = None) -> RunSpec:
    """The SFT run of ``label`` (default: the configured method) on ``cfg.model``."""
    cfg = with_method(cfg, label) if label else cfg
    tokens = tokens_run(cfg)
    base, base_input = base_model_identity(cfg)
    config = {"sft": computation_config(cfg.sft), "model": computation_config(cfg.model), "base": base,
              "tokens": tokens.directory.name, "seed": cfg.seed, "device": cfg.profile.device,
              "world_size": cfg.profile.nproc_per_node * cfg.profile.nnodes}
    folder = run_folder(method_label(cfg.sft.method), config)
    return RunSpec("sft", f"{cfg.model.name}/{folder}", training_dir(cfg) / "sft" / cfg.model.name / folder,
                   config, {"sft_tokens": tokens.directory, **base_input})


def start_model(cfg: Config, variant: str) -> tuple[Any, dict[str, Path]]:
    """The model RL starts from (phase sft) for ``variant``: the base model or the SFT run of that label."""
    if variant == BASE_VARIANT:
        return base_model_identity(cfg)
    sft = sft_run(cfg, variant)
    return sft.directory.name, {"init_model": sft.directory}


def rl_run(cfg: Config, variant: str) -> RunSpec:
    data = data_run(cfg)
    init, init_input = start_model(cfg, variant)
    rl = {k: v for k, v in computation_config(cfg.rl).items() if k != "init"}
    config = {"rl": rl, "model": computation_config(cfg.model), "init": init, "data": data.directory.name,
              "seed": cfg.seed, "profile": {"device": cfg.profile.device, "nproc_per_node": cfg.profile.nproc_per_node,
                                            "nnodes": cfg.profile.nnodes}}
    folder = run_folder(variant, config)
    return RunSpec("rl", f"{cfg.model.name}/{folder}", experiment_dir(cfg) / "rl" / cfg.model.name / folder, config,
                   {"data": data.directory, **init_input})


def evaluated_model(cfg: Config, phase: str, variant: str) -> tuple[Any, dict[str, Path]]:
    """What an evaluation samples from: ``eval.model_path``, the RL run (phase rl), the SFT run or the base model."""
    if cfg.eval.model_path:
        path = Path(cfg.eval.model_path)
        return {"model_path": cfg.eval.model_path}, ({"model": path} if path.exists() else {})
    if phase == "rl":
        rl = rl_run(cfg, variant)
        return rl.directory.name, {"model": rl.directory}
    name, inputs = start_model(cfg, variant)
    return name, {"model": path for path in inputs.values()}


def eval_run(cfg: Config, phase: str, variant: str, benchmark: str) -> RunSpec:
    """One benchmark's evaluation of one model; ``<variant>-<id>`` holds every benchmark of the same protocol."""
    data = data_run(cfg)
    model, model_input = evaluated_model(cfg, phase, variant)
    e = cfg.eval
    protocol = {"n": e.n, "n_per_benchmark": dict(e.n_per_benchmark), "temperature": e.temperature, "top_p": e.top_p,
                "max_tokens": e.max_tokens, "max_problems": e.max_problems, "backend": e.backend,
                "max_model_len": e.max_model_len, "tensor_parallel_size": e.tensor_parallel_size,
                "enforce_eager": e.enforce_eager, "dtype": cfg.model.dtype, "device": cfg.profile.device}
    shared = {"protocol": protocol, "model": model, "data": data.directory.name, "seed": cfg.seed}
    folder = run_folder(variant, shared)
    directory = experiment_dir(cfg) / "eval" / cfg.model.name / phase / folder / benchmark
    return RunSpec(f"eval_{phase}", f"{cfg.model.name}/{phase}/{folder}/{benchmark}", directory,
                   {**shared, "benchmark": benchmark},
                   {"benchmarks": data.directory, **model_input})


def heldout_nll_run(cfg: Config, variant: str) -> RunSpec | None:
    """The held-out NLL of ``variant``'s pre-RL model (phase sft), in :data:`HELDOUT_NLL_DIR` of its evaluation
    folder; None without a held-out slice (``data.num_heldout_rows=0``) and for ``eval.model_path`` (its tokenizer
    need not be the one the slice was tokenised with)."""
    if not cfg.data.num_heldout_rows or cfg.eval.model_path:
        return None
    directory = eval_run(cfg, "sft", variant, HELDOUT_NLL_DIR).directory
    tokens = tokens_run(cfg)
    model, model_input = evaluated_model(cfg, "sft", variant)
    config = {"model": model, "tokens": tokens.directory.name, "backend": cfg.eval.backend, "dtype": cfg.model.dtype,
              "device": cfg.profile.device}
    return RunSpec("eval_sft", f"{cfg.model.name}/sft/{directory.parent.name}/{HELDOUT_NLL_DIR}", directory, config,
                   {"heldout_tokens": tokens.directory, **model_input})


def report_run(cfg: Config) -> RunSpec:
    """The experiment's report. It reads whatever the experiment has evaluated (its sweeps included), so its inputs
    are every run folder of the experiment with a manifest, and the base models' runs."""
    root, training = experiment_dir(cfg), training_dir(cfg)
    folders = [path.parent for top, pattern in ((training, "tokens/*"), (training, "sft/*/*"), (root, "rl/*/*"),
                                                (root, "eval/*/*/*/*"))
               for path in sorted(top.glob(f"{pattern}/{MANIFEST_NAME}"))]
    folders += [base.directory for mcfg in model_configs(cfg) if (base := base_run(mcfg)) is not None]
    config = {"eval": {k: v for k, v in computation_config(cfg.eval).items()
                       if k not in ("phase", "variant", "model_path")},
              "experiment": {"methods": method_labels(cfg), "seeds": cfg.run_seeds(),
                             "stages": list(cfg.experiment.stages)},
              "models": list(cfg.profile.models), "data": data_run(cfg).directory.name}
    inputs = {str(folder.relative_to(cfg.experiment.run_root)): folder for folder in folders}
    return RunSpec("report", "", root / "report", config, inputs, optional_inputs=True)


# ------------------------------------------------------------------------------- folders (shorthands)
def data_dir(cfg: Config) -> Path:
    return data_run(cfg).directory


def toy_base_dir(cfg: Config) -> Path:
    """Cache folder of the toy base model, keyed by the settings it depends on (re-runs and other experiments reuse
    it)."""
    base = base_run(cfg)
    if base is None:
        raise ConfigError(f"model {cfg.model.name} (source {cfg.model.source}) has no toy base model")
    return base.directory


def tokens_dir(cfg: Config) -> Path:
    return tokens_run(cfg).directory


def sft_tokens_path(cfg: Config) -> Path:
    return tokens_dir(cfg) / SFT_TOKENS_FILE


def sft_dir(cfg: Config, label: str | None = None) -> Path:
    return sft_run(cfg, label).directory


def rl_dir(cfg: Config, variant: str) -> Path:
    return rl_run(cfg, variant).directory


def eval_dir(cfg: Config, phase: str, variant: str, benchmark: str) -> Path:
    return eval_run(cfg, phase, variant, benchmark).directory


def report_dir(cfg: Config) -> Path:
    return experiment_dir(cfg) / "report"


def benchmark_file(name: str) -> str:
    """A benchmark's JSONL file, relative to the data run folder (``common.benchmarks`` reads it)."""
    return f"{BENCHMARKS_SUBDIR}/{name}.jsonl"


def hf_export_dir(stage_directory: Path) -> Path:
    """The HF folder (safetensors + tokenizer + generation config) a training stage hands downstream."""
    return stage_directory / HF_EXPORT
