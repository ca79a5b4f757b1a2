"""Removes an experiment's folder (``make clean-demo``: ``python -m pipeline.clean runs/demo``) unless a live process
uses it.

It holds the folder's lock, the one the experiment's orchestrator holds while it runs (so an orchestrator running
there refuses the removal, and none can start during it), and refuses when a live stage process under the run root
(the folder's parent) writes a run inside the folder or reads an input from it
(:func:`pipeline.stages.live_uses`). The error names the process and how to go on.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from common.errors import UserError, user_errors_in_one_line
from common.locks import DirectoryLock
from pipeline.stages import live_uses


def remove_experiment(folder: str | Path) -> bool:
    """Removes ``folder`` and returns True; False when there is nothing to remove. Raises :class:`UserError` (the
    lock's :class:`common.locks.LockHeld` included) while a live process uses it."""
    folder = Path(folder)
    if not folder.exists():
        return False
    with DirectoryLock(folder, "removing the experiment folder (python -m pipeline.clean)"):
        if in_use := live_uses(folder.absolute().parent, [folder]):
            raise UserError(f"{folder} is in use: {'; '.join(in_use)}. Removing it now loses that work; wait for "
                            "those processes to end (or stop them), then run this again")
        shutil.rmtree(folder)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the experiment folder, e.g. runs/demo")
    with user_errors_in_one_line():
        folder = parser.parse_args().folder
        print(f"removed {folder}" if remove_experiment(folder) else f"{folder} does not exist: nothing to remove")


if __name__ == "__main__":
    main()
