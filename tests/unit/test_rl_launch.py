"""rl.train's helpers: phase-timing summary, the step-line pattern, checkpoint markers, eos check, stall watchdog;
stopping verl on SIGTERM, starting it again when Ray's node times out during start-up."""
from __future__ import annotations

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
from common.tracking import dapo_groups_kept
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


def test_stall_watchdog_counts_any_line_during_start_up_and_only_steps_after_it():
    stalled = threading.Event()
    watchdog = train.StallWatchdog(0.3, stalled.set, poll_s=0.05)
    for _ in range(8):  # start-up: a line every 0.1 s keeps it quiet for 0.8 s, past the 0.3 s limit
        time.sleep(0.1)
        watchdog.saw_line(is_step=False)
    watchdog.saw_line(is_step=True)
    for _ in range(2):
        time.sleep(0.1)
        watchdog.saw_line(is_step=False)
    assert not stalled.is_set() and not watchdog.fired
    for _ in range(6):  # after the first step, lines without a new step are no progress
        time.sleep(0.1)
        watchdog.saw_line(is_step=False)
    assert stalled.wait(2.0) and watchdog.fired
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
    drawn = []

    class RecordingBar:
        n, note = 0, ""

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def set_postfix_str(self, note, refresh=True):
            self.note = note

        def update(self, steps):
            self.n += steps
            drawn.append((self.n, self.note))

    monkeypatch.setattr(train, "build_command", lambda cfg: [sys.executable, "-c", fake_verl])
    monkeypatch.setattr(train, "progress", lambda **kwargs: RecordingBar())
    assert train.run_verl(compose(["rl.filter_groups=false"]), "sft", tmp_path, 0) == 2
    notes = {1: "reward +0.25", 2: "reward +0.75"}
    # on a loaded machine both records may be read at the first step line, and the bar then jumps to step 2
    assert drawn and drawn[-1][0] == 2 and all(note == notes[step] for step, note in drawn), drawn
