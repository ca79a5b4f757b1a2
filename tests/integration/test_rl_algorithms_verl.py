"""Every ``rl/algorithm`` preset through verl's own checks: composition against verl's ``ppo_trainer`` config, its
``validate_config``, its typed algorithm/actor configs and the advantage and policy-loss registries
(``rl.verl_args.validate_with_verl``), with the values arriving where verl reads them."""
from __future__ import annotations

from dataclasses import fields

import pytest

from common.config import RLConfig, compose
from common.config.rl import ADVANTAGE_ESTIMATORS, ALGORITHM_TITLES, POLICY_LOSS_MODES
from rl.verl_args import LOSS_MODE_KEYS, build_overrides, validate_with_verl


PRESETS = [("toy", name) for name in sorted(ALGORITHM_TITLES) if name != "dapo"] + [
    ("paper", "dr_grpo"), ("paper", "grpo")]
"""The CPU profile (fixed micro-batches: a reference policy needs its own) for each preset, the paper profile (dynamic
batches) for the response budget of Dr.GRPO and a reference; DAPO: tests/integration/test_rl_verl_validation.py."""


@pytest.mark.parametrize("profile, name", PRESETS)
def test_every_preset_passes_verls_validation_with_its_values(profile, name):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose([f"profile={profile}", f"rl/algorithm={name}"])
    rl, verl_cfg = cfg.rl, validate_with_verl(build_overrides(cfg))
    algorithm, actor = verl_cfg.algorithm, omega_conf_to_dataclass(verl_cfg.actor_rollout_ref.actor)
    assert (algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo, algorithm.use_kl_in_reward,
            algorithm.kl_ctrl.kl_coef, algorithm.kl_penalty, algorithm.filter_groups.enable) == (
        rl.adv_estimator, rl.norm_adv_by_std, rl.use_kl_in_reward, rl.kl_in_reward_coef, rl.kl_penalty,
        rl.filter_groups)
    assert (actor.policy_loss.loss_mode, actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c,
            actor.loss_agg_mode, actor.loss_scale_factor, actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type,
            actor.entropy_coeff, actor.tau_pos, actor.tau_neg) == (
        rl.policy_loss_mode, rl.clip_ratio_low, rl.clip_ratio_high, rl.clip_ratio_c, rl.loss_agg_mode,
        rl.loss_scale_factor, rl.use_kl_loss, rl.kl_loss_coef, rl.kl_loss_type, rl.entropy_coeff, rl.tau_pos,
        rl.tau_neg)
    assert (actor.policy_loss.clip_cov_ratio, actor.policy_loss.clip_cov_lb, actor.policy_loss.clip_cov_ub,
            actor.policy_loss.kl_cov_ratio, actor.policy_loss.ppo_kl_coef) == (
        rl.clip_cov_ratio, rl.clip_cov_lb, rl.clip_cov_ub, rl.kl_cov_ratio, rl.ppo_kl_coef)


def test_what_an_algorithm_leaves_unset_is_verls_default():
    """A key is written only when its algorithm reads it, so our defaults must be verl 0.9.1's."""
    from verl.trainer.config import AlgoConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    ours = {f.name: f.default for f in fields(RLConfig)}
    verl_defaults = {f.name: f.default for cls in (ActorConfig, PolicyLossConfig, AlgoConfig) for f in fields(cls)}
    for field_name in ("kl_loss_type", "kl_penalty", "loss_scale_factor", *[name for keys in LOSS_MODE_KEYS.values()
                                                                             for name in keys]):
        assert ours[field_name] == verl_defaults[field_name], field_name
    assert ours["norm_adv_by_std"] == verl_defaults["norm_adv_by_std_in_grpo"]


def test_every_name_the_schema_accepts_is_in_verls_registries():
    from verl.trainer.ppo import core_algos

    for name in ADVANTAGE_ESTIMATORS:
        core_algos.get_adv_estimator_fn(name)
    for name in POLICY_LOSS_MODES:
        core_algos.get_policy_loss_fn(name)
