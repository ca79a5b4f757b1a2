"""Metrics and progress: a JSONL file that is always written (the source of truth), optional wandb, tqdm bars."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, MutableMapping

from tqdm.auto import tqdm

from common.paths import RL_DISCARDED_GROUPS


def _plain(value: Any) -> Any:
    """JSON-friendly scalar: tensors and numpy numbers become Python floats/ints; NaN/inf become strings."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def start_wandb(mode: str, *, project: str, name: str, group: str, config: Mapping[str, Any] | None,
                directory: str | Path) -> Any:
    """A wandb run (``wandb.init``) writing under ``directory/wandb``, or None when ``mode`` is disabled (wandb is
    then never imported). ``group`` is the experiment name, so every stage of one experiment shares a group."""
    if mode == "disabled":
        return None
    import wandb

    Path(directory).mkdir(parents=True, exist_ok=True)
    return wandb.init(project=project, name=name or None, group=group or None, mode=mode, config=dict(config or {}),
                      dir=str(directory), reinit="finish_previous")


class MetricsLogger:
    """Appends one JSON object per ``log`` call to ``path``; mirrors it to wandb when ``wandb_mode`` is not disabled.

    Only the process with ``enabled=True`` writes (rank 0 under torchrun). Lines are flushed as they are
    written, so a crash loses nothing that was logged. ``group`` (the experiment name) puts every stage of one
    experiment in one wandb group; RL's verl process gets the same through ``WANDB_RUN_GROUP``.
    """

    def __init__(self, path: str | Path, *, enabled: bool = True, wandb_mode: str = "disabled",
                 wandb_project: str = "eksft", run_name: str = "", config: Mapping[str, Any] | None = None,
                 wandb_dir: str | Path | None = None, group: str = ""):
        self.path = Path(path)
        self.enabled = enabled
        self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._wandb = start_wandb(wandb_mode, project=wandb_project, name=run_name, group=group, config=config,
                                  directory=wandb_dir or self.path.parent)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3)}
        record.update({key: _plain(value) for key, value in metrics.items()})
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dapo_groups_kept(records: Mapping[int, Mapping[str, Any]], groups_per_step: int) -> float | None:
    """Share of the prompt groups DAPO's dynamic sampling judged that it kept, over an RL run's steps (step → verl
    record; step 0 is validation): S·B / (S·B + Σ discarded) for S steps of B groups (``rl.train_batch_size``), the
    discarded ones counted by :data:`common.paths.RL_DISCARDED_GROUPS`. Low when the policy's rollouts of a prompt
    mostly agree, so few groups carry a group-relative advantage. None for no steps."""
    steps = [record for step, record in records.items() if step > 0]
    if not steps:
        return None
    kept = groups_per_step * len(steps)
    return kept / (kept + sum(float(record.get(RL_DISCARDED_GROUPS, 0)) for record in steps))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSONL metrics file (a missing file reads as no records)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
             enabled: bool = True, initial: int = 0, unit: str = "it") -> tqdm:
    """A tqdm bar with rate and ETA; silent when ``enabled`` is False (non-zero ranks, ``logging.progress=false``)."""
    return tqdm(iterable, total=total, desc=desc, disable=not enabled, initial=initial, unit=unit,
                dynamic_ncols=True, mininterval=1.0)


CPU_OPENMP_ENV = {"GOMP_SPINCOUNT": "10000"}
"""Bounded OpenMP spinning for every CPU process: on a loaded 2-core box the default spin made steps 10-60x slower.
libgomp reads it when torch first loads, so it belongs in a child's environment or before ``import torch`` (the
Makefile and ``.ci/run`` export the same value for what they start)."""


def bound_openmp_spin(env: MutableMapping[str, str] = os.environ) -> MutableMapping[str, str]:
    """``env`` (this process's environment by default) with :data:`CPU_OPENMP_ENV` wherever it is unset."""
    for key, value in CPU_OPENMP_ENV.items():
        env.setdefault(key, value)
    return env


def configure_cpu_threads(num_threads: int) -> None:
    """Bounded OpenMP spinning (:func:`bound_openmp_spin`) and a fixed thread count."""
    bound_openmp_spin()
    import torch

    torch.set_num_threads(num_threads)
