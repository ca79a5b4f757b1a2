"""Where each stage reads and writes and what identifies each run, derived from the config alone: the run layout.

    <run_root>/<experiment>/data/<source>-<id>/                            sft.parquet, rl.parquet, benchmarks/
    <run_root>/<experiment>/tokens/<model>-<id>/                           sft_tokens.parquet
    <run_root>/cache/base/<toy-config-hash>/                               toy base model (shared across experiments)
    <run_root>/cache/reference_hidden/<key>/                               frozen reference's hidden states
    <run_root>/<experiment>/sft/<model>/<method-label>-<id>/               checkpoints/, hf/, metrics.jsonl
    <run_root>/<experiment>/rl/<model>/<variant>-<id>/                     verl checkpoints, hf/, metrics.jsonl
    <run_root>/<experiment>/eval/<model>/<phase>/<variant>-<id>/<benchmark>/   samples.jsonl, metrics.json
    <run_root>/<experiment>/report[+<algorithm>]/                          tables, plots, report.md

``+<algorithm>``: an ``rl/algorithm`` other than DAPO (:func:`report_dir`).

Every folder holds a ``manifest.json``. ``<id>`` is the first 8 hex digits of the hash of the run's *identity*: its
computation config (:func:`common.config.common.computation_config`: seeds, optimiser, budgets, method fields,
model, sampling protocol; never timeouts, checkpoint cadence or logging) plus the folder names of the runs it reads,
so two computations never share a folder and a changed setting upstream gives new folders downstream. The same
identity is the manifest's ``config``; :func:`common.manifest.run_state` compares it, and the upstream manifests'
run ids and output fingerprints, before any skip.

``variant`` is ``base`` (the untrained base model) or an SFT method label; ``phase`` is ``sft`` (Table 1) or
``rl`` (Table 2). A label is a readable name only: what a stage reads is the upstream run folder the plan hands it
(``rl.init_run``, ``eval.model_run``; an :class:`common.grid.Arm` holds them, common/grid.py), and a method's config is read from that run's
manifest (:func:`trained_method`), never parsed back from a label.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from common.config import Config, ConfigError
from common.config.common import check_name, computation_config
from common.config.sft import SFT_METHOD_SCHEMAS, SFTMethod
from common.manifest import Manifest, config_hash, is_current, read_manifest
from common.numerics import numerics_identity

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


ID_LENGTH = 8
"""Hex digits of the identity hash in a run folder's name."""
TOKENISATION_FIELDS = ("max_length", "strip_leading_think")
"""data fields read only by tokenisation: part of the tokens' identity, not the data stage's."""
EXTRA_BENCHMARKS = "extra_benchmarks"
"""The data field of the benchmarks each written by its own run (:func:`extra_benchmark_run`), not the data run's."""
IGNORE_INDEX = -100
"""The ``labels`` value of a token without a training target (prompt, padding) in the tokens hand-off: HF's ignore
index."""
SFT_ROWS_FILE = "sft.parquet"
"""The data run's SFT split (LUFFY rows + ``row_id``, or tool-use rows), read by tokenisation."""
RL_TRAIN_FILE = "rl.parquet"
"""The data run's RL split as verl RLHF rows (verl's ``data.train_files``)."""
RL_VAL_FILE = "rl_val.parquet"
"""The RL rows held out for verl's validation (``data.val_files``), disjoint from :data:`RL_TRAIN_FILE`."""
BEHAVIOUR_LOGPROBS_COLUMN = "behaviour_logprobs"
"""The optional SFT row column (docs/data.md): the target as segments ``[{"text", "logprob"}, …]`` whose texts
concatenate to it, each with its log-probability under the policy that generated the row (the teacher's tokens and
log-probs; the forking world writes its teacher's exact ones). PEAR (``sft/method=pear``) reads it."""
BEHAVIOUR_LOGP_COLUMN = "behaviour_logp"
"""The tokens' column made from :data:`BEHAVIOUR_LOGPROBS_COLUMN`: per token, the log-probabilities of the segments
that start in it (NaN on the prompt)."""
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
"""An evaluation's samples, one JSON line per sample (``problem_id``, ``sample_index``, ``seed``, text, verdict), in
each benchmark's run folder; appended problem by problem (``eval.stage.sample_problems``)."""
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
LORA_ADAPTER = "adapter"
"""A LoRA SFT run's trained adapter alone (PEFT's ``adapter_config.json`` + ``adapter_model.safetensors``)."""
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

    def is_current(self) -> bool:
        """Complete with this identity, its inputs unchanged and its outputs intact
        (:func:`common.manifest.is_current`)."""
        return is_current(self.directory, self.config_hash, self.inputs, optional_inputs=self.optional_inputs)


def kernels_identity(cfg: Config) -> dict[str, Any]:
    """The CPU kernels' part of a computing run's identity (empty for the pinned default; common/numerics.py)."""
    return numerics_identity(cfg.profile.device, cfg.profile.cpu_isa)


def run_folder(label: str, identity: dict[str, Any]) -> str:
    """``<label>-<id>``: a readable label plus the identity's hash."""
    check_name("run label", label)
    return f"{label}-{config_hash(identity)[:ID_LENGTH]}"


def experiment_dir(cfg: Config) -> Path:
    return Path(cfg.experiment.run_root) / cfg.experiment.name


def training_dir(cfg: Config) -> Path:
    """The experiment folder holding the data, tokens and SFT runs (``experiment.train_in``, default this one)."""
    return Path(cfg.experiment.run_root) / (cfg.experiment.train_in or cfg.experiment.name)


# ------------------------------------------------------------------------------------------ the runs
def data_run(cfg: Config) -> RunSpec:
    data = {k: v for k, v in computation_config(cfg.data).items()
            if k not in TOKENISATION_FIELDS and k != EXTRA_BENCHMARKS}
    config: dict[str, Any] = {"data": data}
    if cfg.data.source == "toy" or cfg.data.benchmark_source == "toy":
        config["toy"] = cfg.toy.data_settings()
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
    config = {**cfg.toy.base_model_settings(), **kernels_identity(cfg)}
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


def extra_benchmark_run(cfg: Config, name: str) -> RunSpec:
    """The run that writes the extra benchmark ``name`` (``data.extra_benchmarks``), in
    ``<training experiment>/benchmarks/<name>-<id>/``: its file at :func:`benchmark_file`, prompted with the system turn
    of the data run's own benchmarks. Its identity is the benchmark's source and the data run's folder; the data
    run's identity does not include it."""
    data = data_run(cfg)
    source = cfg.data.extra_benchmarks.get(name)
    if source is None:
        raise ConfigError(f"{name!r} is not in data.extra_benchmarks ({list(cfg.data.extra_benchmarks)})")
    config = {"benchmark": name, "source": computation_config(source),
              "benchmark_source": cfg.data.benchmark_source, "data": data.directory.name}
    inputs = {"data": data.directory}
    if source.path:
        inputs["benchmark_file"] = Path(source.path)
    elif cfg.data.benchmark_source == "local":
        inputs["benchmark_file"] = Path(cfg.data.benchmark_dir) / source.file
    folder = run_folder(name, config)
    return RunSpec("data", f"benchmarks/{folder}", training_dir(cfg) / "benchmarks" / folder, config, inputs)


def report_benchmarks(cfg: Config) -> list[str]:
    """The benchmarks evaluations sample and the tables show: ``eval.benchmarks``, else every one in
    ``data.benchmarks`` (the extra benchmarks only when ``eval.benchmarks`` names them)."""
    return list(cfg.eval.benchmarks) or list(cfg.data.benchmarks)


def selected_extra_benchmarks(cfg: Config) -> list[str]:
    """The entries of :func:`report_benchmarks` from ``data.extra_benchmarks``: the ones the data stage writes, each
    in its :func:`extra_benchmark_run`."""
    return [name for name in report_benchmarks(cfg) if name in cfg.data.extra_benchmarks]


def benchmark_path(cfg: Config, name: str) -> Path:
    """The benchmark file evaluation reads: in the data run for ``data.benchmarks``, in its own run for an extra
    benchmark."""
    folder = extra_benchmark_run(cfg, name).directory if name in cfg.data.extra_benchmarks else data_dir(cfg)
    return folder / benchmark_file(name)


def tokens_run(cfg: Config) -> RunSpec:
    data = data_run(cfg)
    base, base_input = base_model_identity(cfg)
    config = {"model": computation_config(cfg.model), "base": base, "data": data.directory.name,
              **{key: getattr(cfg.data, key) for key in TOKENISATION_FIELDS}}
    folder = run_folder(cfg.model.name, config)
    return RunSpec("tokens", f"{cfg.model.name}/{folder}", training_dir(cfg) / "tokens" / folder, config,
                   {"sft_rows": data.directory, **base_input})


def sft_run(cfg: Config) -> RunSpec:
    """The SFT run of the configured method (``sft.method``) on ``cfg.model``."""
    tokens = tokens_run(cfg)
    base, base_input = base_model_identity(cfg)
    config = {"sft": computation_config(cfg.sft), "model": computation_config(cfg.model), "base": base,
              "tokens": tokens.directory.name, "seed": cfg.seed, "device": cfg.profile.device,
              "world_size": cfg.profile.nproc_per_node * cfg.profile.nnodes, **kernels_identity(cfg)}
    folder = run_folder(method_label(cfg.sft.method), config)
    return RunSpec("sft", f"{cfg.model.name}/{folder}", training_dir(cfg) / "sft" / cfg.model.name / folder,
                   config, {"sft_tokens": tokens.directory, **base_input})


def start_model(cfg: Config, init: Path | None) -> tuple[Any, dict[str, Path]]:
    """The model RL starts from: the SFT run folder ``init``, or the base model when None."""
    if init is None:
        return base_model_identity(cfg)
    return init.name, {"init_model": init}


def rl_run(cfg: Config, variant: str, init: Path | None) -> RunSpec:
    """The RL run named ``variant`` that starts from the SFT run folder ``init`` (None: the base model)."""
    data = data_run(cfg)
    init, init_input = start_model(cfg, init)
    rl = {k: v for k, v in computation_config(cfg.rl).items() if k not in ("init", "init_run")}
    config = {"rl": rl, "model": computation_config(cfg.model), "init": init, "data": data.directory.name,
              "seed": cfg.seed, "profile": {"device": cfg.profile.device, "nproc_per_node": cfg.profile.nproc_per_node,
                                            "nnodes": cfg.profile.nnodes}, **kernels_identity(cfg)}
    folder = run_folder(variant, config)
    return RunSpec("rl", f"{cfg.model.name}/{folder}", experiment_dir(cfg) / "rl" / cfg.model.name / folder, config,
                   {"data": data.directory, **init_input})


def evaluated_model(cfg: Config, phase: str, model: Path | None) -> tuple[Any, dict[str, Path]]:
    """What an evaluation samples from: ``eval.model_path``, the run folder ``model`` (an SFT or RL run), or the
    base model (phase sft, ``model`` None)."""
    if cfg.eval.model_path:
        path = Path(cfg.eval.model_path)
        return {"model_path": cfg.eval.model_path}, ({"model": path} if path.exists() else {})
    if model is not None:
        return model.name, {"model": model}
    if phase == "rl":
        raise ConfigError("an evaluation of phase rl needs the RL run folder it evaluates (eval.model_run)")
    name, inputs = base_model_identity(cfg)
    return name, {"model": path for path in inputs.values()}


def sampling_protocol(cfg: Config) -> dict[str, Any]:
    """The evaluation's sampling protocol, recorded with its metrics (:func:`benchmark_protocol` is one benchmark's,
    the part of its identity)."""
    e = cfg.eval
    return {"n": e.n, "n_per_benchmark": dict(e.n_per_benchmark), "temperature": e.temperature, "top_p": e.top_p,
            "max_tokens": e.max_tokens, "max_problems": e.max_problems, "backend": e.backend,
            "max_model_len": e.max_model_len, "tensor_parallel_size": e.tensor_parallel_size,
            "enforce_eager": e.enforce_eager, "dtype": cfg.model.dtype, "device": cfg.profile.device}


def benchmark_protocol(cfg: Config, benchmark: str) -> dict[str, Any]:
    """:func:`sampling_protocol` as one benchmark draws it: ``n`` is its own sample count
    (``eval.samples_for``) and ``n_per_benchmark`` stays empty, so a benchmark's identity never depends on how many
    samples another draws (``eval=passk320`` moves AIME25 alone to a folder of its own), and evaluations from before
    ``n_per_benchmark`` was resolved per benchmark (it was always empty then) keep theirs."""
    return {**sampling_protocol(cfg), "n": cfg.eval.samples_for(benchmark), "n_per_benchmark": {}}


def evaluations_dir(cfg: Config, phase: str) -> Path:
    """The experiment folder of phase ``phase``'s evaluations: phase sft's beside the SFT runs they evaluate
    (:func:`training_dir`, so an experiment that trains in another, as ``experiment.train_in``, reuses its
    evaluations too), phase rl's beside the experiment's own RL runs."""
    return training_dir(cfg) if phase == "sft" else experiment_dir(cfg)


def eval_run(cfg: Config, phase: str, variant: str, benchmark: str, model: Path | None) -> RunSpec:
    """One benchmark's evaluation of the run folder ``model`` (None: the base model, phase sft), named ``variant``;
    ``<variant>-<id>`` holds every benchmark of the same protocol (:func:`benchmark_protocol`). An extra benchmark
    (``data.extra_benchmarks``) adds its own run (:func:`extra_benchmark_run`) to the identity and inputs."""
    data = data_run(cfg)
    model, model_input = evaluated_model(cfg, phase, model)
    shared = {"protocol": benchmark_protocol(cfg, benchmark), "model": model, "data": data.directory.name,
              "seed": cfg.seed, **kernels_identity(cfg)}
    folder = run_folder(variant, shared)
    directory = evaluations_dir(cfg, phase) / "eval" / cfg.model.name / phase / folder / benchmark
    config, inputs = {**shared, "benchmark": benchmark}, {"benchmarks": data.directory, **model_input}
    if benchmark in cfg.data.extra_benchmarks:
        extra = extra_benchmark_run(cfg, benchmark).directory
        config["benchmark_run"], inputs["benchmark"] = extra.name, extra
    return RunSpec(f"eval_{phase}", f"{cfg.model.name}/{phase}/{folder}/{benchmark}", directory, config, inputs)


def heldout_nll_run(cfg: Config, variant: str, model: Path | None) -> RunSpec | None:
    """The held-out NLL of ``variant``'s pre-RL model (the SFT run folder ``model``, or the base model when None), in
    :data:`HELDOUT_NLL_DIR` of its evaluation folder; None without a held-out slice (``data.num_heldout_rows=0``) and
    for ``eval.model_path`` (its tokenizer need not be the one the slice was tokenised with)."""
    if not cfg.data.num_heldout_rows or cfg.eval.model_path:
        return None
    directory = eval_run(cfg, "sft", variant, HELDOUT_NLL_DIR, model).directory
    tokens = tokens_run(cfg)
    model, model_input = evaluated_model(cfg, "sft", model)
    config = {"model": model, "tokens": tokens.directory.name, "backend": cfg.eval.backend, "dtype": cfg.model.dtype,
              "device": cfg.profile.device, **kernels_identity(cfg)}
    return RunSpec("eval_sft", f"{cfg.model.name}/sft/{directory.parent.name}/{HELDOUT_NLL_DIR}", directory, config,
                   {"heldout_tokens": tokens.directory, **model_input})


# ------------------------------------------------------------------------- upstream runs, handed down
def configured_sft_folder(cfg: Config, variant: str, key: str) -> Path | None:
    """The SFT run folder a stage reads for ``variant`` when the plan handed it none (``key`` is empty): None for
    ``base``, the configured method's run (``sft.method``) when ``variant`` is its label, else an error naming
    ``key`` (a label is a name, not a config to rebuild)."""
    if variant == BASE_VARIANT:
        return None
    if variant == method_label(cfg.sft.method):
        return sft_run(cfg).directory
    raise ConfigError(f"{key} is empty and {variant!r} is not the label of the configured SFT method "
                      f"({method_label(cfg.sft.method)}): set {key}=<the SFT run folder> (the orchestrator's plan "
                      f"passes it), or sft/method=<name> with its settings")


def rl_start(cfg: Config) -> tuple[str, Path | None]:
    """The variant RL starts from (``rl.init``; empty: the configured method's label) and its SFT run folder
    (``rl.init_run``, which the plan hands down; empty: the configured method's run; None: the base model)."""
    variant = cfg.rl.init or method_label(cfg.sft.method)
    if cfg.rl.init_run:
        return variant, Path(cfg.rl.init_run)
    return variant, configured_sft_folder(cfg, variant, "rl.init_run")


def configured_rl_run(cfg: Config) -> RunSpec:
    """The RL run of ``rl.init`` / ``rl.init_run`` (:func:`rl_start`)."""
    return rl_run(cfg, *rl_start(cfg))


def evaluated_run(cfg: Config) -> Path | None:
    """The run folder an evaluation samples from: ``eval.model_run``, which the plan hands down; without it, the
    configured method's SFT run (phase sft; None for ``base``) or the RL run from it (phase rl); None with
    ``eval.model_path``."""
    if cfg.eval.model_path:
        return None
    if cfg.eval.model_run:
        return Path(cfg.eval.model_run)
    sft = configured_sft_folder(cfg, cfg.eval.variant, "eval.model_run")
    return sft if cfg.eval.phase == "sft" else rl_run(cfg, cfg.eval.variant, sft).directory


def configured_eval_run(cfg: Config, benchmark: str) -> RunSpec:
    """The evaluation of ``benchmark`` that ``eval.phase``, ``eval.variant`` and :func:`evaluated_run` name."""
    return eval_run(cfg, cfg.eval.phase, cfg.eval.variant, benchmark, evaluated_run(cfg))


def method_record(manifest: Manifest) -> dict[str, Any] | None:
    """The SFT method behind a run, as its manifest holds it: an SFT run's identity (``config.sft.method``), an RL or
    evaluation run's copy of its upstream's (``details.sft_method``); None for the base model and unknown models."""
    if manifest.stage == "sft":
        return manifest.config["sft"]["method"]
    return manifest.details.get("sft_method")


def trained_method(run_dir: Path | None) -> SFTMethod | None:
    """The SFT method of the run in ``run_dir`` (:func:`method_record` of its manifest) as its config; None for the
    base model (``run_dir`` None) or a run that records none."""
    manifest = read_manifest(run_dir) if run_dir is not None else None
    record = method_record(manifest) if manifest is not None else None
    return SFT_METHOD_SCHEMAS[record["name"]](**record) if record else None


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


def sft_dir(cfg: Config) -> Path:
    return sft_run(cfg).directory


def rl_dir(cfg: Config) -> Path:
    return configured_rl_run(cfg).directory


def eval_dir(cfg: Config, benchmark: str) -> Path:
    return configured_eval_run(cfg, benchmark).directory


def report_dir(cfg: Config) -> Path:
    """``report``, or ``report+<algorithm>`` for an RL algorithm other than DAPO (``RLConfig.algorithm_suffix``)."""
    return experiment_dir(cfg) / f"report{cfg.rl.algorithm_suffix}"


def benchmark_file(name: str) -> str:
    """A benchmark's JSONL file, relative to the data run folder (``common.benchmarks`` reads it)."""
    return f"{BENCHMARKS_SUBDIR}/{name}.jsonl"


def hf_export_dir(stage_directory: Path) -> Path:
    """The HF folder (safetensors + tokenizer + generation config) a training stage hands downstream."""
    return stage_directory / HF_EXPORT


def lora_adapter_dir(stage_directory: Path) -> Path:
    """A LoRA SFT run's adapter folder (:data:`LORA_ADAPTER`), beside its merged :func:`hf_export_dir`."""
    return stage_directory / LORA_ADAPTER
