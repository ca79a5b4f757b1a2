"""What the wandb tests share: reading an offline run's transaction log once wandb has written it."""
from __future__ import annotations

from pathlib import Path


def offline_record(run_dir: Path) -> bytes:
    """The bytes of ``run_dir``'s ``run-*.wandb`` after ``wandb.teardown()``.

    ``run.finish()`` returns before wandb's service has flushed the transaction log: on a loaded machine 4 of 15
    offline runs read right after ``finish()`` held only the 7-byte header. A stage's process flushes it on exit
    (wandb's atexit teardown); a test that runs the stage in its own process tears wandb down the same way.
    """
    import wandb

    wandb.teardown()
    return next(run_dir.glob("run-*.wandb")).read_bytes()
