"""Our config -> the exact ``python -m verl.trainer.main_ppo`` command line (pure: no files written, no Ray).

DAPO in verl 0.9.1 is plain ``main_ppo`` (V1 trainer) with GRPO advantages, clip-higher, token-mean, no KL,
group filtering (``algorithm.filter_groups``), the ``dapo`` reward manager with the overlong buffer, and our
reward function (``rl/reward.py``, which calls ``eval.scoring.verify``). The key table is in docs/rl.md. Another
algorithm (``rl/algorithm=<name>``) changes only the keys of :func:`_objective_keys` and :func:`_policy_loss_keys`,
the one place its fields map to verl's keys (docs/rl_algorithms.md); the reward and the sampler stay.

Order of precedence: our keys, then the CPU-embedding keys (``profile.device=cpu``), then the user's
``rl.verl_overrides`` (a user key replaces ours with the same name, with or without a ``+``).
:func:`validate_with_verl` composes verl's own ``ppo_trainer`` config with the result and runs verl's
``validate_config``, so a stale or misspelled key fails on a laptop, not on a cluster.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from common.config import Config, ConfigError
from common.config.common import computation_config
from common.config import override_value as format_value
from common.config.rl import REWARD_STYLES, RLConfig
from common.manifest import read_manifest
from common.paths import (
    RL_TRAIN_FILE,
    RL_VAL_FILE,
    base_model_path,
    data_dir,
    hf_export_dir,
    lora_adapter_dir,
    rl_dir,
    rl_start,
)
from common.numerics import pinned_kernels_env
from common.seeding import derive_seed
from common.tracking import CPU_OPENMP_ENV

MAIN_PPO_MODULE = "verl.trainer.main_ppo"
REWARD_FILE = Path(__file__).resolve().with_name("reward.py")
REWARD_FUNCTION = "compute_score"
DAPO_SAMPLER = (Path(__file__).resolve().with_name("dapo_sampler.py"), "BoundedDapoReplayBuffer")
"""verl's replay buffer with group filtering, bounded by ``rl.max_gen_batches`` (``rl/dapo_sampler.py``)."""
DAPO_PROGRESS_PREFIX = "[dapo] "
"""Start of the sampler's line after each generation batch (``rl.train`` shows it on the progress bar)."""
DAPO_STOPPED_PREFIX = "[dapo] stopped: "
"""Start of the sampler's line saying why it stopped after ``rl.max_gen_batches`` generation batches."""
CHECKPOINT_SUBDIR = "checkpoints"
VAL_GENERATIONS_SUBDIR = "val_generations"
HYDRA_SUBDIR = "verl_hydra"
"""verl's own Hydra output (resolved config, overrides, main_ppo.log), kept in the RL run folder, not ./outputs/."""
PRECISION_NAMES = {"bfloat16": "bf16", "float32": "fp32"}
"""``model.dtype`` as verl's precision names."""
CPU_FAKE_GPUS_PER_NODE = 1
"""The CPU profile gives Ray one fake GPU per trainer process so verl's GPU placement groups can be scheduled."""
CPU_RAY_LOGICAL_CPUS = 16
"""Ray CPUs are bookkeeping: TransferQueue, agent-loop and reward actors each reserve one (2 hang forever)."""
CPU_VLLM_KV_CACHE_GB = 1
"""vLLM-CPU KV cache (``VLLM_CPU_KVCACHE_SPACE``, GiB); the toy model needs a few MB."""


def resolve_variant(cfg: Config) -> str:
    """The variant RL starts from: ``rl.init``, or the label of the configured SFT method when it is empty."""
    return rl_start(cfg)[0]


def init_model_path(cfg: Config) -> Path:
    """The HF folder RL starts from: the base model, or the export of the SFT run the plan hands down
    (``rl.init_run``; :func:`common.paths.rl_start`); the base model too when verl trains that run's LoRA adapter
    (``rl.init_lora=adapter``, :func:`lora_keys`)."""
    _, init = rl_start(cfg)
    return Path(base_model_path(cfg)) if init is None or lora_keys(cfg) else hf_export_dir(init)


def lora_keys(cfg: Config) -> dict[str, Any]:
    """With ``rl.init_lora=adapter``, verl's LoRA keys for the adapter of the SFT run RL starts from (its settings from
    that run's manifest, ``sft.lora``; before that run exists, as the plan builds every command first, from this
    config's ``sft.lora``, which that run is composed with); else none (a LoRA SFT run then starts full RL from its
    merged ``hf/``)."""
    if cfg.rl.init_lora != "adapter":
        return {}
    _, init = rl_start(cfg)
    manifest = read_manifest(init) if init is not None else None
    lora = manifest.config["sft"].get("lora", {}) if manifest is not None else \
        computation_config(cfg.sft.lora) if init is not None else {}
    if not lora.get("enabled"):
        raise ConfigError(f"rl.init_lora=adapter: {init or 'the base model'} is no LoRA SFT run "
                          "(sft.lora.enabled=true); start from its merged export with rl.init_lora=merged")
    return {"actor_rollout_ref.model.lora_rank": lora["rank"], "actor_rollout_ref.model.lora_alpha": lora["alpha"],
            "actor_rollout_ref.model.target_modules": list(lora["target_modules"]),
            "actor_rollout_ref.model.lora_adapter_path": _absolute(lora_adapter_dir(init)),
            # vLLM wraps only the adapter's modules: unrestricted, it wraps embed_tokens too, and the base-weight sync
            # of a tied model then fails ('lm_head.weight' tied to an unloaded 'model.embed_tokens.base_layer.weight')
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.lora_target_modules": list(lora["target_modules"])}


def data_files(cfg: Config) -> tuple[Path, Path]:
    """(train, validation) parquet files in verl's RL format, written by the data stage."""
    directory = data_dir(cfg)
    return directory / RL_TRAIN_FILE, directory / RL_VAL_FILE


def reward_scores(cfg: Config) -> tuple[float, float]:
    """(score of a correct answer, score of a wrong one) for ``rl.reward_style``."""
    return REWARD_STYLES[cfg.rl.reward_style]


def _absolute(path: str | Path) -> str:
    """Ray workers do not share the launcher's working directory, so run folders are passed as absolute paths."""
    return str(Path(path).resolve())


def _model_path(cfg: Config) -> str:
    """The start model as verl gets it: an absolute folder, or a hub id when the base model is a hub id."""
    path = init_model_path(cfg)
    is_hub_id = path == Path(base_model_path(cfg)) and cfg.model.source == "hub" and not path.exists()
    return str(path) if is_hub_id else _absolute(path)


def override_key(override: str) -> str:
    """The dotted key of a ``[+|++|~]key=value`` override."""
    return override.split("=", 1)[0].lstrip("+~")


def _trainer_keys(cfg: Config) -> dict[str, Any]:
    rl = cfg.rl
    variant, stage = resolve_variant(cfg), rl_dir(cfg)
    train_file, val_file = data_files(cfg)
    correct_score, incorrect_score = reward_scores(cfg)
    max_tokens_per_gpu = rl.max_prompt_length + rl.max_response_length
    keys: dict[str, Any] = {
        # data
        "data.train_files": _absolute(train_file),
        "data.val_files": _absolute(val_file),
        "data.prompt_key": "prompt",
        "data.max_prompt_length": rl.max_prompt_length,
        "data.max_response_length": rl.max_response_length,
        "data.train_batch_size": rl.train_batch_size,
        "data.filter_overlong_prompts": True,
        "data.truncation": "left",
        "data.seed": derive_seed(cfg.seed, "rl/data"),
        # the algorithm: advantages, KL, entropy, dynamic sampling
        **_objective_keys(rl),
        # actor: the policy loss (clip, aggregation, loss mode), optimiser
        "actor_rollout_ref.model.path": _model_path(cfg),
        **lora_keys(cfg),
        "actor_rollout_ref.model.enable_gradient_checkpointing": rl.gradient_checkpointing,
        # actor and reference (they share the model config): ours, never verl's flash_attention_2 default, which
        # needs the flash-attn package; the rollout's vLLM picks its own attention kernels. With sdpa, verl's packed
        # rows (use_remove_padding) get a dense block-diagonal mask: exact, but no flash kernel (docs/rl.md)
        "+actor_rollout_ref.model.override_config.attn_implementation": cfg.model.attn_implementation,
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.actor.optim.lr": rl.lr,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": rl.lr_warmup_steps,
        "actor_rollout_ref.actor.optim.weight_decay": rl.weight_decay,
        "actor_rollout_ref.actor.grad_clip": rl.grad_clip,
        **_policy_loss_keys(rl),
        "actor_rollout_ref.actor.ppo_mini_batch_size": rl.ppo_mini_batch_size,
        "actor_rollout_ref.actor.ppo_epochs": rl.ppo_epochs,
        "actor_rollout_ref.actor.use_dynamic_bsz": rl.use_dynamic_bsz,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": max_tokens_per_gpu,
        "actor_rollout_ref.actor.fsdp_config.seed": derive_seed(cfg.seed, "rl/train"),
        # compute precision = model.dtype for actor, reference and rollout (verl's default is bf16 everywhere, which
        # a CPU without native bf16 emulates: the toy profile runs fp32)
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision": {"param_dtype": PRECISION_NAMES[cfg.model.dtype]},
        "+actor_rollout_ref.ref.fsdp_config.mixed_precision": {"param_dtype": PRECISION_NAMES[cfg.model.dtype]},
        "actor_rollout_ref.rollout.dtype": cfg.model.dtype,
        "actor_rollout_ref.actor.data_loader_seed": derive_seed(cfg.seed, "rl/minibatch"),
        # rollout: vLLM, G samples per prompt
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": rl.rollout_n,
        "actor_rollout_ref.rollout.temperature": rl.temperature,
        "actor_rollout_ref.rollout.top_p": rl.top_p,
        "actor_rollout_ref.rollout.top_k": -1,
        "actor_rollout_ref.rollout.seed": derive_seed(cfg.seed, "rl/rollout"),
        "actor_rollout_ref.rollout.tensor_model_parallel_size": rl.rollout_tensor_parallel,
        "actor_rollout_ref.rollout.gpu_memory_utilization": rl.gpu_memory_utilization,
        "actor_rollout_ref.rollout.max_num_batched_tokens": max(8192, max_tokens_per_gpu),
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": max_tokens_per_gpu,
        "actor_rollout_ref.rollout.val_kwargs.temperature": rl.val_temperature,
        "actor_rollout_ref.rollout.val_kwargs.top_p": rl.val_top_p,
        "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
        "actor_rollout_ref.rollout.val_kwargs.n": rl.val_n,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": rl.val_temperature > 0,
        # reward: our verifier through the DAPO manager (overlong shaping in absolute reward units)
        "reward.reward_manager.name": "dapo",
        "reward.custom_reward_function.path": str(REWARD_FILE),
        "reward.custom_reward_function.name": REWARD_FUNCTION,
        "+reward.custom_reward_function.reward_kwargs.correct_score": correct_score,
        "+reward.custom_reward_function.reward_kwargs.incorrect_score": incorrect_score,
        "+reward.reward_kwargs.overlong_buffer_cfg.enable": rl.overlong_buffer,
        "+reward.reward_kwargs.overlong_buffer_cfg.len": rl.overlong_buffer_len,
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": rl.overlong_penalty_factor,
        "+reward.reward_kwargs.overlong_buffer_cfg.log": True,
        "+reward.reward_kwargs.max_resp_len": rl.max_response_length,
        # trainer: steps, checkpoints in the stage folder (resume_mode=auto picks up the latest one)
        "trainer.project_name": cfg.logging.wandb_project,
        "trainer.experiment_name": f"{cfg.experiment.name}-{cfg.model.name}-{variant}{rl.algorithm_suffix}",
        "trainer.logger": ["console", "file"] + (["wandb"] if cfg.logging.wandb_mode != "disabled" else []),
        "trainer.nnodes": cfg.profile.nnodes,
        "trainer.n_gpus_per_node": cfg.profile.nproc_per_node,
        "trainer.total_training_steps": rl.total_steps,
        # an upper bound only: the loop stops at total_training_steps; filtering may consume extra prompts
        "trainer.total_epochs": 1000,
        "trainer.save_freq": rl.save_freq,
        "trainer.test_freq": rl.test_freq if rl.test_freq > 0 else -1,
        "trainer.val_before_train": rl.val_before_train,
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": _absolute(stage / CHECKPOINT_SUBDIR),
        "trainer.validation_data_dir": _absolute(stage / VAL_GENERATIONS_SUBDIR),
        "trainer.max_actor_ckpt_to_keep": rl.max_checkpoints_to_keep,
        "hydra.run.dir": _absolute(stage / HYDRA_SUBDIR),
    }
    if not rl.use_dynamic_bsz:
        keys["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] = rl.micro_batch_size_per_gpu
        keys["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] = rl.micro_batch_size_per_gpu
        if rl.use_kl_loss or rl.use_kl_in_reward:  # the reference policy's log-probs (verl's need_reference_policy)
            keys["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] = rl.micro_batch_size_per_gpu
    if rl.filter_groups:
        keys.update(_dapo_sampler_keys(cfg))
    return keys


# ------------------------------------------------------------------------------ the algorithm (rl/algorithm=<name>)
LOSS_MODE_KEYS = {"sapo": {"tau_pos": "tau_pos", "tau_neg": "tau_neg"},
                  "clip_cov": {"clip_cov_ratio": "policy_loss.clip_cov_ratio", "clip_cov_lb": "policy_loss.clip_cov_lb",
                               "clip_cov_ub": "policy_loss.clip_cov_ub"},
                  "kl_cov": {"kl_cov_ratio": "policy_loss.kl_cov_ratio", "ppo_kl_coef": "policy_loss.ppo_kl_coef"}}
"""Per policy loss, the ``rl.*`` fields only it reads -> their keys under ``actor_rollout_ref.actor`` (SAPO reads its
temperatures from the actor config, not from ``policy_loss``)."""


def _objective_keys(rl: RLConfig) -> dict[str, Any]:
    """The advantage estimator, the KL terms, the entropy bonus and dynamic sampling of the algorithm; a key only
    some algorithms read (Dr.GRPO's unscaled advantages, a KL estimator) follows when it is in use."""
    keys: dict[str, Any] = {
        "algorithm.adv_estimator": rl.adv_estimator,
        "algorithm.use_kl_in_reward": rl.use_kl_in_reward,
        "algorithm.kl_ctrl.kl_coef": rl.kl_in_reward_coef,
        "actor_rollout_ref.actor.use_kl_loss": rl.use_kl_loss,
        "actor_rollout_ref.actor.kl_loss_coef": rl.kl_loss_coef,
        # the int 0 when off, as DAPO's argv has always written it (tests/assets/dapo_argv_*.txt)
        "actor_rollout_ref.actor.entropy_coeff": rl.entropy_coeff or 0,
        # dynamic sampling (the V1 trainer ignores max_num_gen_batches; max_inflight_gen_batches bounds refills, our
        # replay buffer the generation batches of a step: _dapo_sampler_keys)
        "algorithm.filter_groups.enable": rl.filter_groups,
        "algorithm.filter_groups.metric": rl.filter_groups_metric,
        "algorithm.filter_groups.max_inflight_gen_batches": rl.max_inflight_gen_batches,
    }
    if not rl.norm_adv_by_std:
        keys["algorithm.norm_adv_by_std_in_grpo"] = False
    if rl.use_kl_in_reward:
        keys["algorithm.kl_penalty"] = rl.kl_penalty
    if rl.use_kl_loss:
        keys["actor_rollout_ref.actor.kl_loss_type"] = rl.kl_loss_type
    return keys


def _policy_loss_keys(rl: RLConfig) -> dict[str, Any]:
    """The policy loss of the algorithm: the clip ratios, the aggregation (and its constant), the loss mode and the
    settings only that mode reads (:data:`LOSS_MODE_KEYS`)."""
    keys: dict[str, Any] = {
        "actor_rollout_ref.actor.clip_ratio_low": rl.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_high": rl.clip_ratio_high,
        "actor_rollout_ref.actor.clip_ratio_c": rl.clip_ratio_c,
        "actor_rollout_ref.actor.loss_agg_mode": rl.loss_agg_mode,
        "actor_rollout_ref.actor.policy_loss.loss_mode": rl.policy_loss_mode,
    }
    if rl.loss_scale_factor is not None:
        keys["actor_rollout_ref.actor.loss_scale_factor"] = rl.loss_scale_factor
    for name, key in LOSS_MODE_KEYS.get(rl.policy_loss_mode, {}).items():
        keys[f"actor_rollout_ref.actor.{key}"] = getattr(rl, name)
    return keys


def _dapo_sampler_keys(cfg: Config) -> dict[str, Any]:
    """verl's replay buffer replaced by ``rl/dapo_sampler.py`` (the same sampling, counted and bounded), with what
    verl hands its built-in buffer, the filter metric's values of a right and a wrong rollout and how often it looks
    (``rl.sampler_poll_s``)."""
    rl = cfg.rl
    right, wrong = (1.0, 0.0) if rl.filter_groups_metric == "acc" else reward_scores(cfg)
    options = {"metric": rl.filter_groups_metric, "train_batch_size": rl.train_batch_size,
               "max_inflight_gen_batches": rl.max_inflight_gen_batches, "max_gen_batches": rl.max_gen_batches,
               "right_value": right, "wrong_value": wrong, "poll_interval_s": rl.sampler_poll_s}
    return {"trainer.v1.sampler.custom_sampler.path": str(DAPO_SAMPLER[0]),
            "trainer.v1.sampler.custom_sampler.name": DAPO_SAMPLER[1],
            **{f"+trainer.v1.sampler.sampler_kwargs.{key}": value for key, value in options.items()}}


def _cpu_keys(cfg: Config) -> dict[str, Any]:
    """What the real trainer needs on a CPU-only machine with the rl.verl_cpu_plugin platform (docs/rl.md)."""
    return {
        "trainer.device": "cpu",
        "ray_kwargs.ray_init.num_cpus": CPU_RAY_LOGICAL_CPUS,
        "+ray_kwargs.ray_init.num_gpus": CPU_FAKE_GPUS_PER_NODE * cfg.profile.nproc_per_node,
        # the dashboard UI is 9 more processes (about 0.8 GiB resident) that nobody opens on a CPU run
        "+ray_kwargs.ray_init.include_dashboard": False,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        "data.dataloader_num_workers": 0,
        # verl's remove-padding kernels do not exist on CPU
        "actor_rollout_ref.model.use_remove_padding": False,
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        # vLLM-CPU: no sleep mode, eager only, no chunked prefill with per-request seeds
        "+actor_rollout_ref.rollout.enable_sleep_mode": False,
        "actor_rollout_ref.rollout.free_cache_engine": False,
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.enable_chunked_prefill": False,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    }


def build_overrides(cfg: Config) -> list[str]:
    """The ``main_ppo`` overrides for RL from ``rl.init`` / ``rl.init_run`` (:func:`common.paths.rl_start`)."""
    keys = _trainer_keys(cfg)
    if cfg.profile.device == "cpu":
        keys.update(_cpu_keys(cfg))
    user_keys = {override_key(key) for key in cfg.rl.verl_overrides}
    overrides = [f"{key}={format_value(value)}" for key, value in keys.items() if override_key(key) not in user_keys]
    overrides += [f"{key}={value}" for key, value in cfg.rl.verl_overrides.items()]
    return overrides


def build_command(cfg: Config) -> list[str]:
    """The full argv: ``<python> -m verl.trainer.main_ppo <overrides>`` (what the dry run prints, what rl.train runs)."""
    return [sys.executable, "-m", MAIN_PPO_MODULE, *build_overrides(cfg)]


def verl_env(cfg: Config) -> dict[str, str]:
    """Environment variables the verl process needs on top of the caller's (CPU profile: the plugin, vLLM-CPU, and
    Ray workers at the caller's priority: Ray starts them at nice 15, so on a CPU shared with an SFT run beside it
    the actor and rollout starve; a 2-core demo took 8 minutes to start vLLM that way; and no idle workers prestarted
    for the first driver: verl's actors each start their own, so Ray's prestarted ones only idle, 80-130 MiB each), and
    the CPU kernel pins of ``profile.cpu_isa`` for every Ray worker (common/numerics.py)."""
    env = {"WANDB_MODE": cfg.logging.wandb_mode, "WANDB_RUN_GROUP": cfg.experiment.name,
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if cfg.profile.device == "cpu":
        env.update({"VERL_PLATFORM": "cpu", "VLLM_TARGET_DEVICE": "cpu",
                    "VLLM_CPU_KVCACHE_SPACE": str(CPU_VLLM_KV_CACHE_GB), **CPU_OPENMP_ENV,
                    "OMP_NUM_THREADS": str(cfg.profile.num_threads), "RAY_worker_niceness": "0",
                    "RAY_prestart_worker_first_driver": "0"})
    pinned_kernels_env(env, cfg.profile.device, cfg.profile.cpu_isa)
    return env


# ------------------------------------------------------------------------------ validation against verl
def compose_verl_config(overrides: list[str]):
    """verl's own ``ppo_trainer`` config composed with ``overrides`` and resolved (Hydra errors name a bad key)."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    global_hydra = GlobalHydra.instance()
    outer = global_hydra.hydra if global_hydra.is_initialized() else None
    global_hydra.clear()  # compose against verl's config dir, then give an enclosing Hydra app its state back
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            verl_cfg = compose(config_name="ppo_trainer", overrides=list(overrides))
    finally:
        global_hydra.clear()
        if outer is not None:
            global_hydra.initialize(outer)
    OmegaConf.resolve(verl_cfg)
    return verl_cfg


def validate_with_verl(overrides: list[str]):
    """Runs the checks ``main_ppo`` runs before training, without Ray or a model; returns the composed config.

    Composition (unknown keys), ``validate_config`` (batch arithmetic), the typed algorithm/actor/rollout
    dataclasses (value checks), the advantage and policy-loss registries, the reward manager registry, and
    loading our reward function through verl's own loader.
    """
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    verl_cfg = compose_verl_config(overrides)
    validate_config(config=verl_cfg, use_reference_policy=need_reference_policy(verl_cfg),
                    use_critic=need_critic(verl_cfg))
    omega_conf_to_dataclass(verl_cfg.algorithm)
    omega_conf_to_dataclass(verl_cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(verl_cfg.actor_rollout_ref.rollout)
    core_algos.get_adv_estimator_fn(verl_cfg.algorithm.adv_estimator)
    core_algos.get_policy_loss_fn(verl_cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    if verl_cfg.reward.reward_manager.name not in REWARD_MANAGER:
        raise ValueError(f"reward.reward_manager.name={verl_cfg.reward.reward_manager.name!r} is not one of "
                         f"{sorted(REWARD_MANAGER)}")
    if get_custom_reward_fn(verl_cfg) is None:
        raise ValueError("reward.custom_reward_function.path is not set")
    return verl_cfg
