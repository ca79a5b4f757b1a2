"""The run contract: atomic manifests, skip / resume / restart decisions, failures recorded."""
from __future__ import annotations

import json
import os

import pytest

from pipeline import manifest as mf


def _body_runs(directory, config, inputs=None):
    with mf.stage_run(directory, stage="s", variant="v", config=config, inputs=inputs, announce=lambda _: None) as run:
        if run is None:
            return None
        (directory / "out.txt").write_text("x")
        run.add_output("out.txt", "an output")
        return run


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
    assert manifest.status == "complete" and manifest.outputs == {"out.txt": "an output"}
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
    assert mf.read_manifest(tmp_path).status == "failed"
    with mf.stage_run(tmp_path, stage="s", variant="v", config={"a": 1}, announce=messages.append) as run:
        assert run.resumed and run.manifest.details == {"done": 3}
    assert any("RESUMING" in m for m in messages)


def test_failure_is_recorded_with_reason(tmp_path):
    with pytest.raises(ValueError):
        with mf.stage_run(tmp_path, stage="s", variant="v", config={}, announce=lambda _: None):
            raise ValueError("row 7: field 'prompt' missing")
    manifest = mf.read_manifest(tmp_path)
    assert manifest.status == "failed" and "row 7" in manifest.error and manifest.ended_at


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
