"""``rl/algorithm=<name>``: every preset composes, maps to verl's keys in rl/verl_args.py, names its runs and is
validated naming the key (verl's own validation of each preset: tests/integration/test_rl_algorithms_verl.py; the
default DAPO argv byte for byte: test_rl_dapo_golden.py)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from common.config import CONF_DIR, ConfigError, RLConfig, compose
from common.config.catalogue import options
from common.config.common import computation_config
from common.config.rl import ALGORITHM_TITLES
from common.grid import report_run
from common.paths import configured_rl_run, report_dir
from rl.verl_args import build_overrides

REPO = Path(__file__).resolve().parents[2]
ACTOR = "actor_rollout_ref.actor."
ALGORITHM_FIELDS = [f.name for f in fields(RLConfig) if f.metadata.get("identity_when_set")]
"""The fields rl/algorithm added to the schema (absent from the identity of the default DAPO run)."""


def _keys(overrides: list[str]) -> dict[str, str]:
    return dict(override.split("=", 1) for override in build_overrides(compose(overrides)))


def test_the_presets_are_the_titled_algorithms_of_the_issue():
    assert options("rl/algorithm") == sorted(ALGORITHM_TITLES) == sorted(
        ["dapo", "grpo", "dr_grpo", "gspo", "cispo", "sapo", "gmpo", "rloo", "reinforce_pp", "clip_cov", "kl_cov",
         "entropy_bonus"])


@pytest.mark.parametrize("name", sorted(ALGORITHM_TITLES))
def test_every_preset_composes_under_its_name(name):
    assert compose([f"rl/algorithm={name}"]).rl.algorithm == name  # the paper profile: the integration test


def test_every_value_of_a_preset_has_its_source_beside_it():
    for path in sorted((CONF_DIR / "rl" / "algorithm").glob("*.yaml")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line and not line.startswith(("#", "algorithm:", "defaults:", "  - ")):
                assert "  # " in line, f"{path.name}: {line!r} has no source comment"


def test_dapo_is_the_default_and_its_run_identity_is_unchanged():
    default, dapo = compose([]), compose(["rl/algorithm=dapo"])
    assert default.rl == dapo.rl and default.rl.algorithm == "dapo"
    identity = computation_config(default.rl)
    assert not set(ALGORITHM_FIELDS) & set(identity)  # identity_when_set: run folders of existing DAPO runs stay
    assert {"clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode", "filter_groups"} <= set(identity)


def test_another_algorithm_is_in_the_run_identity_and_the_run_name():
    dapo, gspo = compose([]), compose(["rl/algorithm=gspo"])
    identity = computation_config(gspo.rl)
    assert identity["algorithm"] == "gspo" and identity["policy_loss_mode"] == "gspo"
    assert configured_rl_run(gspo).directory != configured_rl_run(dapo).directory
    assert configured_rl_run(gspo).config["rl"]["algorithm"] == "gspo"  # the manifest's config is the identity
    assert _keys(["rl/algorithm=gspo"])["trainer.experiment_name"].endswith("-eksft+gspo")
    assert _keys([])["trainer.experiment_name"].endswith("-eksft")
    # a sweep over rl/algorithm keeps one report per point
    assert (report_dir(dapo).name, report_dir(gspo).name) == ("report", "report+gspo")
    assert report_run(gspo).directory == report_dir(gspo)


def test_gspo_sets_the_sequence_level_loss_and_its_tight_clip():
    keys = _keys(["rl/algorithm=gspo"])
    assert keys[f"{ACTOR}policy_loss.loss_mode"] == "gspo"
    assert (keys[f"{ACTOR}clip_ratio_low"], keys[f"{ACTOR}clip_ratio_high"]) == ("0.0003", "0.0004")
    assert keys[f"{ACTOR}loss_agg_mode"] == "seq-mean-token-mean"
    assert keys["algorithm.filter_groups.enable"] == "false"
    assert not any(key.startswith("trainer.v1.sampler") for key in keys)  # no dynamic sampling, no bounded sampler


@pytest.mark.parametrize("profile, budget", [("toy", "256"), ("paper", "8192")])
def test_dr_grpo_divides_by_the_response_budget_without_the_std(profile, budget):
    keys = _keys([f"profile={profile}", "rl/algorithm=dr_grpo"])
    assert keys["algorithm.norm_adv_by_std_in_grpo"] == "false"
    assert keys[f"{ACTOR}loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert keys[f"{ACTOR}loss_scale_factor"] == budget == keys["data.max_response_length"]


def test_each_loss_mode_gets_only_its_own_settings():
    sapo = _keys(["rl/algorithm=sapo"])
    assert (sapo[f"{ACTOR}tau_pos"], sapo[f"{ACTOR}tau_neg"]) == ("1.0", "1.05")  # on the actor, where SAPO reads them
    clip_cov = _keys(["rl/algorithm=clip_cov"])
    assert (clip_cov[f"{ACTOR}policy_loss.clip_cov_ratio"], clip_cov[f"{ACTOR}policy_loss.clip_cov_lb"],
            clip_cov[f"{ACTOR}policy_loss.clip_cov_ub"]) == ("0.0002", "1.0", "5.0")
    kl_cov = _keys(["rl/algorithm=kl_cov"])
    assert (kl_cov[f"{ACTOR}policy_loss.kl_cov_ratio"], kl_cov[f"{ACTOR}policy_loss.ppo_kl_coef"]) == ("0.002", "1.0")
    assert kl_cov["algorithm.filter_groups.enable"] == "true"
    for keys in (sapo, clip_cov):
        assert f"{ACTOR}policy_loss.kl_cov_ratio" not in keys
    assert not any("tau_" in key or "cov" in key for key in _keys([]))


def test_kl_terms_carry_their_estimator_only_when_on():
    grpo, rloo, dapo = _keys(["rl/algorithm=grpo"]), _keys(["rl/algorithm=rloo"]), _keys([])
    assert (grpo[f"{ACTOR}use_kl_loss"], grpo[f"{ACTOR}kl_loss_coef"], grpo[f"{ACTOR}kl_loss_type"]) == (
        "true", "0.001", "low_var_kl")
    assert (rloo["algorithm.adv_estimator"], rloo["algorithm.use_kl_in_reward"], rloo["algorithm.kl_ctrl.kl_coef"],
            rloo["algorithm.kl_penalty"]) == ("rloo", "true", "0.001", "kl")
    assert f"{ACTOR}kl_loss_type" not in dapo and "algorithm.kl_penalty" not in dapo
    assert _keys(["rl/algorithm=reinforce_pp"])["algorithm.adv_estimator"] == "reinforce_plus_plus"


def test_entropy_bonus_is_dapo_with_an_entropy_coefficient():
    dapo, bonus = _keys([]), _keys(["rl/algorithm=entropy_bonus"])
    changed = {key for key in bonus if bonus[key] != dapo.get(key)}
    assert {key for key in changed if key.startswith(("algorithm.", ACTOR))} == {f"{ACTOR}entropy_coeff"}
    assert bonus[f"{ACTOR}entropy_coeff"] == "0.001"


def test_cispo_may_leave_the_ratio_unclipped_below_and_only_cispo():
    assert compose(["rl/algorithm=cispo"]).rl.clip_ratio_low == 10.0
    with pytest.raises(ConfigError, match=r"^rl\.clip_ratio_low must be in \[0, 1\] \(above 1 only with "
                                          r"rl\.policy_loss_mode=cispo"):
        compose(["rl.clip_ratio_low=10"])
    with pytest.raises(ConfigError, match=r"^rl\.clip_ratio_low must be in \[0, inf\]"):
        compose(["rl/algorithm=cispo", "rl.clip_ratio_low=-1"])


@pytest.mark.parametrize("override, key", [("rl.policy_loss_mode=dro", "rl.policy_loss_mode"),
                                           ("rl.adv_estimator=gae", "rl.adv_estimator"),
                                           ("rl.loss_agg_mode=sum", "rl.loss_agg_mode"),
                                           ("rl.loss_scale_factor=256", "rl.loss_scale_factor"),
                                           ("rl.kl_loss_type=k9", "rl.kl_loss_type"),
                                           ("rl.kl_penalty=low_var_kl+", "rl.kl_penalty"),
                                           ("rl.algorithm=ppo", "rl.algorithm"),
                                           ("rl.tau_neg=0", "rl.tau_neg"),
                                           ("rl.clip_cov_lb=6", "rl.clip_cov_lb")])
def test_bad_algorithm_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.")):
        compose([override])


def test_token_sum_and_the_straight_through_kl_are_accepted():
    cfg = compose(["rl.loss_agg_mode=token-sum", "rl.use_kl_loss=true", "rl.kl_loss_type=low_var_kl+"])
    assert _keys(["rl.loss_agg_mode=token-sum"])[f"{ACTOR}loss_agg_mode"] == "token-sum"
    assert cfg.rl.kl_loss_type == "low_var_kl+"


def test_an_unknown_algorithm_is_refused_in_one_line_listing_the_choices():
    choices = ", ".join(sorted(ALGORITHM_TITLES))
    with pytest.raises(ConfigError, match=f"^unknown rl/algorithm 'ppo'; choose one of: {choices}$"):
        compose(["rl/algorithm=ppo"])
    result = subprocess.run([sys.executable, "-m", "pipeline.run", "experiment=toy_rl", "rl/algorithm=dapo,ppo",
                             "dry_run=true"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: unknown rl/algorithm 'ppo'; choose one of: {choices}"


def test_the_dry_run_prints_the_gspo_loss():
    """The issue's acceptance command."""
    result = subprocess.run([sys.executable, "-m", "pipeline.run", "experiment=toy_rl", "profile=toy",
                             "rl/algorithm=gspo", "dry_run=true"], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr
    verl_lines = [line for line in result.stdout.splitlines() if line.strip().startswith("verl:")]
    assert len(verl_lines) == 2  # base and sft
    assert all(f"{ACTOR}policy_loss.loss_mode=gspo" in line for line in verl_lines)


def test_the_readme_sweep_composes_at_every_point():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"`python -m pipeline\.run -m ([^`]*rl/algorithm=[^`]+)`", text)
    overrides = shlex.split(command)
    (sweep,) = [override for override in overrides if override.startswith("rl/algorithm=")]
    rest = [override for override in overrides if override != sweep]
    for name in sweep.split("=", 1)[1].split(","):
        assert compose([*rest, f"rl/algorithm={name}"]).rl.algorithm == name


def test_the_name_field_cannot_relabel_another_algorithm():
    """``rl.algorithm=gspo`` (a dot) sets the name only: DAPO's loss would run under GSPO's name and identity."""
    with pytest.raises(ConfigError, match=r"^rl\.algorithm=gspo runs rl\.policy_loss_mode=vanilla, not its preset's "
                                          r"gspo: choose an algorithm with rl/algorithm=<name>"):
        compose(["rl.algorithm=gspo"])
    with pytest.raises(ConfigError, match=r"^rl\.algorithm=grpo runs rl\.policy_loss_mode=gspo"):
        compose(["rl/algorithm=grpo", "rl.policy_loss_mode=gspo"])
    assert compose(["rl/algorithm=gspo", "rl.clip_ratio_high=0.0005"]).rl.clip_ratio_high == 0.0005
