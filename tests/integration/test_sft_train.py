"""The SFT trainer end to end on a tiny random Qwen3 (CPU, gloo FSDP2): rank invariance, crash/resume equivalence,
epoch-boundary resume, and loud failure of a resume that cannot continue.

One uninterrupted 1-rank run is the reference: PSFT with an old-policy refresh every 3 steps (so resume must restore
the old policy too), ``global_token_mean`` (so ranks must agree on the step's token count), 16 rows, global batch 4
(4 steps per epoch), 2 epochs, checkpoints after steps 3, 4 (epoch end), 6 and 8.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from common.config import compose
from common.manifest import read_manifest, write_manifest
from common.paths import TRAINING_METRICS_FILE, hf_export_dir, sft_dir
from common.tracking import read_metrics
import sft.train
from sft.train import run
from sft.checkpoint import CHECKPOINTS_DIR, TRAINER_STATE_FILE, Checkpointer, ResumeError
from sft.trainer import TrainSummary
from sft_helpers import HEADS, build_tiny_model, final_weights, kill_after_checkpoint, prepare_run, run_torchrun

pytestmark = pytest.mark.integration

NUM_ROWS = 16
RUN = dict(method="psft", micro_batch_size=2, grad_accum=2, epochs=2, checkpoint_every=3,
           loss_norm="global_token_mean", **{"method.updates_per_refresh": 3})


@pytest.fixture(scope="module", params=HEADS)
def model_dir(request, tmp_path_factory) -> Path:
    """The tiny model with a tied head (Qwen3-4B's layout) and with an untied one (Qwen3-8B's): every test runs on
    both."""
    return build_tiny_model(tmp_path_factory.mktemp(f"tiny_qwen3_{request.param}"), head=request.param)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_dir):
    """The uninterrupted 1-rank run: (config, overrides, manifest, final weights, per-step losses)."""
    cfg, overrides = prepare_run(tmp_path_factory.mktemp("reference"), model_dir, NUM_ROWS, **RUN)
    manifest = run(cfg)
    assert manifest.complete
    return cfg, overrides, manifest, final_weights(cfg), losses(cfg)


TIED_HEAD_ONLY = pytest.mark.parametrize("model_dir", ["tied"], indirect=True)
"""The 2-rank, SIGKILL and crash launches on the tied head only: tests/e2e/test_sft_train_untied.py runs the first two
on the untied one, whose checkpoints and 2-rank loading the in-process tests here and
tests/integration/test_sharded_load.py cover."""


def losses(cfg) -> list[float]:
    return [record["loss"] for record in read_metrics(sft_dir(cfg) / TRAINING_METRICS_FILE)]


def assert_same_weights(actual: dict, expected: dict, atol: float) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=atol, msg=name)


def test_reference_run_trains_every_step_and_checkpoints_epoch_ends(reference):
    cfg, _, manifest, _, step_losses = reference
    assert manifest.metrics["steps"] == 8 and len(step_losses) == 8
    assert manifest.details["steps_per_epoch"] == 4 and manifest.details["export"]["max_abs_logprob_diff"] < 1e-4
    checkpoints = sorted(p.name for p in (sft_dir(cfg) / CHECKPOINTS_DIR).iterdir())
    assert checkpoints == ["step_000003", "step_000004", "step_000006", "step_000008"]
    records = read_metrics(sft_dir(cfg) / TRAINING_METRICS_FILE)
    assert [r["step"] for r in records] == list(range(1, 9))
    # PSFT logs its clip statistics; the refresh is timed apart from the step (steps 1, 4, 7 refresh)
    assert [r["step"] for r in records if "time/old_policy_refresh_s" in r] == [1, 4, 7]
    # a save is timed on the line after its step's (the line goes first): saves after steps 3, 4, 6 and 8
    assert [r["step"] for r in records if "time/checkpoint_s" in r] == [4, 5, 7]
    assert all(key in records[0] for key in ("grad_norm", "lr", "tokens_per_s", "peak_memory_gib", "time/step_s"))


@TIED_HEAD_ONLY
def test_two_ranks_match_one_rank(tmp_path, model_dir, reference):
    """Same global batch (2 ranks x 1 micro-batch of 2 vs 1 rank x 2 micro-batches): same micro-batches, same losses."""
    _, _, _, ref_weights, ref_losses = reference
    cfg, overrides = prepare_run(tmp_path, model_dir, NUM_ROWS, **{**RUN, "grad_accum": 1})
    overrides = [*overrides, "profile.nproc_per_node=2"]
    result = run_torchrun(overrides, nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cfg = compose(overrides)  # the world size is part of the run's identity: its own folder
    assert read_manifest(sft_dir(cfg)).details["world_size"] == 2
    assert losses(cfg) == pytest.approx(ref_losses, abs=1e-4)
    assert_same_weights(final_weights(cfg), ref_weights, atol=1e-4)


@TIED_HEAD_ONLY
def test_sigkill_then_resume_matches_uninterrupted(tmp_path, model_dir, reference):
    _, _, _, ref_weights, ref_losses = reference
    cfg, overrides = prepare_run(tmp_path, model_dir, NUM_ROWS, **RUN)
    kill_after_checkpoint(overrides, sft_dir(cfg) / CHECKPOINTS_DIR / "step_000003")
    assert not read_manifest(sft_dir(cfg)).complete, "the process finished before it was killed"
    assert not hf_export_dir(sft_dir(cfg)).exists()

    manifest = run(compose(overrides))
    assert manifest.complete
    assert 3 <= manifest.details["resumed_from_step"] < 8
    assert manifest.details["steps_this_launch"] == 8 - manifest.details["resumed_from_step"]
    assert losses(cfg) == pytest.approx(ref_losses, abs=1e-6)
    assert_same_weights(final_weights(cfg), ref_weights, atol=1e-6)


class Killed(RuntimeError):
    """The process dies here."""


@TIED_HEAD_ONLY
def test_crash_right_after_a_checkpoint_keeps_that_steps_metrics_line(tmp_path, model_dir, reference, monkeypatch):
    """The SIGKILL test's race made deterministic: the process dies as soon as checkpoint 3 is complete. The resumed
    run starts after step 3, so step 3's metrics line must already be in metrics.jsonl (it was lost, and the run
    ended with 7 lines for 8 steps)."""
    _, _, _, _, ref_losses = reference
    cfg, overrides = prepare_run(tmp_path, model_dir, NUM_ROWS, **RUN)
    save = Checkpointer.save

    def save_then_die(self, state, *args):
        path = save(self, state, *args)
        if state.global_step == 3:
            raise Killed
        return path

    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    with pytest.raises(Killed):
        run(cfg)
    monkeypatch.undo()

    manifest = run(compose(overrides))
    assert manifest.complete and manifest.details["resumed_from_step"] == 3
    assert [r["step"] for r in read_metrics(sft_dir(cfg) / TRAINING_METRICS_FILE)] == list(range(1, 9))
    assert losses(cfg) == pytest.approx(ref_losses, abs=1e-6)


def crashed_copy(reference_cfg, tmp_path: Path, keep_up_to_step: int):
    """A copy of the reference run as if it had crashed right after checkpoint ``keep_up_to_step``."""
    run_root = Path(reference_cfg.experiment.run_root)
    shutil.copytree(run_root, tmp_path / "runs")
    cfg_dir = sft_dir(reference_cfg).relative_to(run_root)
    out_dir = tmp_path / "runs" / cfg_dir
    for checkpoint in (out_dir / CHECKPOINTS_DIR).iterdir():
        if int(checkpoint.name.removeprefix("step_")) > keep_up_to_step:
            shutil.rmtree(checkpoint)
    shutil.rmtree(hf_export_dir(out_dir))
    manifest = read_manifest(out_dir)
    manifest.status, manifest.error = "failed", "simulated crash"
    write_manifest(out_dir, manifest)
    return out_dir


def test_resume_exactly_at_epoch_boundary_trains_the_remaining_epoch(tmp_path, reference):
    """verl #7401: a checkpoint at the end of epoch 0 must resume into epoch 1, not finish under-trained."""
    ref_cfg, overrides, _, ref_weights, ref_losses = reference
    out_dir = crashed_copy(ref_cfg, tmp_path, keep_up_to_step=4)
    state = json.loads((out_dir / CHECKPOINTS_DIR / "step_000004" / TRAINER_STATE_FILE).read_text())
    assert (state["epoch"], state["index_in_epoch"]) == (1, 0)

    manifest = run(compose([*overrides, f"experiment.run_root={tmp_path / 'runs'}"]))
    assert manifest.complete
    assert manifest.details["resumed_from_step"] == 4 and manifest.details["steps_this_launch"] == 4
    assert [r["loss"] for r in read_metrics(out_dir / TRAINING_METRICS_FILE)] == pytest.approx(ref_losses, abs=1e-6)
    assert_same_weights(final_weights(compose([*overrides, f"experiment.run_root={tmp_path / 'runs'}"])),
                        ref_weights, atol=1e-6)


def test_resume_that_cannot_continue_fails_loudly_and_stays_incomplete(tmp_path, reference):
    ref_cfg, overrides, _, _, _ = reference
    out_dir = crashed_copy(ref_cfg, tmp_path, keep_up_to_step=6)
    state_file = out_dir / CHECKPOINTS_DIR / "step_000006" / TRAINER_STATE_FILE
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "world_size": 2}))

    with pytest.raises(ResumeError, match="written by 2 ranks"):
        run(compose([*overrides, f"experiment.run_root={tmp_path / 'runs'}"]))
    manifest = read_manifest(out_dir)
    assert manifest.status == "failed" and "ResumeError" in manifest.error
    assert not hf_export_dir(out_dir).exists()


def test_same_size_damage_of_the_newest_checkpoint_falls_back_to_the_one_before(tmp_path, reference, capsys):
    # Issue 39, item 1: 64 bytes of the newest checkpoint's shard overwritten in place were loaded as they were (the
    # loss jumped, the run ended complete); a truncated shard failed in DCP naming neither the file nor the step.
    ref_cfg, overrides, _, ref_weights, ref_losses = reference
    out_dir = crashed_copy(ref_cfg, tmp_path, keep_up_to_step=6)
    shard = max((out_dir / CHECKPOINTS_DIR / "step_000006").glob("*.distcp"), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:
        handle.seek(size // 2)
        handle.write(bytes(64))
    assert shard.stat().st_size == size

    manifest = run(compose([*overrides, f"experiment.run_root={tmp_path / 'runs'}"]))
    assert manifest.complete and manifest.details["resumed_from_step"] == 4
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "DAMAGED" in line]
    assert f"step 6 is DAMAGED: {shard}" in line and "falling back to the checkpoint of step 4" in line
    assert [r["loss"] for r in read_metrics(out_dir / TRAINING_METRICS_FILE)] == pytest.approx(ref_losses, abs=1e-6)
    assert_same_weights(final_weights(compose([*overrides, f"experiment.run_root={tmp_path / 'runs'}"])),
                        ref_weights, atol=1e-6)


def test_a_truncated_only_checkpoint_is_named_and_the_run_starts_from_step_0(tmp_path, reference, capsys):
    ref_cfg, overrides, _, _, ref_losses = reference
    out_dir = crashed_copy(ref_cfg, tmp_path, keep_up_to_step=3)
    shard = max((out_dir / CHECKPOINTS_DIR / "step_000003").glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)

    manifest = run(compose([*overrides, f"experiment.run_root={tmp_path / 'runs'}"]))
    assert manifest.complete and manifest.details["resumed_from_step"] is None
    assert f"step 3 is DAMAGED: {shard}" in capsys.readouterr().out
    assert [r["loss"] for r in read_metrics(out_dir / TRAINING_METRICS_FILE)] == pytest.approx(ref_losses, abs=1e-6)


def test_a_run_without_updates_is_never_complete(tmp_path, model_dir, monkeypatch):
    """Whatever makes the loop end early (here: a loop that returns at once), no complete manifest, no export."""
    cfg, _ = prepare_run(tmp_path, model_dir, NUM_ROWS, max_steps=2)
    monkeypatch.setattr(sft.train, "fit", lambda *args, **kwargs: TrainSummary(
        steps=0, total_steps=2, supervised_tokens=0, input_tokens=0, final_loss=float("nan"), train_time_s=0.0,
        resumed_from_step=None, steps_this_launch=0))
    with pytest.raises(RuntimeError, match="after 0 of 2 optimiser steps"):
        run(cfg)
    assert read_manifest(sft_dir(cfg)).status == "failed"
    assert not hf_export_dir(sft_dir(cfg)).exists()
