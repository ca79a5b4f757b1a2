"""verl's own config validation of our argv: composition against verl's ``ppo_trainer`` config, its checks and
registries (imports verl, so not a unit test)."""
from __future__ import annotations

import pytest

from common.config import compose
from rl.verl_args import build_overrides, validate_with_verl


@pytest.mark.parametrize("profile, variant", [("paper", "eksft"), ("toy", "sft")])
def test_verl_composes_and_validates_our_overrides(profile, variant):
    cfg = compose([f"profile={profile}", f"sft/method={variant}"])
    verl_cfg = validate_with_verl(build_overrides(cfg))
    assert verl_cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert verl_cfg.reward.reward_manager.name == "dapo"
    assert verl_cfg.algorithm.filter_groups.metric == "acc"
    assert verl_cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"


def test_verl_rejects_a_misspelled_key():
    cfg = compose(["profile=paper", "+rl.verl_overrides={actor_rollout_ref.actor.clip_ratio_hihg:0.3}"])
    with pytest.raises(Exception, match="clip_ratio_hihg"):
        validate_with_verl(build_overrides(cfg))


def test_verl_rejects_an_unknown_algorithm_name():
    cfg = compose(["profile=paper", "+rl.verl_overrides={algorithm.adv_estimator:grpoo}"])
    with pytest.raises(Exception, match="grpoo"):
        validate_with_verl(build_overrides(cfg))
