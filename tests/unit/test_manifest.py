"""The run contract: atomic manifests, skip / resume / restart decisions, failures recorded."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict

import pytest

from common import manifest as mf
from common.locks import LockHeld
from common.processes import termination_signals_interrupt


def _body_runs(directory, config, inputs=None):
    with mf.stage_run(directory, stage="s", variant="v", config=config, inputs=inputs, announce=lambda _: None) as run:
        if run is None:
            return None
        (directory / "out.txt").write_text("x")
        run.add_output("out.txt", "an output")
        return run


def _inside_stage_run(directory, config: dict) -> subprocess.Popen:
    """A child process inside ``stage_run(directory, ...)`` (holding its lock), returned once it is in the body."""
    child = subprocess.Popen([sys.executable, "-c", (
        "import time; from common.manifest import stage_run\n"
        f"with stage_run({str(directory)!r}, stage='s', variant='v', config={config!r}, announce=lambda _: None):\n"
        "    print('inside', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    if child.stdout.readline().strip() != "inside":
        child.kill()
        raise AssertionError(f"the child never entered stage_run (exit status {child.wait()})")
    return child


def test_manifest_written_atomically_keeps_old_file_on_crash(tmp_path, monkeypatch):
    mf.write_manifest(tmp_path, mf.Manifest(stage="s", variant="v", status="complete"))
    before = (tmp_path / "manifest.json").read_text()

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(mf.json, "dump", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        mf.write_manifest(tmp_path, mf.Manifest(stage="s", variant="v", status="running"))
    assert (tmp_path / "manifest.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temp file left behind


def test_complete_manifest_with_same_config_is_skipped(tmp_path):
    first = _body_runs(tmp_path, {"a": 1})
    assert first is not None and not first.resumed
    manifest = mf.read_manifest(tmp_path)
    assert manifest.status == "complete"
    assert manifest.outputs == {"out.txt": {"description": "an output", "verify": True, "size": 1, "files": 1,
                                            "digest": hashlib.sha256(b"x").hexdigest()}}
    assert manifest.packages["python"] and "commit" in manifest.git
    assert _body_runs(tmp_path, {"a": 1}) is None


def test_changed_config_restarts(tmp_path):
    _body_runs(tmp_path, {"a": 1})
    run = _body_runs(tmp_path, {"a": 2})
    assert run is not None and not run.resumed
    assert mf.read_manifest(tmp_path).config == {"a": 2}


def test_changed_input_restarts(tmp_path):
    upstream = tmp_path / "in.txt"
    upstream.write_text("v1")
    stage = tmp_path / "stage"
    _body_runs(stage, {"a": 1}, {"data": upstream})
    assert _body_runs(stage, {"a": 1}, {"data": upstream}) is None
    upstream.write_text("v2")
    assert _body_runs(stage, {"a": 1}, {"data": upstream}) is not None


def test_incomplete_run_is_resumed_loudly(tmp_path):
    messages = []
    with pytest.raises(KeyboardInterrupt):
        with mf.stage_run(tmp_path, stage="s", variant="v", config={"a": 1}, announce=messages.append) as run:
            run.manifest.details["done"] = 3
            run.checkpoint()
            raise KeyboardInterrupt
    assert mf.read_manifest(tmp_path).status == "interrupted"
    with mf.stage_run(tmp_path, stage="s", variant="v", config={"a": 1}, announce=messages.append) as run:
        assert run.resumed and run.manifest.details == {"done": 3}
    assert any("RESUMING" in m for m in messages)


def test_every_attempt_of_a_resumed_run_keeps_its_own_start_and_end(tmp_path):
    # A resumed run's started_at is its first attempt's, so ended_at - started_at counted the hours between attempts
    # (a forking SFT run: 2563 s for ~140 s of work); each attempt's own times say what the run took.
    killed = _inside_stage_run(tmp_path, {"a": 1})
    killed.kill()  # SIGKILL: the attempt never records its end
    killed.wait()
    with pytest.raises(KeyboardInterrupt):
        with mf.stage_run(tmp_path, stage="s", variant="v", config={"a": 1}, announce=lambda _: None):
            raise KeyboardInterrupt
    with mf.stage_run(tmp_path, stage="s", variant="v", config={"a": 1}, announce=lambda _: None) as run:
        assert run.resumed
    manifest = mf.read_manifest(tmp_path)
    assert [attempt["status"] for attempt in manifest.attempts] == ["running", "interrupted", "complete"]
    assert manifest.attempts[0]["started_at"] == manifest.started_at and manifest.attempts[0]["ended_at"] == ""
    assert manifest.attempts[1]["ended_at"] and manifest.attempts[2]["ended_at"] == manifest.ended_at
    assert manifest.attempts[1]["started_at"] <= manifest.attempts[2]["started_at"]
    _body_runs(tmp_path, {"a": 2})  # a fresh start (a new config) starts the list anew
    assert [attempt["status"] for attempt in mf.read_manifest(tmp_path).attempts] == ["complete"]


def test_failure_is_recorded_with_reason(tmp_path):
    with pytest.raises(ValueError):
        with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
            raise ValueError("row 7: field 'prompt' missing")
    manifest = mf.read_manifest(tmp_path)
    assert manifest.status == "failed" and "row 7" in manifest.error and manifest.ended_at


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_full_disk_is_one_line_naming_the_path_and_the_free_space_and_is_recorded(tmp_path, monkeypatch, code):
    # Issue 39, item 3: with the run root on a full file system the stage ended "exited with status 1 (...: running)",
    # no word of the disk, and its manifest stayed 'running' because writing 'failed' hit ENOSPC too.
    shard = tmp_path / "checkpoints" / "step_000010" / "__0_0.distcp"
    real_fsync = os.fsync

    def full_disk_fsync(fd):  # the disk is full: nothing more fits until the stage frees the space it holds
        if (tmp_path / mf.SPACE_RESERVE_NAME).exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    with pytest.raises(mf.StorageError) as error:
        with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
            monkeypatch.setattr(os, "fsync", full_disk_fsync)
            raise OSError(code, os.strerror(code), str(shard))
    line = str(error.value)
    assert "\n" not in line and line.startswith(f"{shard}: {os.strerror(code).lower()} (") and " MiB free of " in line
    assert "re-run the same command to resume" in line
    manifest = mf.read_manifest(tmp_path)
    assert manifest.status == "failed" and manifest.error == line
    assert not (tmp_path / mf.SPACE_RESERVE_NAME).exists()


def test_a_full_disk_worded_by_a_library_names_the_run_folder(tmp_path):
    with pytest.raises(mf.StorageError, match=f"^{tmp_path}: no space left on device"):
        with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
            raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                               'left on device" })')  # what safetensors raises
    assert mf.read_manifest(tmp_path).status == "failed"


def test_an_error_without_an_errno_on_a_full_disk_is_named_as_one(tmp_path, monkeypatch):
    # DCP's torch.save on a full tmpfs: "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704
    # vs 598", inside a CheckpointException; no errno, no wording of the disk.
    real_usage = mf.shutil.disk_usage
    full = {"on": False}
    monkeypatch.setattr(mf.shutil, "disk_usage", lambda path: real_usage(path)._replace(free=0) if full["on"]
                        else real_usage(path))
    with pytest.raises(mf.StorageError, match=rf"^{tmp_path}: no space left on device \(0.0 MiB free .* stopped "
                                              r"with RuntimeError: \[enforce fail.*\] . unexpected pos 704 vs 598\)$"):
        with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
            full["on"] = True
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert mf.read_manifest(tmp_path).status == "failed"
    full["on"] = False
    with pytest.raises(RuntimeError, match="unexpected pos") as error:
        with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert type(error.value) is RuntimeError  # with room on the disk it is that error


def test_a_signal_a_library_wraps_on_its_way_out_is_recorded_as_interrupted(tmp_path):
    # Issue 39, item 4: Ctrl-C during dcp.save was recorded 'failed': DCP turns the KeyboardInterrupt into a
    # CheckpointException.
    with termination_signals_interrupt(), pytest.raises(RuntimeError, match="CheckpointException"):
        with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            except BaseException as wrapped:
                raise RuntimeError("CheckpointException ranks:dict_keys([0])") from wrapped
    manifest = mf.read_manifest(tmp_path)
    assert manifest.status == "interrupted" and "SIGTERM" in manifest.error


def test_require_complete_explains_what_is_missing(tmp_path):
    with pytest.raises(mf.StageInputError, match="no manifest"):
        mf.require_complete(tmp_path, "data stage")
    mf.write_manifest(tmp_path, mf.Manifest(stage="s", variant="v", status="failed", error="boom"))
    with pytest.raises(mf.StageInputError, match="boom"):
        mf.require_complete(tmp_path, "data stage")


def test_folder_hash_covers_names_and_contents(tmp_path):
    (tmp_path / "a").write_text("1")
    h1 = mf.sha256_path(tmp_path)
    (tmp_path / "a").write_text("2")
    h2 = mf.sha256_path(tmp_path)
    os.rename(tmp_path / "a", tmp_path / "b")
    assert len({h1, h2, mf.sha256_path(tmp_path)}) == 3


def test_config_hash_ignores_key_order():
    assert mf.config_hash({"a": 1, "b": [1, 2]}) == mf.config_hash({"b": [1, 2], "a": 1})
    assert mf.config_hash({"a": 1}) != mf.config_hash({"a": 2})


def test_manifest_is_plain_json(tmp_path):
    mf.write_manifest(tmp_path, mf.Manifest(stage="s", variant="v"))
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["schema_version"] == mf.SCHEMA_VERSION and data["status"] == "running"


# ------------------------------------------------------------------- issue 10: the run contract
def _upstream_then_downstream(tmp_path):
    upstream, downstream = tmp_path / "up", tmp_path / "down"
    _body_runs(upstream, {"u": 1})
    assert _body_runs(downstream, {"d": 1}, {"model": upstream}) is not None
    return upstream, downstream


def test_a_rerun_upstream_makes_downstream_stale(tmp_path):
    # Issue 10.1: SFT re-ran (same config, new outputs) and its evaluation was skipped as "done".
    upstream, downstream = _upstream_then_downstream(tmp_path)
    assert mf.is_current(downstream, mf.config_hash({"d": 1}), {"model": upstream})
    mf.invalidate(upstream, "retrained with changed code")
    assert _body_runs(upstream, {"u": 1}) is not None  # a fresh run: new run id
    assert not mf.is_current(downstream, mf.config_hash({"d": 1}), {"model": upstream})
    messages = []
    with mf.stage_run(downstream, stage="s", variant="v", config={"d": 1}, inputs={"model": upstream},
                      announce=messages.append) as run:
        assert run is not None and not run.resumed
    assert "inputs changed: model" in messages[0]


def test_unchanged_upstream_keeps_downstream_current(tmp_path):
    upstream, downstream = _upstream_then_downstream(tmp_path)
    assert _body_runs(upstream, {"u": 1}) is None
    assert _body_runs(downstream, {"d": 1}, {"model": upstream}) is None


def test_deleted_output_is_not_trusted_and_names_the_file(tmp_path):
    # Issue 10.4: a complete export whose model file was deleted was reported as done.
    upstream, downstream = _upstream_then_downstream(tmp_path)
    (upstream / "out.txt").unlink()
    assert not mf.is_current(upstream, mf.config_hash({"u": 1}), {})
    with pytest.raises(mf.StageInputError, match=r"out.txt is missing.*re-run that stage"):
        mf.require_complete(upstream, "SFT export")
    assert not mf.is_current(downstream, mf.config_hash({"d": 1}), {"model": upstream})
    with mf.stage_run(upstream, stage="s", variant="v", config={"u": 1}, announce=lambda _: None) as run:
        assert run is not None and run.resumed  # the stage redoes what is missing


def test_same_size_damage_of_an_exported_folder_names_the_file(tmp_path):
    # Issue 39, item 1: a damaged export or base model is named by its file, not only by its folder.
    with mf.stage_run(tmp_path, stage="sft", variant="v", config={}, announce=lambda _: None) as run:
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "config.json").write_text("{}")
        (tmp_path / "hf" / "model.safetensors").write_bytes(bytes(range(256)) * 4)
        run.add_output("hf", "the export")
    with open(tmp_path / "hf" / "model.safetensors", "r+b") as handle:
        handle.seek(512)
        handle.write(bytes(64))
    with pytest.raises(mf.StageInputError, match=f"{tmp_path / 'hf' / 'model.safetensors'} changed since the run "
                                                 r"completed \(1026 -> 1026 bytes in .*; re-run that stage"):
        mf.require_complete(tmp_path, "model to evaluate")


def test_changed_output_is_detected(tmp_path):
    _body_runs(tmp_path, {"a": 1})
    (tmp_path / "out.txt").write_text("y")
    assert mf.run_state(tmp_path, mf.config_hash({"a": 1}), {}).action == "resume"


def test_outputs_without_verify_are_listed_but_not_checked(tmp_path):
    with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None) as run:
        (tmp_path / "ckpt").mkdir()
        run.add_output("ckpt", "checkpoints", verify=False)
    (tmp_path / "ckpt").rmdir()
    assert mf.run_state(tmp_path, mf.config_hash({}), {}).action == "skip"


def test_large_files_are_fingerprinted_by_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(mf, "FULL_HASH_MAX_BYTES", 10)
    monkeypatch.setattr(mf, "SAMPLE_BYTES", 4)
    path = tmp_path / "shard.bin"
    path.write_bytes(b"0123456789abcdefghij")
    first = mf.fingerprint_file(path)
    path.write_bytes(b"0123456789abcdefghiX")  # the last bytes are sampled
    assert first.startswith("sampled:") and mf.fingerprint_file(path) != first


@pytest.mark.parametrize("name", ["manifest.json", "launch.json"])
def test_corrupt_json_names_its_path(tmp_path, name):
    (tmp_path / name).write_text('{"stage": "s", "sta')
    with pytest.raises(mf.StageInputError, match=f"{tmp_path / name}: corrupt"):
        mf.read_json(tmp_path / name, "record")
    if name == "manifest.json":
        with pytest.raises(mf.StageInputError, match="corrupt manifest"):
            mf.read_manifest(tmp_path)


def test_a_manifest_from_a_newer_pipeline_names_its_unknown_fields(tmp_path):
    # A bench's orchestrator, started before `machine` existed, read a manifest its stages wrote after the field was
    # added and died with "TypeError: Manifest.__init__() got an unexpected keyword argument 'machine'".
    data = asdict(mf.Manifest(stage="s", variant="v", status="complete"))
    (tmp_path / "manifest.json").write_text(json.dumps({**data, "gpu_clock": 1, "zone": "a"}))
    with pytest.raises(mf.StageInputError, match=r"manifest.json: fields gpu_clock, zone are unknown to this version "
                                                 r"of the pipeline \(written by a newer one\)"):
        mf.read_manifest(tmp_path)


def test_second_writer_fails_fast_naming_the_holder(tmp_path):
    # Issue 10.3: two processes "resumed" each other's live stage and wrote every sample twice.
    holder = _inside_stage_run(tmp_path, {})
    try:
        with pytest.raises(LockHeld, match=f"PID {holder.pid} on host"):
            with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
                pass
    finally:
        holder.kill()
        holder.wait()
    messages = []
    with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=messages.append) as run:
        assert run is not None and run.resumed
    assert any(f"PID {holder.pid}" in m and "taking over" in m for m in messages)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_manifests_and_launch_records_honour_the_umask(tmp_path, umask):
    # Issue 32.5: manifest.json and launch.json were created 0600 (mkstemp ignores the umask) while every other output
    # was 0644, so on a shared run root other users could not read the manifests.
    previous = os.umask(umask)
    try:
        mf.write_manifest(tmp_path, mf.Manifest(stage="s", variant="v"))
        mf.write_json_atomic(tmp_path / "launch.json", {"argv": []})
        (tmp_path / "other.txt").write_text("x")
    finally:
        os.umask(previous)
    expected = 0o666 & ~umask
    assert {name: os.stat(tmp_path / name).st_mode & 0o777 for name in ("manifest.json", "launch.json", "other.txt")} \
        == dict.fromkeys(("manifest.json", "launch.json", "other.txt"), expected)
