"""Schema of the RL stage: the algorithm (``rl/algorithm=<name>``, DAPO by default), its scale, plus a pass-through
of verl keys.

``rl/verl_args.py`` turns these fields into ``python -m verl.trainer.main_ppo`` overrides; anything verl has
that we do not decide goes through ``verl_overrides`` unchanged (and wins over ours).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from common.config.common import (
    IDENTITY_WHEN_SET,
    SUPERVISION,
    ConfigError,
    SamplingConfig,
    check_choice,
    check_range,
)

REWARD_STYLES = {"plus_minus_one": (1.0, -1.0), "zero_one": (1.0, 0.0)}
"""Reward style -> (score of a correct answer, score of a wrong one)."""
ALGORITHM_TITLES = {"dapo": "DAPO", "grpo": "GRPO", "dr_grpo": "Dr.GRPO", "gspo": "GSPO", "cispo": "CISPO",
                    "sapo": "SAPO", "gmpo": "GMPO", "rloo": "RLOO", "reinforce_pp": "REINFORCE++",
                    "clip_cov": "Clip-Cov", "kl_cov": "KL-Cov", "entropy_bonus": "DAPO+entropy"}
"""Each preset of ``conf/rl/algorithm/`` (``rl.algorithm``) and its title in the report (``Method(+GSPO)``)."""
ADVANTAGE_ESTIMATORS = ("grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "reinforce_plus_plus",
                        "reinforce_plus_plus_baseline", "opo")
"""verl 0.9.1's advantage estimators that need no key of their own (``core_algos.AdvantageEstimator``)."""
POLICY_LOSS_MODES = ("vanilla", "gspo", "sapo", "cispo", "geo_mean", "clip_cov", "kl_cov")
"""verl 0.9.1's policy losses whose keys ``rl/verl_args.py`` maps (the others: ``rl.verl_overrides``)."""
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""verl's KL estimators (``core_algos.kl_penalty``); the actor's KL loss also takes a trailing ``+`` (k2 gradient)."""
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""verl's loss aggregations (``ActorConfig.__post_init__``)."""
UNCLIPPED_BELOW = ("cispo",)
"""Policy losses whose lower clip is off: CISPO clips the importance weight only above (``clip_ratio_low`` 10)."""


@dataclass
class RLConfig(SamplingConfig):
    """DAPO with verl 0.9.1 (``python -m verl.trainer.main_ppo``); the rollouts sample with ``temperature`` and
    ``top_p`` (:class:`SamplingConfig`)."""

    init: str = ""
    """Variant RL starts from, which names its run folder: ``base`` (the base model) or an SFT method label; empty =
    the label of ``sft.method``."""
    init_run: str = ""
    """The SFT run folder RL starts from, which the orchestrator's plan hands down; empty: the configured method's run
    (``sft.method``), or the base model for ``init=base``."""
    init_lora: str = field(default="merged", metadata=IDENTITY_WHEN_SET)
    """From a LoRA SFT run (``sft.lora.enabled``): ``merged``, full RL from its merged export (``hf/``); ``adapter``,
    verl trains that run's adapter on the base model (``lora_rank``, ``lora_alpha``, ``target_modules``,
    ``lora_adapter_path``)."""
    lr: float = 1e-6
    """Actor learning rate (AdamW)."""
    lr_warmup_steps: int = 10
    """Linear warm-up steps of the learning rate (then constant)."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip of the actor."""
    train_batch_size: int = 256
    """Prompts per RL step (after group filtering)."""
    ppo_mini_batch_size: int = 32
    """Prompts per actor update: train_batch_size / ppo_mini_batch_size optimiser steps per RL step."""
    ppo_epochs: int = 1
    """Passes over each RL batch."""
    rollout_n: int = 16
    """Rollouts per prompt (the GRPO group size G)."""
    total_steps: int = 200
    """RL steps."""
    max_prompt_length: int = 2048
    """Prompt tokens (longer prompts are filtered out)."""
    max_response_length: int = 8192
    """Response tokens L_max."""
    # The algorithm: a preset of conf/rl/algorithm/ sets the fields from here to filter_groups (docs/rl_algorithms.md);
    # the defaults are DAPO's, and verl's for what DAPO leaves to verl.
    algorithm: str = field(default="dapo", metadata=IDENTITY_WHEN_SET)
    """The preset's name (``rl/algorithm=<name>``, :data:`ALGORITHM_TITLES`): Table 2's ``Method(+<title>)``."""
    adv_estimator: str = field(default="grpo", metadata=IDENTITY_WHEN_SET)
    """verl's advantage estimator (:data:`ADVANTAGE_ESTIMATORS`): grpo Â = (R − mean_G R) / std_G R, rloo, ..."""
    norm_adv_by_std: bool = field(default=True, metadata=IDENTITY_WHEN_SET)
    """GRPO advantages divided by the group's std; false: Dr.GRPO's R − mean_G R."""
    policy_loss_mode: str = field(default="vanilla", metadata=IDENTITY_WHEN_SET)
    """verl's policy loss (:data:`POLICY_LOSS_MODES`): vanilla (PPO clip), gspo, sapo, cispo, geo_mean, clip_cov, ..."""
    clip_ratio_low: float = 0.2
    """ε_low: the ratio r = π_θ/π_old is clipped below at 1 - ε_low (CISPO: 10, no lower clip)."""
    clip_ratio_high: float = 0.28
    """ε_high (clip-higher): r is clipped above at 1 + ε_high."""
    clip_ratio_c: float = 10.0
    """Dual-clip bound for negative advantages: the per-token loss is capped at -c·Â (must be > 1)."""
    loss_agg_mode: str = "token-mean"
    """Loss aggregation (:data:`LOSS_AGG_MODES`): token-mean (DAPO: one denominator for all tokens of the
    mini-batch), token-sum, or a seq-mean variant."""
    loss_scale_factor: Optional[int] = field(default=None, metadata=IDENTITY_WHEN_SET)
    """The constant seq-mean-token-sum-norm divides by (Dr.GRPO: the response budget); None: verl's (the batch's
    response width)."""
    use_kl_loss: bool = field(default=False, metadata=IDENTITY_WHEN_SET)
    """A KL(π_θ‖π_ref) term in the actor loss, weighted ``kl_loss_coef``, estimated as ``kl_loss_type``."""
    kl_loss_coef: float = field(default=0.0, metadata=IDENTITY_WHEN_SET)
    """Weight of the actor loss's KL term (read with ``use_kl_loss``)."""
    kl_loss_type: str = field(default="low_var_kl", metadata=IDENTITY_WHEN_SET)
    """:data:`KL_ESTIMATORS`, optionally with a trailing ``+`` (verl's straight-through k2 gradient)."""
    use_kl_in_reward: bool = field(default=False, metadata=IDENTITY_WHEN_SET)
    """A KL penalty in the reward (RLOO, REINFORCE++), weighted ``kl_in_reward_coef``, estimated as ``kl_penalty``."""
    kl_in_reward_coef: float = field(default=0.0, metadata=IDENTITY_WHEN_SET)
    """Weight of the reward's KL penalty (verl's fixed ``kl_ctrl.kl_coef``; read with ``use_kl_in_reward``)."""
    kl_penalty: str = field(default="kl", metadata=IDENTITY_WHEN_SET)
    """The reward's KL estimator (:data:`KL_ESTIMATORS`)."""
    entropy_coeff: float = field(default=0.0, metadata=IDENTITY_WHEN_SET)
    """Weight of the entropy bonus −coef·H(π_θ) in the actor loss."""
    tau_pos: float = field(default=1.0, metadata=IDENTITY_WHEN_SET)
    """SAPO's temperature of the soft gate for positive advantages."""
    tau_neg: float = field(default=1.05, metadata=IDENTITY_WHEN_SET)
    """SAPO's temperature for negative advantages."""
    clip_cov_ratio: float = field(default=2e-4, metadata=IDENTITY_WHEN_SET)
    """Clip-Cov: share of the tokens (those with cov(log π, Â) in [clip_cov_lb, clip_cov_ub]) kept out of the
    gradient."""
    clip_cov_lb: float = field(default=1.0, metadata=IDENTITY_WHEN_SET)
    """Clip-Cov: lower bound of the covariance band."""
    clip_cov_ub: float = field(default=5.0, metadata=IDENTITY_WHEN_SET)
    """Clip-Cov: upper bound of the covariance band."""
    kl_cov_ratio: float = field(default=2e-4, metadata=IDENTITY_WHEN_SET)
    """KL-Cov: share of tokens (the largest cov(log π, Â)) penalised by ``ppo_kl_coef``·|log r|."""
    ppo_kl_coef: float = field(default=0.1, metadata=IDENTITY_WHEN_SET)
    """KL-Cov: weight of the |log r| penalty on the selected tokens."""
    filter_groups: bool = True
    """Dynamic sampling: drop groups whose ``filter_groups_metric`` is the same for all G rollouts, refill."""
    val_temperature: float = 1.0
    """Validation sampling temperature (verl's in-training validation; the eval stage has its own)."""
    val_top_p: float = 0.7
    """Validation nucleus mass (DAPO recipe)."""
    val_n: int = 1
    """Validation samples per prompt."""
    filter_groups_metric: str = "acc"
    """Per-rollout value the filter compares: acc (verified correct, from rl/reward.py) or reward (shaped score)."""
    max_inflight_gen_batches: int = 3
    """Prompt batches (in train_batch_size units) generated concurrently while refilling filtered groups."""
    max_gen_batches: int = field(default=100, metadata=SUPERVISION)
    """With ``filter_groups``: stop the run, naming the shares of all-right and all-wrong groups, when a step has
    judged this many generation batches (``train_batch_size`` prompt groups each) without ``train_batch_size`` mixed
    groups; 0: never. A step needs about 1 / (share of mixed groups) of them."""
    sampler_poll_s: float = field(default=0.25, metadata=SUPERVISION)
    """With ``filter_groups``: seconds between the replay buffer's looks at the finished groups (verl's default 2.0);
    the refills of filtered groups go out at these looks, so a step waits up to this long per refill wave. Timing only:
    which groups get generated depends on arrival order whatever it is (RL is not bitwise reproducible)."""
    overlong_buffer: bool = True
    """Overlong reward shaping: penalty min(-(|o| - (L_max - L_buf)) / L_buf · factor, 0)."""
    overlong_buffer_len: int = 4096
    """L_buf in tokens (must be ≤ max_response_length)."""
    overlong_penalty_factor: float = 1.0
    """Penalty at |o| = L_max."""
    reward_style: str = "plus_minus_one"
    """Task reward: plus_minus_one (+1 correct / -1 wrong, the DAPO recipe) or zero_one."""
    use_dynamic_bsz: bool = True
    """Pack micro-batches by token count (max prompt + response tokens per GPU) instead of a fixed size."""
    micro_batch_size_per_gpu: int = 4
    """Sequences per forward/backward micro-batch when ``use_dynamic_bsz`` is false."""
    gradient_checkpointing: bool = True
    """Activation checkpointing of the actor."""
    rollout_tensor_parallel: int = 1
    """vLLM tensor-parallel size per rollout replica (GPU profile)."""
    gpu_memory_utilization: float = 0.6
    """Fraction of GPU memory vLLM may take (GPU profile)."""
    save_freq: int = field(default=20, metadata=SUPERVISION)
    """Save a verl checkpoint every N steps (and always at the last step, which is merged to HF)."""
    test_freq: int = 20
    """Run verl's validation on rl_val.parquet every N steps (0: never)."""
    val_before_train: bool = True
    """Validate once before the first step (a baseline for the curve)."""
    max_checkpoints_to_keep: int = field(default=2, metadata=SUPERVISION)
    """verl actor checkpoints kept on disk (older ones are deleted)."""
    stall_timeout_s: float = field(default=0.0, metadata=SUPERVISION)
    """Stop the run with an error when verl shows no progress for this long: no output line during start-up, no new
    step after the first; 0: never. verl 0.9.1 waits forever when one of its Ray actors dies (e.g. killed for
    memory)."""
    verl_overrides: dict[str, str] = field(default_factory=dict)
    """Extra verl keys passed through unchanged (``key: value``; prefix ``+`` for keys not in verl's schema); they win."""

    @property
    def algorithm_suffix(self) -> str:
        """:func:`algorithm_suffix` of this run's algorithm."""
        return algorithm_suffix(self.algorithm)

    @property
    def kept_groups_per_step(self) -> int | None:
        """Prompt groups a DAPO step trains on when it filters groups (``train_batch_size``; dynamic sampling refills
        the ones it drops); None without group filtering."""
        return self.train_batch_size if self.filter_groups else None

    def validate_algorithm(self) -> None:
        check_choice("rl.algorithm", self.algorithm, ALGORITHM_TITLES)
        check_choice("rl.adv_estimator", self.adv_estimator, ADVANTAGE_ESTIMATORS)
        check_choice("rl.policy_loss_mode", self.policy_loss_mode, POLICY_LOSS_MODES)
        if self.policy_loss_mode in UNCLIPPED_BELOW:
            check_range("rl.clip_ratio_low", self.clip_ratio_low, 0.0)
        elif not 0.0 <= self.clip_ratio_low <= 1.0:
            raise ConfigError(f"rl.clip_ratio_low must be in [0, 1] (above 1 only with rl.policy_loss_mode="
                              f"{'|'.join(UNCLIPPED_BELOW)}, which has no lower clip); got {self.clip_ratio_low!r}")
        check_range("rl.clip_ratio_high", self.clip_ratio_high, 0.0)
        check_range("rl.clip_ratio_c", self.clip_ratio_c, 1.0, low_open=True)
        check_choice("rl.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        if self.loss_scale_factor is not None:
            if self.loss_agg_mode != "seq-mean-token-sum-norm":
                raise ConfigError(f"rl.loss_scale_factor={self.loss_scale_factor} is read only by rl.loss_agg_mode="
                                  f"seq-mean-token-sum-norm (got {self.loss_agg_mode}); set it to null")
            check_range("rl.loss_scale_factor", self.loss_scale_factor, 1)
        check_range("rl.kl_loss_coef", self.kl_loss_coef, 0.0)
        check_choice("rl.kl_loss_type", self.kl_loss_type.removesuffix("+"), KL_ESTIMATORS)
        check_range("rl.kl_in_reward_coef", self.kl_in_reward_coef, 0.0)
        check_choice("rl.kl_penalty", self.kl_penalty, KL_ESTIMATORS)
        check_range("rl.entropy_coeff", self.entropy_coeff, 0.0)
        check_range("rl.tau_pos", self.tau_pos, 0.0, low_open=True)
        check_range("rl.tau_neg", self.tau_neg, 0.0, low_open=True)
        check_range("rl.clip_cov_ratio", self.clip_cov_ratio, 0.0, 1.0, low_open=True)
        check_range("rl.clip_cov_lb", self.clip_cov_lb, None, self.clip_cov_ub)
        check_range("rl.kl_cov_ratio", self.kl_cov_ratio, 0.0, 1.0, low_open=True)
        check_range("rl.ppo_kl_coef", self.ppo_kl_coef, 0.0)

    def validate(self) -> None:
        check_choice("rl.init_lora", self.init_lora, ("merged", "adapter"))
        if "/" in self.init:
            raise ConfigError(f"rl.init must be 'base' or an SFT method label (a folder name); got {self.init!r}")
        if self.init == "base" and self.init_run:
            raise ConfigError(f"rl.init=base starts from the base model, but rl.init_run names an SFT run "
                              f"({self.init_run}); drop one")
        check_range("rl.lr", self.lr, 0.0, 1.0, low_open=True)
        check_range("rl.lr_warmup_steps", self.lr_warmup_steps, 0)
        check_range("rl.weight_decay", self.weight_decay, 0.0)
        check_range("rl.grad_clip", self.grad_clip, 0.0, low_open=True)
        check_range("rl.train_batch_size", self.train_batch_size, 1)
        check_range("rl.ppo_mini_batch_size", self.ppo_mini_batch_size, 1, self.train_batch_size)
        if self.train_batch_size % self.ppo_mini_batch_size:
            raise ConfigError(f"rl.ppo_mini_batch_size ({self.ppo_mini_batch_size}) must divide "
                              f"rl.train_batch_size ({self.train_batch_size})")
        check_range("rl.ppo_epochs", self.ppo_epochs, 1)
        check_range("rl.rollout_n", self.rollout_n, 1)
        check_range("rl.total_steps", self.total_steps, 1)
        check_range("rl.max_prompt_length", self.max_prompt_length, 1)
        check_range("rl.max_response_length", self.max_response_length, 1)
        self.validate_algorithm()
        self.validate_sampling("rl", greedy=False)
        check_range("rl.val_temperature", self.val_temperature, 0.0)
        check_range("rl.val_top_p", self.val_top_p, 0.0, 1.0, low_open=True)
        check_range("rl.val_n", self.val_n, 1)
        check_choice("rl.filter_groups_metric", self.filter_groups_metric, ("acc", "reward"))
        if self.filter_groups and self.rollout_n < 2:
            raise ConfigError("rl.filter_groups needs rl.rollout_n >= 2 (a group of one is always uniform)")
        check_range("rl.max_inflight_gen_batches", self.max_inflight_gen_batches, 1)
        check_range("rl.max_gen_batches", self.max_gen_batches, 0)
        check_range("rl.sampler_poll_s", self.sampler_poll_s, 0.01, 60.0)
        if self.overlong_buffer:
            check_range("rl.overlong_buffer_len", self.overlong_buffer_len, 1, self.max_response_length)
        check_range("rl.overlong_penalty_factor", self.overlong_penalty_factor, 0.0)
        check_choice("rl.reward_style", self.reward_style, tuple(REWARD_STYLES))
        check_range("rl.micro_batch_size_per_gpu", self.micro_batch_size_per_gpu, 1)
        if not self.use_dynamic_bsz and (self.ppo_mini_batch_size * self.rollout_n) % self.micro_batch_size_per_gpu:
            # verl asserts this deep inside its first log-prob pass, after Ray and vLLM have started.
            raise ConfigError(f"rl.micro_batch_size_per_gpu ({self.micro_batch_size_per_gpu}) must divide "
                              f"rl.ppo_mini_batch_size x rl.rollout_n ({self.ppo_mini_batch_size} x {self.rollout_n}) "
                              "when rl.use_dynamic_bsz is false")
        check_range("rl.rollout_tensor_parallel", self.rollout_tensor_parallel, 1)
        check_range("rl.gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        check_range("rl.save_freq", self.save_freq, 1)
        check_range("rl.test_freq", self.test_freq, 0)
        check_range("rl.max_checkpoints_to_keep", self.max_checkpoints_to_keep, 1)
        check_range("rl.stall_timeout_s", self.stall_timeout_s, 0.0)
        for key in self.verl_overrides:
            if not key or "=" in key or " " in key:
                raise ConfigError(f"rl.verl_overrides has an invalid verl key {key!r} (write key: value)")


def algorithm_suffix(algorithm: str) -> str:
    """``+<algorithm>`` after the names of an RL run and of the report for every algorithm but the default DAPO
    (whose names stay as they were), so a sweep over ``rl/algorithm`` keeps one report per point."""
    return "" if algorithm == RLConfig.algorithm else f"+{algorithm}"
