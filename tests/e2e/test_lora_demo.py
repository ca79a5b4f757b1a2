"""The demo (the forking world) with ``sft.lora.enabled=true``: EKSFT-LoRA, its evaluation, and DAPO from the
adapter (``rl.init_lora=adapter``: verl's ``lora_rank``, ``lora_alpha``, ``target_modules``, ``lora_adapter_path``)
or from the merged export, through every stage with the tiny budgets of ``test_demo_pipeline.py`` (about 15 minutes
each on 2 cores; ``make test-e2e``)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from common.config import compose
from common.manifest import read_manifest
from common.paths import LORA_ADAPTER, hf_export_dir
from pipeline.stages import build_plan
from test_demo_pipeline import TINY


@pytest.mark.e2e
@pytest.mark.parametrize("init_lora", ["adapter", "merged"])
def test_the_demo_runs_end_to_end_with_lora(tmp_path, init_lora):
    overrides = [*TINY, "experiment.methods=[eksft]", "sft.lora.enabled=true", "sft.lora.rank=8",
                 f"rl.init_lora={init_lora}", f"experiment.run_root={tmp_path}"]
    subprocess.run([sys.executable, "-m", "pipeline.run", *overrides], check=True, timeout=3600)
    plan = build_plan(compose(overrides), overrides)
    assert {"sft", "eval_sft", "rl", "eval_rl"} <= {command.stage for command in plan}
    for command in plan:
        for directory in command.manifest_dirs:
            manifest = read_manifest(directory)
            assert manifest is not None and manifest.complete, f"{command.name}: {directory}"
            if command.stage == "sft":
                assert manifest.config["sft"]["lora"]["enabled"] and LORA_ADAPTER in manifest.outputs
            if command.stage == "rl":  # verl's merger leaves a LoRA actor's adapter beside the unmerged base
                assert not (hf_export_dir(directory) / "lora_adapter").exists(), "RL export holds the base unmerged"
                assert (LORA_ADAPTER in manifest.outputs) == (init_lora == "adapter")
