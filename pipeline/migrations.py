"""What the orchestrator does about run folders that older versions of the pipeline wrote: a toy base model
pretrained under bf16 autocast chosen from the CPU is rebuilt, and folders without an identity hash are named (kept,
never reused). Each check is one function the orchestrator calls before it runs the plan."""
from __future__ import annotations

from pathlib import Path

from common.manifest import StageInputError, invalidate, read_manifest
from pipeline.stages import StageCommand


def retire_cpu_chosen_bf16_bases(plan: list[StageCommand], *, dry_run: bool) -> None:
    """Marks for a rebuild every toy base model that an older version pretrained under bf16 autocast because the CPU
    had native bf16: its folder has the identity of a ``toy.pretrain_dtype=float32`` model, which it is not."""
    for command in plan:
        for run in command.runs if command.stage == "base" else ():
            manifest = read_manifest(run.directory)
            if manifest is None or not manifest.metrics.get("bf16_autocast") \
                    or "pretrain_dtype" in manifest.config:
                continue
            print(f"note: {run.directory} was pretrained under bf16 autocast chosen from this CPU by an older "
                  f"version; it {'would be' if dry_run else 'is'} rebuilt in float32 (toy.pretrain_dtype=bfloat16 "
                  "asks for bf16)", flush=True)
            if not dry_run:
                invalidate(run.directory, "bf16 autocast chosen from the CPU by an older version")


def warn_about_old_layout(root: Path) -> None:
    """Names run folders written by an older pipeline version (no identity hash): kept, never reused."""
    old = []
    for path in root.glob("**/manifest.json"):
        try:
            read_manifest(path.parent)
        except StageInputError:
            old.append(str(path.parent))
    if old:
        print(f"note: {len(old)} run folder(s) under {root} were written by an older pipeline version or are corrupt "
              f"and are not reused (e.g. {old[0]}); the runs of this version live in folders named "
              "<label>-<identity hash>. Delete the old ones when you no longer need them.", flush=True)
