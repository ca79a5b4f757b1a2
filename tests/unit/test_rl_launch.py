"""rl.train's helpers: phase-timing summary, the step-line pattern, checkpoint markers, eos check, stall watchdog;
stopping verl on SIGTERM, starting it again when Ray's node times out during start-up."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from common.config import compose
from common.models import end_of_turn_token
from common.paths import RL_DISCARDED_GROUPS, RL_GROUPS_KEPT, configured_rl_run
from common.tracking import dapo_groups_kept, read_metrics
from rl import train
from rl.export import LATEST_ITERATION_FILE, latest_checkpoint_step
from rl.verl_args import CHECKPOINT_SUBDIR

REPO = Path(__file__).resolve().parents[2]


def test_summary_keeps_phases_apart_and_later_records_win():
    records = [
        {"step": 0, "val-core/toy/acc/mean@1": 0.25, "timing_s/testing": 4.0},
        {"step": 1, "timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/update_actor": 3.0, "critic/score/mean": -0.5,
         RL_DISCARDED_GROUPS: 48},
        {"step": 2, "timing_s/step": 9.0, "timing_s/gen": 5.0, "timing_s/update_actor": 3.0, "critic/score/mean": 0.0,
         RL_DISCARDED_GROUPS: 100},
        # a resume repeated step 2: this record replaces the one above
        {"step": 2, "timing_s/step": 7.0, "timing_s/gen": 4.0, "timing_s/update_actor": 2.0, "critic/score/mean": 0.5,
         "timing_s/testing": 2.0, "val-core/toy/acc/mean@1": 0.5, RL_DISCARDED_GROUPS: 16},
    ]
    assert RL_GROUPS_KEPT not in train.summarize_metrics(records)  # no group filtering
    summary = train.summarize_metrics(records, filtered_groups_per_step=16)
    assert summary[RL_GROUPS_KEPT] == 32 / (32 + 48 + 16)  # two steps of 16 kept groups
    assert summary["steps_logged"] == 2
    assert (summary["train_score_first"], summary["train_score_last"]) == (-0.5, 0.5)
    assert (summary["val_step"], summary["val-core/toy/acc/mean@1"]) == (2, 0.5)
    assert summary["time_generation_s_total"] == 10.0  # 6 + 4
    assert summary["time_training_s_total"] == 5.0  # 3 + 2
    assert summary["time_validation_s_total"] == 6.0  # 4 (before training) + 2
    assert summary["time_step_s_mean"] == 8.5  # (10 + 7) / 2; validation is not inside a step


def test_groups_kept_counts_a_step_that_logged_no_discards_as_discarding_none():
    records = {0: {RL_DISCARDED_GROUPS: 99}, 1: {RL_DISCARDED_GROUPS: 24}, 2: {"critic/score/mean": 0.1}}
    assert dapo_groups_kept(records, 8) == 16 / (16 + 24)  # step 0 (validation) is not a training step
    assert dapo_groups_kept({0: {}}, 8) is None


def test_progress_bar_note_names_the_reward_and_the_groups_kept():
    cfg = compose(["rl.train_batch_size=16", "rl.ppo_mini_batch_size=16"])
    record = {"critic/score/mean": 0.65625, RL_DISCARDED_GROUPS: 953}
    assert train.step_postfix(record, cfg) == "reward +0.66, groups kept 2%"  # 16 / (16 + 953)
    assert train.step_postfix(record, compose(["rl.filter_groups=false"])) == "reward +0.66"


def test_step_line_pattern_matches_verl_console_lines_behind_ray_prefixes():
    assert train.STEP_LINE.search("\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m step:12 - actor/loss:0.1 - x:2")
    assert train.STEP_LINE.search("step:1 - a:1")
    assert not train.STEP_LINE.search("Training Progress: 50%|█ | 1/2 [00:40<00:40]")


def test_latest_checkpoint_step(tmp_path):
    assert latest_checkpoint_step(tmp_path) == 0
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("24\n")
    assert latest_checkpoint_step(tmp_path) == 24
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("oops")
    with pytest.raises(RuntimeError, match="oops"):
        latest_checkpoint_step(tmp_path)


def test_end_of_turn_token_of_chatml():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, "<unk>")),
                                        unk_token="<unk>", eos_token="<|endoftext|>", chat_template=template,
                                        additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    assert end_of_turn_token(tokenizer) == "<|im_end|>"


class FakeClock:
    """The watchdog's clock, advanced by the test alone: what it decides does not depend on how the machine schedules
    the test (at load 30, sleeps of 0.1 s took over 0.3 s and fired a 0.3 s watchdog during start-up)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_stall_watchdog_counts_any_line_during_start_up_and_only_steps_after_it():
    stalled, clock = threading.Event(), FakeClock()
    watchdog = train.StallWatchdog(3.0, stalled.set, poll_s=0.01, clock=clock)
    for _ in range(8):  # start-up: a line every 1 s keeps it quiet for 8 s, past the 3 s limit
        clock.now += 1.0
        watchdog.saw_line(is_step=False)
    watchdog.saw_line(is_step=True)
    for _ in range(2):
        clock.now += 1.0
        watchdog.saw_line(is_step=False)
    time.sleep(0.05)  # the watchdog polls several times at these clock readings
    assert not stalled.is_set() and not watchdog.fired
    clock.now += 2.0  # after the first step, lines without a new step are no progress: 4 s since the step
    watchdog.saw_line(is_step=False)
    assert stalled.wait(5.0) and watchdog.fired
    off = train.StallWatchdog(0.0, stalled.clear)
    time.sleep(0.1)
    assert not off.fired


def test_stall_timeout_is_not_part_of_the_run_identity():
    quick, patient = compose(["rl.stall_timeout_s=60"]), compose(["rl.stall_timeout_s=6000"])
    assert configured_rl_run(quick) == configured_rl_run(patient)
    assert configured_rl_run(quick).directory != configured_rl_run(compose(["rl.lr=1e-5"])).directory


def test_sigterm_to_the_rl_stage_stops_verl_and_the_workers_it_started(tmp_path):
    # SIGTERM to `python -m rl.train` (a scheduler's time limit, `kill`) ended it without its cleanup, so verl's
    # main_ppo and Ray's workers, each in a session of their own, trained on; the stall path did stop them.
    pids = tmp_path / "pids"
    fake_verl = ("import os, subprocess, sys, time\n"
                 "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
                 "start_new_session=True)\n"
                 f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{worker.pid}}')\n"
                 "time.sleep(600)\n")
    stage_script = ("import sys; from pathlib import Path; from common.config import stage_main; from rl import train\n"
                    f"train.build_command = lambda cfg: [sys.executable, '-c', {fake_verl!r}]\n"
                    f"stage_main(lambda cfg: train.run_verl(cfg, 'sft', Path({str(tmp_path)!r}), 0))()\n")
    stage = subprocess.Popen([sys.executable, "-c", stage_script, "logging.progress=false"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids.exists(), "the fake verl did not start within 180 s"
    started = [psutil.Process(int(pid)) for pid in pids.read_text().split()]
    try:
        stage.send_signal(signal.SIGTERM)
        stage.wait(timeout=60)
        psutil.wait_procs(started, timeout=2 * train.KILL_GRACE_S)
        assert not [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        for process in started:
            if process.is_running():
                process.kill()


def test_a_ray_node_that_times_out_during_start_up_is_started_again(tmp_path, monkeypatch):
    # Two DAPO runs starting together on a loaded 2-core machine: one verl died in ray.init with Ray's fixed 30 s
    # raylet wait, the RL stage failed, and the orchestrator launched nothing more.
    attempts = tmp_path / "attempts"
    fake_verl = ("import pathlib, sys\n"
                 f"attempts = pathlib.Path({str(attempts)!r})\n"
                 "attempts.write_text(attempts.read_text() + 'x' if attempts.exists() else 'x')\n"
                 "if len(attempts.read_text()) == 1:\n"
                 f"    print('Exception: {train.RAY_START_FAILURE}. This could happen ...'); sys.exit(1)\n"
                 f"checkpoints = pathlib.Path({str(tmp_path / CHECKPOINT_SUBDIR)!r})\n"
                 f"checkpoints.mkdir(); (checkpoints / {LATEST_ITERATION_FILE!r}).write_text('32')\n")
    monkeypatch.setattr(train, "build_command", lambda cfg: [sys.executable, "-c", fake_verl])
    cfg = compose(["logging.progress=false"])
    assert train.run_verl_retrying_ray_start(cfg, "sft", tmp_path, 0, pause_s=0.0) == 32
    assert attempts.read_text() == "xx"


def test_other_verl_failures_and_start_up_timeouts_after_a_step_are_not_retried(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for output in ("Exception: CUDA out of memory", f"step:1 - x:1\\nException: {train.RAY_START_FAILURE}"):
        fake_verl = (f"import pathlib, sys; runs = pathlib.Path({str(runs)!r}); "
                     "runs.write_text(runs.read_text() + 'x' if runs.exists() else 'x'); "
                     f"print('{output}'); sys.exit(1)")
        monkeypatch.setattr(train, "build_command", lambda cfg: [sys.executable, "-c", fake_verl])
        with pytest.raises(train.RLError) as failure:
            train.run_verl_retrying_ray_start(compose(["logging.progress=false"]), "sft", tmp_path, 0, pause_s=0.0)
        assert not isinstance(failure.value, train.RayStartFailed)
    assert runs.read_text() == "xx"


def test_workers_ray_killed_for_memory_fail_the_stage_with_the_cause_and_the_fix_first(tmp_path, monkeypatch):
    # Three DAPO runs at once on a 24 GiB machine: Ray's memory monitor killed verl's workers at step 14, and the
    # stage's error showed the last 15 lines of verl's log, a traceback that never said "memory".
    oom = ("ray.exceptions.OutOfMemoryError: 3 worker(s) were killed due to the node running low on memory. Memory on "
           "the node (IP: 192.0.2.2, ID: 8d1b) was 21.90GB used / 23.54GB limit (0.930277)")
    fake_verl = ("import pathlib\n"
                 f"checkpoints = pathlib.Path({str(tmp_path / CHECKPOINT_SUBDIR)!r})\n"
                 f"checkpoints.mkdir(); (checkpoints / {LATEST_ITERATION_FILE!r}).write_text('8')\n"
                 f"print({oom!r})\n"
                 "for _ in range(20): print('  File \"trainer_base.py\", line 1511, in _submit_batch_to_rollout')\n"
                 "raise SystemExit(1)\n")
    _fake_verl(monkeypatch, fake_verl)
    with pytest.raises(train.RLError) as failure:
        train.run_verl(compose(["logging.progress=false"]), "sft", tmp_path, 0)
    assert str(failure.value).startswith(
        "Ray killed verl's workers because the machine ran low on memory (21.90GB used / 23.54GB limit): run fewer "
        "RL runs or other jobs beside this one (experiment.parallel=1); the rerun resumes from the checkpoint of step 8"
        "; last lines of ")


def test_a_dead_vllm_engine_stops_verl_at_once_naming_the_engine(tmp_path, monkeypatch):
    # Issue 42's experiment, paused with SIGSTOP: vLLM's engine core timed out on its shared-memory queue and died; one
    # DAPO run failed with "Sync replay buffer selected terminal groups with no materializable trajectories", the other
    # printed nothing until the stall watchdog (rl.stall_timeout_s=3600) would have stopped it an hour later.
    dead = ("(vLLMHttpServer pid=4796) (EngineCore pid=6461) ERROR 11-27 15:30:37 [core.py:1435] EngineCore "
            "encountered a fatal error.")
    fake_verl = ("import pathlib, time\n"
                 f"checkpoints = pathlib.Path({str(tmp_path / CHECKPOINT_SUBDIR)!r})\n"
                 f"checkpoints.mkdir(); (checkpoints / {LATEST_ITERATION_FILE!r}).write_text('24')\n"
                 f"print({dead!r}, flush=True)\n"
                 "print('(AgentLoopWorkerTQ pid=8279) vllm.v1.engine.exceptions.EngineDeadError', flush=True)\n"
                 "time.sleep(120)\n")  # then exits 0: unless stopped at the fatal line, run_verl does not raise
    _fake_verl(monkeypatch, fake_verl)
    with pytest.raises(train.RLError) as failure:
        train.run_verl(compose(["logging.progress=false", "rl.stall_timeout_s=3600"]), "sft", tmp_path, 0)
    assert str(failure.value).startswith(
        "vLLM's rollout engine died inside verl (\"EngineCore encountered a fatal error\" in verl.log: e.g. killed "
        "for memory, or its processes paused past vLLM's timeouts), so verl was stopped; the rerun resumes from the "
        "checkpoint of step 24; last lines of ")
    from common.processes import owned_processes

    assert owned_processes(train.verl_owner(tmp_path)) == []


class RecordingBar:
    """A progress bar that records what it shows: (steps, note) at each update, and every note."""

    def __init__(self):
        self.n, self.note, self.drawn, self.notes = 0, "", [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_postfix_str(self, note, refresh=True):
        self.note = note
        self.notes.append(note)

    def update(self, steps):
        self.n += steps
        self.drawn.append((self.n, self.note))


def _fake_verl(monkeypatch, script: str) -> RecordingBar:
    bar = RecordingBar()
    monkeypatch.setattr(train, "build_command", lambda cfg: [sys.executable, "-c", script])
    monkeypatch.setattr(train, "progress", lambda **kwargs: bar)
    return bar


def test_progress_bar_shows_each_step_with_that_steps_note(tmp_path, monkeypatch):
    # DFT's seed-1 DAPO run showed at step 25 the note of step 24 (and none on the first step after a resume):
    # the note was set after the bar had drawn the step.
    fake_verl = ("import json, os, pathlib\n"
                 "records = open(os.environ['VERL_FILE_LOGGER_PATH'], 'w')\n"
                 "for step, score in ((1, 0.25), (2, 0.75)):\n"
                 "    records.write(json.dumps({'step': step, 'data': {'critic/score/mean': score}}) + '\\n')\n"
                 "    records.flush()\n"
                 "    print(f'step:{step} - critic/score/mean:{score}', flush=True)\n"
                 f"checkpoints = pathlib.Path({str(tmp_path / CHECKPOINT_SUBDIR)!r})\n"
                 f"checkpoints.mkdir(); (checkpoints / {LATEST_ITERATION_FILE!r}).write_text('2')\n")
    bar = _fake_verl(monkeypatch, fake_verl)
    assert train.run_verl(compose(["rl.filter_groups=false"]), "sft", tmp_path, 0) == 2
    notes = {1: "reward +0.25", 2: "reward +0.75"}
    # on a loaded machine both records may be read at the first step line, and the bar then jumps to step 2
    assert bar.drawn and bar.drawn[-1][0] == 2 and all(note == notes[step] for step, note in bar.drawn), bar.drawn


def test_dynamic_sampling_that_cannot_fill_a_step_shows_its_batches_then_stops_with_the_shares_and_the_fix(
        tmp_path, monkeypatch):
    # Issue 32.6: a weak start model never reached step 1: the log showed repeated warnings, the bar nothing, and the
    # stall watchdog counted any output line as progress, so nothing stopped the run or said why.
    from rl.verl_args import DAPO_PROGRESS_PREFIX, DAPO_STOPPED_PREFIX

    why = ("DAPO's dynamic sampling judged 16 prompt groups at step 1 (2 generation batches of rl.train_batch_size=8, "
           "rl.max_gen_batches=2) and kept 0 of the 8 mixed groups a step needs: 0% all right, 100% all wrong. ...")
    fake_verl = (f"print('(TaskRunner pid=1) {DAPO_PROGRESS_PREFIX}step 1: generation batch 1: 0/8 mixed groups kept "
                 "(0% all right, 100% all wrong)', flush=True)\n"
                 f"print('(TaskRunner pid=1) {DAPO_PROGRESS_PREFIX}step 1: generation batch 2: 0/8 mixed groups kept "
                 "(0% all right, 100% all wrong)', flush=True)\n"
                 f"print({'(TaskRunner pid=1) ' + DAPO_STOPPED_PREFIX + why!r}, flush=True)\n"
                 "print('Traceback (most recent call last): ...', flush=True)\n"
                 "raise SystemExit(1)\n")
    bar = _fake_verl(monkeypatch, fake_verl)
    with pytest.raises(train.RLError) as stopped:
        train.run_verl(compose(["rl.train_batch_size=8", "rl.ppo_mini_batch_size=8"]), "sft", tmp_path, 0)
    assert str(stopped.value) == why  # the reason alone, not verl's traceback
    assert bar.notes == ["step 1: generation batch 1, 0/8 groups kept", "step 1: generation batch 2, 0/8 groups kept"]


def test_generation_batches_are_progress_for_the_stall_watchdog_after_the_first_step():
    stalled, clock = threading.Event(), FakeClock()
    watchdog = train.StallWatchdog(3.0, stalled.set, poll_s=0.01, clock=clock)
    watchdog.saw_line(is_step=True)
    for _ in range(8):  # a long step of dynamic sampling: generation batches every 1 s keep it quiet for 8 s
        clock.now += 1.0
        watchdog.saw_line(is_step=False, is_progress=True)
    time.sleep(0.05)
    assert not stalled.is_set()
    clock.now += 4.0
    assert stalled.wait(5.0) and watchdog.fired


def _finished_verl(tmp_path: Path, print_last_step: bool) -> str:
    """A fake verl that logs steps 1 and 2 to its file logger, saves the checkpoint of step 2, then hangs (printing
    the line of step 2 first, or nothing)."""
    return ("import json, os, pathlib, time\n"
            "records = open(os.environ['VERL_FILE_LOGGER_PATH'], 'w')\n"
            "def log(step):\n"
            "    records.write(json.dumps({'step': step, 'data': {'critic/score/mean': step / 4}}) + '\\n')\n"
            "    records.flush()\n"
            "log(1); print('step:1 - critic/score/mean:0.25', flush=True)\n"
            f"checkpoints = pathlib.Path({str(tmp_path / CHECKPOINT_SUBDIR)!r})\n"
            f"checkpoints.mkdir(); (checkpoints / {LATEST_ITERATION_FILE!r}).write_text('2')\n"
            "log(2)\n"
            + ("print('step:2 - critic/score/mean:0.5', flush=True)\n" if print_last_step else "")
            + "time.sleep(600)\n")


def test_verl_that_hangs_after_its_final_checkpoint_has_finished_training(tmp_path, monkeypatch):
    # Issue 32.7: verl saved its final checkpoint, then printed nothing until the stall watchdog stopped it; the stage
    # failed, and the rerun resumed but lost the last step's metrics.
    _fake_verl(monkeypatch, _finished_verl(tmp_path, print_last_step=False))
    # 5 s, not 1: the fake's interpreter must print its first line within the timeout, and at load 40 on 2 cores a
    # Python start took over 1 s (the watchdog then fired before the checkpoint, a different case)
    cfg = compose(["rl.total_steps=2", "rl.stall_timeout_s=5", "logging.progress=false"])
    assert train.run_verl(cfg, "sft", tmp_path, 0) == 2
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    from common.processes import owned_processes

    assert owned_processes(train.verl_owner(tmp_path)) == []  # the hung verl is gone


def test_verl_that_logged_its_last_step_and_does_not_exit_is_stopped_after_a_grace(tmp_path, monkeypatch):
    _fake_verl(monkeypatch, _finished_verl(tmp_path, print_last_step=True))
    monkeypatch.setattr(train, "FINISH_GRACE_S", 0.5)
    cfg = compose(["rl.total_steps=2", "rl.stall_timeout_s=60", "logging.progress=false"])
    started = time.monotonic()
    assert train.run_verl(cfg, "sft", tmp_path, 0) == 2
    assert time.monotonic() - started < 30  # not the stall timeout


def test_step_records_verl_logged_but_the_stage_did_not_copy_are_recovered_from_verls_files(tmp_path):
    metrics_dir = tmp_path / train.VERL_METRICS_SUBDIR
    metrics_dir.mkdir()
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 0.1}) + "\n")
    (metrics_dir / "attempt_0.jsonl").write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.1}}) + "\n")
    (metrics_dir / "attempt_1.jsonl").write_text(
        "".join(json.dumps({"step": s, "data": {"critic/score/mean": s / 10}}) + "\n" for s in (1, 2, 3))
        + '{"step": 4, "data": {"crit')  # cut by a kill: not a record
    assert train.recover_verl_metrics(tmp_path) == [2, 3]
    assert [(r["step"], r["critic/score/mean"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 0.1), (2, 0.2), (3, 0.3)]
    assert train.recover_verl_metrics(tmp_path) == []


def test_what_outlives_verl_is_stopped_when_verl_exits(tmp_path, monkeypatch):
    # Issue 32.2: Ray's processes live in sessions of their own; those still running after verl exits are stopped.
    pid_file = tmp_path / "raylet.pid"
    fake_verl = ("import pathlib, subprocess, sys\n"
                 "raylet = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
                 "start_new_session=True)\n"
                 f"pathlib.Path({str(pid_file)!r}).write_text(str(raylet.pid))\n"
                 f"checkpoints = pathlib.Path({str(tmp_path / CHECKPOINT_SUBDIR)!r})\n"
                 f"checkpoints.mkdir(); (checkpoints / {LATEST_ITERATION_FILE!r}).write_text('2')\n")
    _fake_verl(monkeypatch, fake_verl)
    started = time.monotonic()
    assert train.run_verl(compose(["rl.total_steps=2", "logging.progress=false"]), "sft", tmp_path, 0) == 2
    assert time.monotonic() - started < 60  # the orphan holding verl's output pipe is not waited for
    raylet = psutil.Process(int(pid_file.read_text()))
    try:
        raylet.wait(timeout=5)
    except psutil.TimeoutExpired:
        raylet.kill()
        pytest.fail("a process verl started outlived it")


def test_a_pathological_answer_is_judged_wrong_within_the_reward_time_limit():
    # Issue 32.7 probe: a reward worker that hangs on a pathological answer. rl/reward.py judges with
    # eval.scoring.verify, whose deadline ends a judge that overruns: the rollout scores wrong within the limit.
    from eval.scoring import TIMEOUT_S
    from rl.reward import compute_score

    started = time.monotonic()
    assert compute_score("toy", "so \\boxed{9^{9^{9^{9}}}}", "5") == {"score": -1.0, "acc": 0.0}
    assert compute_score("toy", "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}", "1")["acc"] == 0.0
    assert time.monotonic() - started < 2 * (TIMEOUT_S + 1.5)
