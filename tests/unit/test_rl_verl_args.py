"""Config -> verl argv: the paper's DAPO values and user pass-through (verl's own validation of the argv:
tests/integration/test_rl_verl_validation.py)."""
from __future__ import annotations

import re

import pytest

from common.config import ConfigError, compose
from common.paths import data_dir
from rl.verl_args import build_command, build_overrides, format_value, verl_env


def _as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(override.split("=", 1) for override in overrides)


@pytest.fixture(scope="module")
def paper_cfg():
    return compose(["profile=paper", "experiment=table2"])


def test_paper_dapo_values_are_in_the_argv(paper_cfg):
    keys = _as_dict(build_overrides(paper_cfg))
    expected = {
        "actor_rollout_ref.actor.optim.lr": "1e-06",
        "data.train_batch_size": "256",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "32",
        "actor_rollout_ref.rollout.n": "16",
        "trainer.total_training_steps": "200",
        "data.max_response_length": "8192",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2",
        "actor_rollout_ref.actor.clip_ratio_high": "0.28",
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": "false",
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "actor_rollout_ref.actor.grad_clip": "1.0",
        "algorithm.filter_groups.enable": "true",
        "algorithm.filter_groups.metric": "acc",
        "algorithm.filter_groups.max_inflight_gen_batches": "3",
        "reward.reward_manager.name": "dapo",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable": "true",
        "+reward.reward_kwargs.overlong_buffer_cfg.len": "4096",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": "1.0",
        "+reward.reward_kwargs.max_resp_len": "8192",
        "reward.custom_reward_function.name": "compute_score",
        "+reward.custom_reward_function.reward_kwargs.incorrect_score": "-1.0",
        "trainer.n_gpus_per_node": "8",
        "trainer.nnodes": "1",
        "trainer.resume_mode": "auto",
    }
    assert {key: keys.get(key) for key in expected} == expected
    assert keys["reward.custom_reward_function.path"].endswith("/rl/reward.py")
    assert re.search(r"/sft/qwen3_4b/eksft-[0-9a-f]{8}/hf$", keys["actor_rollout_ref.model.path"])
    assert re.search(r"/rl/qwen3_4b/eksft-[0-9a-f]{8}/checkpoints$", keys["trainer.default_local_dir"])
    assert keys["data.train_files"] == str((data_dir(paper_cfg) / "rl.parquet").resolve())
    assert not any(key.startswith("algorithm.filter_groups.max_num_gen_batches") for key in keys)
    # the CPU embedding is absent on GPUs
    assert "trainer.device" not in keys and "VERL_PLATFORM" not in verl_env(paper_cfg)


def test_base_variant_starts_from_the_hub_model(paper_cfg):
    base = compose(["profile=paper", "experiment=table2", "rl.init=base"])
    assert _as_dict(build_overrides(base))["actor_rollout_ref.model.path"] == "Qwen/Qwen3-4B"


def test_command_is_main_ppo_plus_overrides(paper_cfg):
    command = build_command(paper_cfg)
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert command[3:] == build_overrides(paper_cfg)


def test_toy_profile_adds_the_cpu_embedding():
    cfg = compose(["profile=toy"])
    keys = _as_dict(build_overrides(cfg))
    assert keys["trainer.device"] == "cpu"
    assert keys["+ray_kwargs.ray_init.num_gpus"] == "1"
    assert keys["+actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert keys["actor_rollout_ref.rollout.enforce_eager"] == "true"
    assert verl_env(cfg)["VERL_PLATFORM"] == "cpu"
    # Ray would start the actor and rollout workers at nice +15 (measured: a driver at nice 5 got workers at 19)
    assert verl_env(cfg)["RAY_worker_niceness"] == "0"
    # verl's actors never reuse the idle workers Ray prestarts for the first driver (measured: 4 per DAPO run)
    assert verl_env(cfg)["RAY_prestart_worker_first_driver"] == "0"


@pytest.mark.parametrize("profile, verl_precision, dtype", [("paper", "bf16", "bfloat16"), ("toy", "fp32", "float32")])
def test_actor_reference_and_rollout_compute_in_the_model_dtype(profile, verl_precision, dtype):
    """verl's default is bf16 everywhere; the toy model is float32 (bf16 is emulated on CPUs without it)."""
    keys = _as_dict(build_overrides(compose([f"profile={profile}"])))
    for role in ("actor", "ref"):
        assert keys[f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision"] == f"{{param_dtype:{verl_precision}}}"
    assert keys["actor_rollout_ref.rollout.dtype"] == dtype


@pytest.mark.parametrize("profile, attention", [("paper", "sdpa"), ("toy", "sdpa")])
def test_attention_is_ours_on_every_profile(profile, attention):
    """verl's actor/ref default to flash_attention_2 (the flash-attn package); the model config decides instead."""
    keys = _as_dict(build_overrides(compose([f"profile={profile}"])))
    assert keys["+actor_rollout_ref.model.override_config.attn_implementation"] == attention
    flash = compose(["profile=paper", "model.attn_implementation=flash_attention_2"])
    assert _as_dict(build_overrides(flash))[
        "+actor_rollout_ref.model.override_config.attn_implementation"] == "flash_attention_2"


def test_verl_output_and_wandb_follow_our_run_folder_and_logging(paper_cfg):
    cfg = compose(["profile=paper", "experiment=table2", "logging.wandb_project=my_project",
                   "logging.wandb_mode=offline"])
    keys = _as_dict(build_overrides(cfg))
    assert re.search(r"/rl/qwen3_4b/eksft-[0-9a-f]{8}/verl_hydra$", keys["hydra.run.dir"])
    assert keys["hydra.run.dir"].startswith("/")
    assert keys["trainer.project_name"] == "my_project"
    assert keys["trainer.logger"] == "[console,file,wandb]"
    assert verl_env(cfg)["WANDB_RUN_GROUP"] == "table2"


def test_user_overrides_pass_through_and_win():
    # the command-line form; keys with a '+' (not in verl's schema) go in YAML
    cfg = compose(["profile=paper", "+rl.verl_overrides={actor_rollout_ref.actor.clip_ratio_high:0.3,"
                                    "trainer.val_only:true}"])
    cfg.rl.verl_overrides["+reward.reward_kwargs.max_resp_len"] = "4096"
    overrides = build_overrides(cfg)
    assert overrides[-3:] == ["actor_rollout_ref.actor.clip_ratio_high=0.3", "trainer.val_only=True",
                              "+reward.reward_kwargs.max_resp_len=4096"]
    # ours for the same keys are gone (one value per key, the user's)
    assert [o for o in overrides if o.startswith("actor_rollout_ref.actor.clip_ratio_high=")] == [
        "actor_rollout_ref.actor.clip_ratio_high=0.3"]
    assert [o for o in overrides if "reward_kwargs.max_resp_len" in o] == ["+reward.reward_kwargs.max_resp_len=4096"]


def test_format_value():
    assert [format_value(v) for v in (True, 3, 1e-6, ["console", "file"], "a b", "plain/path", {"a": "bf16", "b": 1})] \
        == ["true", "3", "1e-06", "[console,file]", "'a b'", "plain/path", "{a:bf16,b:1}"]


@pytest.mark.parametrize("override, key", [("rl.clip_ratio_c=1.0", "rl.clip_ratio_c"),
                                           ("rl.ppo_mini_batch_size=48", "rl.ppo_mini_batch_size"),
                                           ("rl.overlong_buffer_len=9000", "rl.overlong_buffer_len"),
                                           ("rl.reward_style=signed", "rl.reward_style"),
                                           ("rl.init=a/b", "rl.init")])
def test_bad_rl_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose(["profile=paper", override])


def lora_sft_run(folder, lora: dict | None):
    """A complete SFT run folder whose manifest records ``sft.lora`` (None: a full fine-tuning run)."""
    from common.manifest import stage_run

    with stage_run(folder, stage="sft", variant="eksft", config={"sft": {"lora": lora} if lora else {}},
                   announce=lambda message: None):
        pass
    return folder


LORA_RUN = {"enabled": True, "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def test_rl_from_a_lora_sft_run_starts_from_its_merged_export_by_default(tmp_path):
    run = lora_sft_run(tmp_path / "sft", LORA_RUN)
    keys = dict(o.split("=", 1) for o in build_overrides(compose(["profile=toy", f"rl.init_run={run}"])))
    assert keys["actor_rollout_ref.model.path"] == str(run / "hf")
    assert not any("lora" in key or "target_modules" in key for key in keys)


def test_rl_init_lora_adapter_gives_verl_the_runs_adapter_on_the_base_model(tmp_path):
    run = lora_sft_run(tmp_path / "sft", LORA_RUN)
    cfg = compose(["profile=toy", f"rl.init_run={run}", "rl.init_lora=adapter", f"model.path={tmp_path}/base",
                   "model.source=hub"])
    keys = dict(o.split("=", 1) for o in build_overrides(cfg))
    assert keys["actor_rollout_ref.model.path"] == str(tmp_path / "base")
    assert keys["actor_rollout_ref.model.lora_adapter_path"] == str(run / "adapter")
    assert (keys["actor_rollout_ref.model.lora_rank"], keys["actor_rollout_ref.model.lora_alpha"],
            keys["actor_rollout_ref.model.target_modules"]) == ("4", "8", "[q_proj,v_proj]")
    # vLLM's LoRA on the adapter's modules only, not on the (tied) embedding (tests/e2e/test_rl_lora_rollout.py)
    assert keys["+actor_rollout_ref.rollout.engine_kwargs.vllm.lora_target_modules"] == "[q_proj,v_proj]"


def test_rl_init_lora_adapter_from_a_full_fine_tuning_run_is_refused_naming_the_key(tmp_path):
    run = lora_sft_run(tmp_path / "sft", None)
    with pytest.raises(ConfigError, match=r"^rl.init_lora=adapter: .* is no LoRA SFT run .*rl.init_lora=merged"):
        build_overrides(compose(["profile=toy", f"rl.init_run={run}", "rl.init_lora=adapter"]))


def test_rl_init_lora_adapter_is_planned_from_the_sft_config_before_the_sft_run_exists(tmp_path):
    """The plan builds every command first: the SFT run's LoRA settings come from the config it is composed with."""
    overrides = ["profile=toy", f"experiment.run_root={tmp_path}", "rl.init_lora=adapter", "sft.lora.rank=8"]
    keys = dict(o.split("=", 1) for o in build_overrides(compose([*overrides, "sft.lora.enabled=true"])))
    assert keys["actor_rollout_ref.model.lora_rank"] == "8"
    assert keys["actor_rollout_ref.model.lora_adapter_path"].startswith(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^rl.init_lora=adapter: .* is no LoRA SFT run"):
        build_overrides(compose(overrides))
