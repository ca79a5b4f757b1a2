"""Upstream runs are handed down: the plan gives evaluation and RL the run folder they read (``eval.model_run``,
``rl.init_run``), and they read the SFT method from that run's manifest. A label only names a folder: spelling it
differently changes no identity and nothing that is evaluated or trained from."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from common.config import ConfigError, compose
from common.config.sft import EKSFTMethod
from common.manifest import Manifest, write_manifest
from common.paths import configured_eval_run, configured_rl_run, rl_start, sft_run, trained_method
from common.grid import with_method
from eval.stage import resolve_model
from pipeline.stages import build_plan
from rl.verl_args import init_model_path

POINT = EKSFTMethod(rho=0.1)


@pytest.fixture
def sft_folder(tmp_path):
    """A complete SFT run of EKSFT with rho 0.1 (the configured method is the default, rho 0.2)."""
    spec = sft_run(with_method(compose([f"experiment.run_root={tmp_path}"]), POINT))
    spec.directory.mkdir(parents=True)
    write_manifest(spec.directory, Manifest(stage="sft", variant=spec.variant, status="complete", config=spec.config))
    return spec.directory


@pytest.mark.parametrize("spelling", ["eksft_rho0.1", "renamed_point"])
def test_evaluation_reads_the_method_from_the_run_it_is_handed(tmp_path, sft_folder, spelling):
    cfg = compose([f"experiment.run_root={tmp_path}", "eval.phase=sft", f"eval.variant={spelling}",
                   f"eval.model_run={sft_folder}"])
    path, details = resolve_model(cfg)
    assert path == str(sft_folder / "hf") and details["model"]["upstream_run"] == str(sft_folder)
    assert details["sft_method"] == asdict(POINT)  # from the SFT manifest, not from the label or sft.method
    reference = compose([f"experiment.run_root={tmp_path}", "eval.phase=sft", "eval.variant=eksft_rho0.1",
                         f"eval.model_run={sft_folder}"])
    assert configured_eval_run(cfg, "toy_add").config == configured_eval_run(reference, "toy_add").config
    assert configured_eval_run(cfg, "toy_add").directory.parent.name.startswith(f"{spelling}-")


@pytest.mark.parametrize("spelling", ["eksft_rho0.1", "renamed_point"])
def test_rl_starts_from_the_run_it_is_handed(tmp_path, sft_folder, spelling):
    cfg = compose([f"experiment.run_root={tmp_path}", f"rl.init={spelling}", f"rl.init_run={sft_folder}"])
    assert rl_start(cfg) == (spelling, sft_folder) and init_model_path(cfg) == sft_folder / "hf"
    assert trained_method(rl_start(cfg)[1]) == POINT
    reference = compose([f"experiment.run_root={tmp_path}", "rl.init=eksft_rho0.1", f"rl.init_run={sft_folder}"])
    assert configured_rl_run(cfg).config == configured_rl_run(reference).config


def test_without_a_handed_down_run_a_label_is_never_parsed_back(tmp_path):
    # The configured method's own label finds its run; any other label is refused with the key to set, where the old
    # code parsed "eksft_rho0.1" back into a method config.
    configured = compose([f"experiment.run_root={tmp_path}", "eval.variant=eksft"])
    assert configured_eval_run(configured, "toy_add").inputs["model"] == sft_run(configured).directory
    with pytest.raises(ConfigError, match=r"eval.model_run is empty and 'eksft_rho0.1' is not the label"):
        configured_eval_run(compose([f"experiment.run_root={tmp_path}", "eval.variant=eksft_rho0.1"]), "toy_add")
    with pytest.raises(ConfigError, match=r"rl.init_run is empty"):
        rl_start(compose(["rl.init=eksft_rho0.1"]))


def test_the_plan_hands_each_stage_the_run_it_reads():
    overrides = ["experiment=demo", "profile=toy", "experiment.methods=[sft,eksft]", "experiment.rl_methods=[eksft]",
                 "experiment.rl_from_base=true"]
    cfg = compose(overrides)
    plan = {command.name: command for command in build_plan(cfg, overrides)}
    sft = plan["sft/toy/eksft"].runs[0].directory
    rl = plan["rl/toy/eksft"].runs[0].directory
    assert f"rl.init_run={sft}" in plan["rl/toy/eksft"].argv
    assert f"eval.model_run={sft}" in plan["eval/toy/sft/eksft"].argv
    assert f"eval.model_run={rl}" in plan["eval/toy/rl/eksft"].argv
    assert not any(arg.startswith(("eval.model_run=", "rl.init_run=")) for name in ("eval/toy/sft/base", "rl/toy/base")
                   for arg in plan[name].argv)  # the base model is the config's own
    # each command's config is the one its command line composes
    assert plan["eval/toy/rl/eksft"].config.eval.model_run == str(rl)
    assert plan["rl/toy/eksft"].config.rl.init_run == str(sft)
