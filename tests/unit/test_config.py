"""Hydra composition and validation: every experiment composes on both profiles; errors name the key."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from common.config import CONF_DIR, ConfigError, compose, compose_dict
from common.config.sft import SFT_METHOD_SCHEMAS

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
METHOD_PRESETS = sorted(p.stem for p in (CONF_DIR / "sft" / "method").glob("*.yaml"))
REQUIRED = {"own_data": ["data.path=rows.jsonl"]}
"""The overrides an experiment cannot compose without (its YAML leaves them ``???``)."""


@pytest.mark.parametrize("profile", ["toy", "paper"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment, profile):
    chosen = [f"experiment={experiment}", f"profile={profile}", *REQUIRED.get(experiment, [])]
    if profile not in compose([chosen[0], *chosen[2:]]).experiment.profiles:
        # Issue 30.4: `experiment=forking profile=paper` quietly planned the toy world's arms on Qwen3.
        with pytest.raises(ConfigError, match=rf"experiment={experiment} is meant for profile=toy "
                                              rf"\(experiment.profiles\); got profile={profile}: .*any_profile=true"):
            compose(chosen)
        cfg = compose([*chosen, "experiment.any_profile=true"])
    else:
        cfg = compose(chosen)
    assert cfg.experiment.name == experiment
    assert cfg.profile.name == profile


def test_the_toy_world_experiments_are_meant_for_the_toy_profile_only():
    assert {name: compose([f"experiment={name}", *REQUIRED.get(name, [])]).experiment.profiles
            for name in EXPERIMENTS} == {
        "ablations": ["toy", "paper"], "bfcl": ["toy", "paper"], "demo": ["toy"], "forking": ["toy"],
        "own_data": ["toy"], "table1": ["toy", "paper"], "table2": ["toy", "paper"], "toy_rl": ["toy"]}


@pytest.mark.parametrize("preset", METHOD_PRESETS)
def test_every_method_preset_composes(preset):
    cfg = compose([f"sft/method={preset}"])
    assert cfg.sft.method.name in SFT_METHOD_SCHEMAS


def test_paper_profile_values():
    cfg = compose(["profile=paper", "experiment=table1"])
    assert cfg.profile.models == ["qwen3_4b", "qwen3_8b"]
    assert cfg.model.path == "Qwen/Qwen3-4B"
    assert (cfg.sft.lr, cfg.sft.betas, cfg.sft.grad_accum, cfg.sft.epochs) == (1e-5, [0.9, 0.95], 8, 8)
    assert cfg.data.max_length == 20000 and cfg.data.num_sft_rows == 3000
    assert (cfg.eval.n, cfg.eval.temperature, cfg.eval.max_tokens) == (32, 1.0, 8192)
    assert sorted(cfg.data.benchmarks) == ["aime24", "aime25", "amc", "hmmt25"]


def test_command_line_choice_beats_profile_default():
    assert compose(["profile=paper", "model=qwen3_8b"]).model.name == "qwen3_8b"


@pytest.mark.parametrize("override, key", [
    ("sft.method.rho=1.5", "sft.method.rho"),
    ("sft.lr=-1", "sft.lr"),
    ("profile.device=tpu", "profile.device"),
    ("sft.loss_norm=per_token", "sft.loss_norm"),
    ("eval.n=0", "eval.n"),
    ("model.gguf_file=x.gguf", "model.gguf_file"),
    ("rl.rollout_n=3", "rl.micro_batch_size_per_gpu"),
    ("data.num_sft_rows=0", "data.num_sft_rows"),
    ("data.strip_leading_think=sometimes", "data.strip_leading_think"),
    ("data.invalid_rows=ignore", "data.invalid_rows"),
    ("data.num_rl_val_rows=-1", "data.num_rl_val_rows"),
    ("toy.slip_rates.chain=1.5", "toy.slip_rates.chain"),
    ("+toy.chat_style_weights.guess=0.1", "toy.chat_style_weights"),
    ("toy.num_kv_heads=3", "toy.num_kv_heads"),
    ("toy.pretrain_seq_len=4096", "toy.pretrain_seq_len"),
    ("report.primary_endpoints.sft=[pass@1]", "report.primary_endpoints.sft"),
    ("report.primary_endpoints.rl_gain=[Toy-Add pass@1]", "report.primary_endpoints.rl_gain"),
    ("+report.primary_endpoints.table3=[Avg pass@1]", "report.primary_endpoints"),
    ("report.primary_arms=[eksft,eksft]", "report.primary_arms"),
    ("report.primary_arms=[no_such_method]", "report.primary_arms"),
    ("eval.rejudge_timeout_s=-1", "eval.rejudge_timeout_s"),
])
def test_invalid_value_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([override])


@pytest.mark.parametrize("override, new", [
    ("eval.table_k=16", "report.table_k=16"), ("eval.analysis.run=[]", "report.analysis.run=[]"),
    ("eval.row_labels.sft=Plain", "report.row_labels.sft=Plain"),
    ("eval.primary_arms=[dft]", "report.primary_arms=[dft]"),
    ("eval.benchmark_labels={toy_add:Add}", "report.benchmark_labels={toy_add:Add}"),
    ("eval.primary_endpoints.rl=[]", "report.primary_endpoints.rl=[]"),
])
def test_a_report_key_under_its_old_eval_name_is_refused_naming_the_new_one(override, new):
    with pytest.raises(ConfigError) as refused:
        compose([override])
    old, moved = override.split("=")[0], new.split("=")[0]
    assert str(refused.value) == f"{old} is now {moved} (the report's settings are report.* keys); write {new}"
    compose([new])


def test_the_report_settings_are_in_the_reports_identity_and_not_the_evaluations(tmp_path):
    from common.grid import report_run
    from common.paths import eval_run

    default = compose([f"experiment.run_root={tmp_path}"])
    changed = compose([f"experiment.run_root={tmp_path}", "report.table_k=8", "report.row_labels.sft=Plain"])
    assert not {"table_k", "row_labels", "analysis", "primary_endpoints"} & set(vars(default.eval))
    assert eval_run(default, "sft", "base", "toy_add", None).directory == \
        eval_run(changed, "sft", "base", "toy_add", None).directory
    assert report_run(default).config["report"]["table_k"] == 32
    assert report_run(default).config_hash != report_run(changed).config_hash


@pytest.mark.parametrize("override, key", [("+sft.lr_rate=0.1", "sft.lr_rate"), ("+sft.method.rhoo=0.1", "sft.method.rhoo"),
                                           ("+unknown.key=1", "unknown")])
def test_unknown_keys_added_with_plus_are_refused(override, key):
    # Issue 10.5: '+' added keys to the struct config that nothing read.
    with pytest.raises(ConfigError, match=f"unknown config key {key.replace('.', '[.]')}"):
        compose([override])


@pytest.mark.parametrize("override", ["experiment.name=..", "experiment.name=a/b", "experiment.name=.hidden",
                                      "model.name=../x", "eval.variant=a..b"])
def test_names_that_become_folders_are_restricted(override):
    # Issue 10.6: experiment.name=.. wrote data files into the repository's data/ package.
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", "[.]")):
        compose([override])


def hydra_composition(overrides: list[str]):
    """Hydra's own composition of every override at once (what ``compose_dict`` splits into choices and values)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("overrides", [
    [],
    ["sft.lr=2e-5", "profile=paper", "sft/method=eksft_rho01", "sft.method.lambda_kl=0.5"],
    ["experiment=forking", "toy.world=forking", "experiment.seeds=[0,1]", "rl/algorithm=gspo",
     "report.primary_endpoints={sft:[],rl:[],rl_gain:[]}", "+extra.key=1", "++sft.lr=3e-5"],
    ["model=qwen3_8b", "profile=paper", "model.path=/models/q", "~toy"],
    ["~sft.lr=1e-5"],
    ["sft.no_such_key=1"],
    ["+sft.lr=1e-5"],
    ["sft/method=eksft", "sft.method=psft"],
])
def test_composition_equals_hydras_with_the_choices_composed_once(overrides):
    def outcome(compose_function):
        try:
            cfg = compose_function(overrides)
        except Exception as error:  # the same refusal, word for word
            return type(error), str(error)
        return OmegaConf.to_container(cfg), OmegaConf.is_struct(cfg)

    expected = outcome(hydra_composition)
    assert outcome(compose_dict) == expected
    if isinstance(expected[0], dict):  # a changed result does not reach the next composition of the same choices
        compose_dict(overrides).sft.lr = 123.0
        assert outcome(compose_dict) == expected


def test_misspelled_key_fails_at_composition():
    with pytest.raises(Exception, match="sft.method.rhoo"):
        compose(["sft.method.rhoo=0.1"])


def test_unknown_method_lists_the_options():
    with pytest.raises(Exception, match="eksft"):
        compose(["sft/method=no_such_method"])


def test_toy_model_needs_toy_profile():
    with pytest.raises(ConfigError, match="model=toy"):
        compose(["profile=paper", "model=toy"])


def test_a_models_label_comes_from_its_own_config():
    # Issue 43: model.path=Qwen/Qwen3-0.6B ran under qwen3_4b's labels: every folder and the report said Qwen3-4B.
    with pytest.raises(ConfigError) as error:
        compose(["profile=paper", "model.path=Qwen/Qwen3-0.6B"])
    assert str(error.value) == (
        "model.path=Qwen/Qwen3-0.6B is not the model of model.name=qwen3_4b (Qwen3-4B), whose labels its folders and "
        "report would carry; choose its preset where conf/model/qwen3_0_6b.yaml exists: profile.models=[qwen3_0_6b]; "
        "or label it: model.name=qwen3_0_6b model.display_name=Qwen3-0.6B profile.models=[qwen3_0_6b]")
    labelled = compose(["profile=paper", "model.path=Qwen/Qwen3-0.6B", "model.name=qwen3_0_6b",
                        "model.display_name=Qwen3-0.6B", "profile.models=[qwen3_0_6b]"])
    assert (labelled.model.name, labelled.model.display_name) == ("qwen3_0_6b", "Qwen3-0.6B")
    for preset in sorted((CONF_DIR / "model").glob("*.yaml")):  # every preset's label is its own model's
        compose([f"model={preset.stem}", f"profile={'toy' if preset.stem in ('toy', 'smollm2_135m') else 'paper'}"])
    compose(["profile=paper", "model.path=/models/my-local-copy"])  # a local folder: the label is the user's to set


def test_a_run_root_under_a_file_or_not_writable_is_refused_naming_the_key_and_the_fix(tmp_path, monkeypatch):
    # Issue 32.4: such a run root gave a ~20-line traceback from DirectoryLock.__enter__ that never named the key.
    from common import locks
    from common.config import require_writable_run_root

    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError) as refused:
        require_writable_run_root(compose([f"experiment.run_root={tmp_path}/afile/runs"]))
    assert str(refused.value) == (f"experiment.run_root={tmp_path}/afile/runs: {tmp_path}/afile is a file, not a "
                                  "folder; fix: set experiment.run_root to a folder you can write (or fix its "
                                  "permissions)")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = locks.os.access
    monkeypatch.setattr(locks.os, "access", lambda path, mode: real_access(path, mode) and str(path) != str(locked))
    with pytest.raises(ConfigError, match=f"it cannot be created: {locked} is not writable by this user; fix"):
        require_writable_run_root(compose([f"experiment.run_root={locked}/runs"]))
    require_writable_run_root(compose([f"experiment.run_root={tmp_path}/new/runs"]))  # creatable: fine
