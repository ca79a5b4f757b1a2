"""The orchestrator: the plan an experiment expands to, skipping finished commands, stopping on failure."""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

from common.config import ConfigError, compose, require_writable_run_root
from pipeline.launch import StageFailed, is_done, run_command
from common.locks import DirectoryLock
from common.manifest import Manifest, invalidate, read_manifest, stage_run, write_manifest
from common.paths import RunSpec, eval_dir, experiment_dir, sft_dir, sft_run
from common.preflight import estimate_bytes
from eval.run import run as eval_run
from eval.stage import result_lines
from pipeline.run import critical_path_lengths, execute, run, stage_overrides, status_line
from pipeline.stages import StageCommand, build_plan


def test_table1_plan_covers_models_methods_and_benchmarks():
    cfg = compose(["experiment=table1", "profile=paper"])
    plan = build_plan(cfg, ["experiment=table1", "profile=paper"])
    names = [c.name for c in plan]
    assert names[0] == "data" and names[-1] == "report"
    for model in ("qwen3_4b", "qwen3_8b"):
        for method in ("sft", "dft", "iwsft", "psft", "eksft"):
            assert f"sft/{model}/{method}" in names
            assert f"eval/{model}/sft/{method}" in names
        assert f"eval/{model}/sft/base" in names
    sft = next(c for c in plan if c.name == "sft/qwen3_8b/eksft")
    assert "--nproc_per_node=8" in sft.argv and "sft/method=eksft" in sft.argv and "model=qwen3_8b" in sft.argv
    evals = [c for c in plan if c.stage == "eval_sft"]
    assert all(c.settings["sampling"]["n"] == 32 and len(c.manifest_dirs) == 4 for c in evals)


def test_toy_plan_pretrains_the_base_model_first():
    cfg = compose(["experiment=table1", "profile=toy"])
    stages = [c.name for c in build_plan(cfg, [])]
    assert stages.index("base/toy") < stages.index("tokenize/toy") < stages.index("sft/toy/sft")


def test_sweep_points_get_their_own_folders():
    cfg = compose(["experiment=table1", "experiment.methods=[eksft]", "sft.method.rho=0.1"])
    names = [c.name for c in build_plan(cfg, ["sft.method.rho=0.1"])]
    assert "sft/toy/eksft_rho0.1" in names


def test_overrides_the_plan_owns_are_refused_with_a_hint():
    with pytest.raises(ConfigError, match="profile.models"):
        stage_overrides(["model=qwen3_8b"])
    assert stage_overrides(["dry_run=true", "sft.lr=1e-4", "hydra.verbose=true"]) == ["sft.lr=1e-4"]


def _fake_stage(tmp_path, body: str, name: str = "stage", needs: tuple[str, ...] = ()) -> StageCommand:
    """A stage command running ``body`` under the run contract; it reads the folders of the commands it needs."""
    inputs = {need: tmp_path / need for need in needs}
    script = ("import sys, time; from common.manifest import stage_run\n"
              f"with stage_run(r'{tmp_path / name}', stage='x', variant='{name}', config={{}}, "
              f"inputs={{k: r'{tmp_path}/' + k for k in {list(needs)!r}}}) as run:\n"
              f"    if run is not None:\n"
              f"        {body}\n")
    spec = RunSpec("x", name, tmp_path / name, {}, inputs)
    return StageCommand("x", name, [sys.executable, "-c", script], [spec], compose([]), needs=list(needs))


def _timed_stage(tmp_path, name: str, seconds: float, needs: tuple[str, ...] = ()) -> StageCommand:
    """A stage that sleeps and records when it ran in ``<name>.json``."""
    body = (f"start = time.time(); time.sleep({seconds}); "
            f"open(r'{tmp_path / name}.json', 'w').write(repr([start, time.time()]))")
    return _fake_stage(tmp_path, body, name, needs)


def _span(tmp_path, name: str) -> tuple[float, float]:
    return tuple(json.loads((tmp_path / f"{name}.json").read_text()))


EVERY_STAGE = ["experiment=table2", "profile=toy", "experiment.stages=[data,base,sft,eval_sft,rl,eval_rl,report]"]
"""The toy first wave through every stage: six SFT methods, DAPO from the base model and each of them."""


def test_plan_needs_point_at_the_producers():
    cfg = compose(EVERY_STAGE)
    plan = {c.name: c for c in build_plan(cfg, EVERY_STAGE)}
    assert plan["tokenize/toy"].needs == ["data", "base/toy"]
    assert plan["rl/toy/eksft"].needs == ["sft/toy/eksft"]
    assert plan["rl/toy/base"].needs == ["data", "base/toy"]
    assert plan["eval/toy/rl/eksft"].needs == ["data", "rl/toy/eksft"]
    assert set(plan["report"].needs) == set(plan) - {"report"}
    only_eval = {c.name: c for c in build_plan(compose([*EVERY_STAGE, "experiment.stages=[eval_sft]"]), [])}
    assert all(c.needs == [] for c in only_eval.values())  # producers outside the plan are not waited for


def test_longest_chain_goes_first():
    cfg = compose(EVERY_STAGE)
    chain = critical_path_lengths(build_plan(cfg, EVERY_STAGE))
    assert chain["sft/toy/sft"] > chain["rl/toy/base"] > chain["eval/toy/sft/base"]
    assert chain["report"] == 1 and chain["base/toy"] > chain["tokenize/toy"]


def test_parallel_slots_overlap_independent_commands_and_wait_for_needs(tmp_path):
    first = _timed_stage(tmp_path, "first", 1.0)
    second = _timed_stage(tmp_path, "second", 1.0)
    after_first = _timed_stage(tmp_path, "after_first", 0.1, needs=("first",))
    assert execute([first, second, after_first], parallel=2) is None
    assert _span(tmp_path, "first")[0] < _span(tmp_path, "second")[1]  # ran at the same time
    assert _span(tmp_path, "after_first")[0] >= _span(tmp_path, "first")[1]
    assert all(is_done(c) for c in (first, second, after_first))


def test_failure_lets_running_commands_finish_and_starts_nothing_new(tmp_path):
    failing = _fake_stage(tmp_path, "raise ValueError('bad row 7')", "failing")
    slow = _timed_stage(tmp_path, "slow", 1.0)
    later = _timed_stage(tmp_path, "later", 0.1, needs=("slow",))
    failure = execute([failing, slow, later], parallel=2)
    assert isinstance(failure, StageFailed) and "bad row 7" in str(failure)
    assert is_done(slow) and not (tmp_path / "later.json").exists()


def test_finished_command_is_skipped_until_its_run_changes(tmp_path):
    command = _fake_stage(tmp_path, "pass")
    assert not is_done(command)
    run_command(command)
    assert is_done(command)
    manifest = read_manifest(tmp_path / "stage")
    manifest.config_hash = "0" * 16  # as if its config had changed
    write_manifest(tmp_path / "stage", manifest)
    assert not is_done(command)


def _runs(tmp_path, name):
    return len((tmp_path / f"{name}.count").read_text()) if (tmp_path / f"{name}.count").exists() else 0


def _counted_stage(tmp_path, name, needs=()):
    return _fake_stage(tmp_path, f"open(r'{tmp_path / name}.count', 'a').write('x')", name, needs)


def test_an_upstream_rerun_reruns_downstream_and_nothing_else(tmp_path):
    # Issue 10.1: after SFT was retrained, the orchestrator skipped its evaluation and the report.
    plan = [_counted_stage(tmp_path, "sft"), _counted_stage(tmp_path, "other"),
            _counted_stage(tmp_path, "eval", needs=("sft",)), _counted_stage(tmp_path, "report", needs=("eval",))]
    assert execute(plan, parallel=1) is None
    assert execute(plan, parallel=1) is None  # everything current: nothing runs again
    assert [_runs(tmp_path, n) for n in ("sft", "other", "eval", "report")] == [1, 1, 1, 1]
    assert execute(plan, parallel=1, force=["sft"]) is None
    assert [_runs(tmp_path, n) for n in ("sft", "other", "eval", "report")] == [2, 1, 2, 2]


def test_an_upstream_rerun_outside_the_orchestrator_is_seen(tmp_path):
    plan = [_counted_stage(tmp_path, "sft"), _counted_stage(tmp_path, "eval", needs=("sft",))]
    assert execute(plan, parallel=1) is None
    invalidate(tmp_path / "sft", "deleted and retrained by hand")
    run_command(plan[0])
    assert not is_done(plan[1])
    assert execute(plan, parallel=1) is None and _runs(tmp_path, "eval") == 2


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_stops_every_child_process_group(tmp_path, sigint):
    # Issue 10.6: SIGTERM to the orchestrator left its children training. "ignored": an orchestrator started as a
    # background job of a non-interactive shell (`nohup make demo &`, a CI runner) inherits SIGINT ignored, and its
    # stages inherited that too, so the SIGINT that lets a stage record its state did nothing: 30 s later SIGKILL
    # left the manifest "running" (seen as a flaky test when the suite ran in the background).
    child = _fake_stage(tmp_path, f"import os; open(r'{tmp_path}/pid', 'w').write(str(os.getpid())); "
                                  "time.sleep(600)", "sleeper")
    script = ("import pickle, signal, sys; from pipeline.run import execute\n"
              "from common.processes import termination_signals_interrupt\n"
              + ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if sigint == "ignored" else "")
              + f"plan = pickle.load(open(r'{tmp_path}/plan.pkl', 'rb'))\n"
              "with termination_signals_interrupt():\n    execute(plan, 1)\n")
    (tmp_path / "plan.pkl").write_bytes(pickle.dumps([child]))
    orchestrator = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not (tmp_path / "pid").exists() and time.time() < deadline:
        time.sleep(0.2)
    pid = int((tmp_path / "pid").read_text())
    orchestrator.send_signal(signal.SIGTERM)
    orchestrator.wait(timeout=60)
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # the child is gone (or a zombie of an exited parent) within seconds
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split()[2] == "Z":
                    raise ProcessLookupError
            time.sleep(0.1)
    assert read_manifest(tmp_path / "sleeper").status == "interrupted"


def test_a_second_orchestrator_on_the_same_experiment_fails_fast(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment=demo", "experiment.stages=[data]"])
    with DirectoryLock(experiment_dir(cfg), "first orchestrator"):
        holder = subprocess.run([sys.executable, "-m", "pipeline.run", f"experiment.run_root={tmp_path}",
                                 "experiment=demo", "experiment.stages=[data]"], capture_output=True, text=True,
                                timeout=120)
    assert holder.returncode != 0
    assert f"PID {os.getpid()} on host" in holder.stderr and "first orchestrator" in holder.stderr


def test_seeds_and_other_settings_get_their_own_folders():
    # Issue 10.2: seed=1 (or sft.lr, sft.epochs) wrote into the seed=0 folder and deleted its checkpoints.
    folders = {sft_dir(compose(overrides)) for overrides in
               ([], ["seed=1"], ["sft.lr=0.00123"], ["sft.epochs=7"], ["sft.checkpoint_every=5"])}
    assert len(folders) == 4  # the checkpoint cadence supervises; it does not change the computation
    plan = build_plan(compose([*EVERY_STAGE, "experiment.seeds=[0,1]"]), [])
    sft = [c for c in plan if c.name.startswith("sft/toy/eksft/")]
    assert [c.name for c in sft] == ["sft/toy/eksft/seed0", "sft/toy/eksft/seed1"]
    assert sft[0].manifest_dirs != sft[1].manifest_dirs and "seed=1" in sft[1].argv
    evals = {c.manifest_dirs[0] for c in plan if c.stage == "eval_sft"}
    assert len(evals) == 2 * 7  # base + 6 methods, per seed
    with pytest.raises(ConfigError, match="experiment.seeds"):
        stage_overrides(["seed=3"], per_seed=True)


def test_failed_stage_reports_its_reason(tmp_path):
    command = _fake_stage(tmp_path, "raise ValueError('row 3: field target missing')")
    with pytest.raises(StageFailed, match="row 3: field target missing"):
        run_command(command)
    assert (tmp_path / "stage" / "launch.log").exists()
    assert not is_done(command)


def test_sweep_preset_stays_with_the_orchestrator():
    kept = stage_overrides(["+sweep=eksft_rho", "sft.method.rho=0.3"], methods=["eksft"])
    assert kept == ["experiment.methods=[eksft]", "sft.method.rho=0.3"]


def test_status_shows_the_latest_progress_bar_of_each_running_command(tmp_path):
    command = _fake_stage(tmp_path, "pass", "rl")
    command.record_dir.mkdir(parents=True)
    (command.record_dir / "launch.log").write_text("$ python -m rl.train\nrl/sft:  12%| 1/8 [00:40<04:40]\r"
                                                    "rl/sft:  25%| 2/8 [00:52<02:36]\r")
    line = status_line([command], finished=3, total=27, elapsed_s=600)
    assert line == "[3/27 done, 10.0 min] rl: rl/sft:  25%| 2/8 [00:52<02:36]"


def test_table2_trains_in_table1_so_its_sft_runs_are_reused():
    # Issue 13: Table 2 retrained every SFT model into runs/table2/sft.
    sft_runs = {}
    for experiment in ("table1", "table2"):
        overrides = [f"experiment={experiment}", "profile=paper"]
        plan = build_plan(compose(overrides), overrides)
        sft_runs[experiment] = {c.name: c.manifest_dirs for c in plan if c.stage in ("data", "base", "sft")}
    assert sft_runs["table2"] == sft_runs["table1"] and len(sft_runs["table1"]) == 1 + 2 + 2 * 6
    assert all("/table1/" in str(d) for dirs in sft_runs["table2"].values() for d in dirs)


def test_dry_run_says_which_commands_are_done(tmp_path, capsys):
    overrides = [f"experiment.run_root={tmp_path}", "experiment.stages=[data]", "dry_run=true"]
    cfg = compose(overrides)
    run(cfg, [])
    assert "(would run) [data] data" in capsys.readouterr().out
    spec = build_plan(cfg, [])[0].runs[0]
    with stage_run(spec.directory, stage="data", variant=spec.variant, config=spec.config, inputs=spec.inputs,
                   announce=lambda _: None):
        pass
    run(cfg, [])
    assert "(done, would be skipped) [data] data" in capsys.readouterr().out


def test_the_paper_dry_run_prints_the_preflights_disk_estimate(tmp_path, capsys):
    """Issue 43.5: the paper dry run said nothing of what the run would need; the preflight's disk estimate (Qwen3-4B
    and -8B sized from their names when not cached) is printed, and the toy dry run prints none (its models are
    not hub models)."""
    overrides = ["experiment=table1", "profile=paper", f"experiment.run_root={tmp_path}", "dry_run=true"]
    plan = run(compose(overrides), stage_overrides(overrides))
    needed = estimate_bytes(plan)
    assert needed["run_root"] > 1e12
    assert (f"disk: the pending commands write about {needed['run_root'] / 1e9:.0f} GB under experiment.run_root and "
            f"{needed['hf_cache'] / 1e9:.0f} GB into the HF cache") in capsys.readouterr().out
    run(compose(overrides[2:]), [])
    assert "disk:" not in capsys.readouterr().out
    one_gpu = [*overrides, "profile.models=[qwen3_0_6b]", "profile.nproc_per_node=1", "sft.grad_accum=64"]
    needed = estimate_bytes(build_plan(compose(one_gpu), stage_overrides(one_gpu)))
    assert needed["hf_cache"] in (0, 0.6e9 * 2)  # the data stage's config names the profile's Qwen3-4B: not counted


def test_multi_node_sft_is_one_command_per_node_started_by_srun_with_the_run_as_rendezvous_id(tmp_path, capsys):
    # Issue 13: the rendezvous id was the literal "${RDZV_ID:-eksft}" (os.path.expandvars has no defaults), shared by
    # every run; nothing started the other nodes.
    overrides = ["experiment=table1", "profile=paper", "profile.nnodes=2", f"experiment.run_root={tmp_path}",
                 "dry_run=true"]
    plan = run(compose(overrides), stage_overrides(overrides))
    shown = capsys.readouterr().out
    sft = [c for c in plan if c.stage == "sft"]
    assert len(sft) == 2 * 6
    for command in sft:
        run_name = sft_run(command.config).directory.name
        launcher, per_node = command.argv[:5], command.argv[5:]
        assert launcher == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        assert per_node[1:9] == ["-m", "torch.distributed.run", "--nproc_per_node=8", "--nnodes=2",
                                 "--rdzv_backend=c10d", "--rdzv_endpoint=${MASTER_ADDR}:${MASTER_PORT}",
                                 f"--rdzv_id={run_name}", "-m"]
        assert not any("node_rank" in arg for arg in per_node)  # c10d numbers the nodes: the same command on each
        assert f"--rdzv_id={run_name} -m sft.train" in shown
    assert len({sft_run(c.config).directory.name for c in sft}) == len(sft)  # no two runs share a rendezvous
    single = ["experiment=table1", "profile=paper"]
    one_node = next(c for c in build_plan(compose(single), single) if c.stage == "sft")
    assert one_node.argv[1:5] == ["-m", "torch.distributed.run", "--nproc_per_node=8", "--standalone"]


def test_slurm_env_exports_the_first_node_and_a_port_per_job(tmp_path):
    scontrol = tmp_path / "scontrol"  # Slurm's own expansion of a node list, one host per line
    scontrol.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    scontrol.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242"}
    script = "source scripts/slurm_env.sh && echo $MASTER_ADDR:$MASTER_PORT"
    shown = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert shown.strip() == f"gpu07:{20000 + 4242 % 10000}"
    kept = subprocess.run(["bash", "-c", script], env={**env, "MASTER_PORT": "29400"}, capture_output=True, text=True)
    assert kept.stdout.strip() == "gpu07:29400"
    outside = subprocess.run(["bash", "-c", script], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert outside.returncode != 0 and "inside a Slurm job" in outside.stderr


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("entry", ["pipeline.run", "data.prepare"])
def test_an_unusable_run_root_is_one_line_naming_the_key_and_the_fix(tmp_path, entry):
    # Issue 32.4: a run root whose parent is a file (or that is not writable) gave a ~20-line traceback ending in
    # NotADirectoryError / PermissionError from DirectoryLock.__enter__, never naming experiment.run_root.
    (tmp_path / "afile").write_text("")
    result = subprocess.run([sys.executable, "-m", entry, "experiment=demo", "experiment.stages=[data]",
                             f"experiment.run_root={tmp_path}/afile/runs"], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"experiment.run_root={tmp_path}/afile/runs: {tmp_path}/afile is a file, not a folder" in result.stderr
    assert "fix: set experiment.run_root to a folder you can write" in result.stderr


def test_a_run_root_where_even_root_cannot_create_a_folder_is_named_by_its_key():
    # Issue 39, item 4: experiment.run_root=/sys/... passed the permission check as root and ended in 25 lines of
    # PermissionError from the first mkdir, never naming the key.
    with pytest.raises(ConfigError, match=r"^experiment.run_root=/sys/eksft/runs: .*/sys.*; fix: set experiment"):
        require_writable_run_root(compose(["experiment.run_root=/sys/eksft/runs"]))
    assert not os.path.exists("/sys/eksft")


def test_a_data_path_key_that_does_not_exist_is_named_before_the_data_stage_reads_anything(tmp_path):
    result = subprocess.run([sys.executable, "-m", "data.prepare", "experiment=demo", f"experiment.run_root={tmp_path}",
                             f"data.system_prompt_path={tmp_path}/prompt.txt"], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"data.system_prompt_path={tmp_path}/prompt.txt does not exist" in result.stderr
    assert not any(tmp_path.glob("*/data/*/manifest.json"))  # nothing was started


def test_a_force_pattern_that_matches_nothing_fails_in_the_plan_naming_the_valid_ones(tmp_path, capsys):
    # Issue 30.3: force=[sft/toy/eksf] (a typo) and force=[sft/toy/eksft_official] (the folder's label is
    # eksft_compatofficial_code) silently forced nothing; now the dry run and the preflight refuse them.
    for mode in ("dry_run=true", "preflight=true"):
        cfg = compose(["experiment=demo", f"experiment.run_root={tmp_path}", mode, "force=[sft/toy/eksf,rl]"])
        with pytest.raises(ConfigError, match=r"force=\['sft/toy/eksf'\] matches no stage or command") as error:
            run(cfg, [])
        assert "did you mean" in str(error.value) and "sft/toy/eksft" in str(error.value)
        assert "eval/toy/rl/eksft" in str(error.value) and "\n" not in str(error.value)
    assert "preflight: ok" not in capsys.readouterr().out


def test_an_unknown_benchmark_fails_when_the_plan_is_composed_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"eval.benchmarks\[\].*\['toy_fork_small', 'toy_fork_carry', "
                                          r"'toy_fork_plain'\]; got 'toy_ad'"):
        compose(["experiment=demo", "eval.benchmarks=[toy_ad]"])


def test_dry_run_shows_the_evaluation_benchmarks_and_marks_forced_commands(tmp_path, capsys):
    overrides = ["experiment=demo", f"experiment.run_root={tmp_path}", "dry_run=true", "force=[sft/toy/eksft,eval_rl]",
                 "eval.benchmarks=[toy_fork_carry]"]
    run(compose(overrides), [])
    out = capsys.readouterr().out
    assert "evaluation benchmarks: toy_fork_carry\n" in out
    assert "(forced by force=['sft/toy/eksft'], would restart) [sft] sft/toy/eksft" in out
    assert "(forced by force=['eval_rl'], would restart) [eval_rl] eval/toy/rl/eksft" in out
    assert "(would run) [sft] sft/toy/sft" in out
    run(compose(overrides[:3]), [])
    assert ("evaluation benchmarks: toy_fork_small, toy_fork_carry, toy_fork_plain (every one of data.benchmarks"
            in capsys.readouterr().out)


@pytest.mark.parametrize("entry", ["pipeline.run", "eval.run"])
def test_an_own_type_error_is_one_line_without_a_traceback_unless_hydra_full_error(tmp_path, entry):
    # Issue 30.6: ConfigError and friends printed their message under a Hydra traceback.
    argv = [sys.executable, "-m", entry, "experiment=demo", f"experiment.run_root={tmp_path}", "dry_run=true",
            "eval.benchmarks=[toy_ad]"]
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: eval.benchmarks[] (a name from data.benchmarks or data.extra_benchmarks) must be one of "
        "['toy_fork_small', 'toy_fork_carry', 'toy_fork_plain']; got 'toy_ad'"]
    full = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**env, "HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr and "ConfigError" in full.stderr, full.stderr


def test_data_prepare_alone_gives_the_offline_hint_in_seconds(tmp_path):
    # Issue 30.6: offline, `data.prepare experiment=table1 profile=paper` waited 25 s for the hub and raised a raw
    # ConnectionError; it now runs the preflight's data check first (one probe, common.preflight.PROBE_TIMEOUT_S).
    env = {key: value for key, value in os.environ.items() if not key.endswith("_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")  # nothing cached, nothing answers
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "data.prepare", "experiment=table1", "profile=paper",
                             f"experiment.run_root={tmp_path}"], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "data.hub_id=Elliott/Openr1-Math-46k-8192" in result.stderr and "does not answer" in result.stderr
    assert "HF_HUB_OFFLINE=1" in result.stderr and "data=openr1_local" in result.stderr
    assert time.time() - started < 20  # Hydra's start-up and one refused probe, not the hub client's retries
    assert not any(tmp_path.glob("*/data/*/manifest.json"))


def test_every_run_ends_naming_where_its_results_are(tmp_path, monkeypatch, capsys):
    # Issue 30.1: `make demo` ended with "experiment demo complete in 1608 s" and no path.
    cfg = compose(["experiment=demo", f"experiment.run_root={tmp_path}"])
    report = _fake_stage(tmp_path, "pass", "report")
    report.stage = "report"
    monkeypatch.setattr("pipeline.run.require_plan", lambda *args: None)
    for plan, where in (([_fake_stage(tmp_path, "pass", "data")], tmp_path / "demo"),
                        ([report], tmp_path / "demo" / "report" / "report.md")):
        monkeypatch.setattr("pipeline.run.build_plan", lambda *args, plan=plan: plan)
        run(cfg, [])
        assert capsys.readouterr().out.splitlines()[-1].endswith(f" s; results: {where}")
    run(compose(["experiment=demo", f"experiment.run_root={tmp_path}", "dry_run=true"]), [])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"dry run: nothing was started; the run would leave its results in {tmp_path}/demo/report/report.md")


def test_an_evaluation_ends_with_its_headline_numbers_and_metrics_files():
    cfg = compose(["experiment=demo", "eval.variant=base", "eval.benchmarks=[toy_fork_carry,toy_fork_plain]"])
    summary = Manifest(stage="eval_sft", variant="base", status="complete", metrics={
        "toy_fork_carry": {"num_problems": 30, "n": 32, "avg@32": 0.41234, "pass@1": 0.41234, "pass@32": 0.8},
        "toy_fork_plain": {"num_problems": 30, "n": 32, "avg@32": 0.5, "pass@32": 0.9}, "heldout_nll": {"nll": 1.0}})
    assert result_lines(cfg, summary) == [
        f"toy_fork_carry: avg@32 0.412, pass@32 0.800 over 30 problems -> {eval_dir(cfg, 'toy_fork_carry')}/metrics.json",
        f"toy_fork_plain: avg@32 0.500, pass@32 0.900 over 30 problems -> {eval_dir(cfg, 'toy_fork_plain')}/metrics.json"]


def test_a_bfcl_evaluation_ends_with_each_categorys_accuracy_and_metrics_file(monkeypatch, capsys):
    cfg = compose(["experiment=bfcl", "profile=toy", "data=synthetic_tools", "eval.variant=tiny",
                   "eval.model_path=/models/tiny", "eval.benchmarks=[live_simple,live_irrelevance]"])
    summary = Manifest(stage="eval_sft", variant="tiny", status="complete", metrics={
        "live_simple": {"num_problems": 4, "n": 1, "correct": 1, "total": 4, "accuracy": 25.0},
        "live_irrelevance": {"num_problems": 2, "n": 1, "correct": 2, "total": 2, "accuracy": 100.0},
        "bfcl": {"bfcl_live": 25.0, "bfcl_live_total": 4}})
    monkeypatch.setattr("eval.run.run_bfcl", lambda *args: summary)
    monkeypatch.setattr("eval.run.require_stage", lambda *args: None)
    eval_run(cfg)
    assert capsys.readouterr().out.splitlines() == [
        f"results: live_simple: accuracy 25.0% (1/4) over 4 problems -> {eval_dir(cfg, 'live_simple')}/metrics.json",
        f"results: live_irrelevance: accuracy 100.0% (2/2) over 2 problems -> "
        f"{eval_dir(cfg, 'live_irrelevance')}/metrics.json"]
