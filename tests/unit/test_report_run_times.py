"""The report's "Runs" section: attempts summed per stage, the union of attempts, commits and machines."""
from __future__ import annotations

import csv
import datetime as dt

from common.manifest import Manifest, machine_state, read_manifest, stage_run, write_manifest
from report.run_times import (
    Attempt,
    RunTime,
    attempts_of,
    commit_text,
    machine_text,
    read_run_times,
    run_times_section,
    working_seconds,
)

T0 = dt.datetime(2026, 11, 26, 10, 0, 0, tzinfo=dt.timezone.utc)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _run(name: str, stage: str, *spans: tuple[float, float | None]) -> RunTime:
    attempts = tuple(Attempt(_at(start), None if end is None else _at(end), "complete") for start, end in spans)
    return RunTime(name, stage, "complete", "abc1234", "AMD EPYC, 2 CPUs (avx2), 24 GiB", attempts)


def _attempt(start: float, end: float | None, status: str) -> dict[str, str]:
    return {"started_at": _at(start).isoformat(), "ended_at": "" if end is None else _at(end).isoformat(),
            "status": status}


def test_working_time_is_the_union_of_finished_attempts():
    # base [0, 300]; sft [290, 400] overlaps it by 10; eval [1000, 1060] after an idle gap; a killed attempt
    # [500, –] counts nothing: 400 + 60 = 460, not 300 + 110 + 60 = 470 and not the span 1060.
    runs = [_run("base", "base", (0, 300)), _run("sft", "sft", (290, 400), (500, None)),
            _run("eval", "eval_sft", (1000, 1060))]
    assert working_seconds(runs) == 460
    assert [run.work_s for run in runs] == [300, 110, 60]
    assert [run.killed for run in runs] == [0, 1, 0]
    assert working_seconds([]) == 0


def test_a_resumed_run_counts_its_attempts_not_the_time_between():
    # interrupted after 100 s, resumed an hour later for 40 s: 140 s of work, not 3740
    manifest = Manifest(stage="sft", variant="v", status="complete", started_at=_at(0).isoformat(),
                        ended_at=_at(3740).isoformat(),
                        attempts=[_attempt(0, 100, "interrupted"), _attempt(3700, 3740, "complete")])
    run = RunTime("sft", "sft", "complete", "x", "y", attempts_of(manifest))
    assert run.work_s == 140


def test_a_manifest_from_before_attempts_is_one_attempt():
    manifest = Manifest(stage="rl", variant="v", status="complete", started_at=_at(0).isoformat(),
                        ended_at=_at(280).isoformat())
    assert attempts_of(manifest) == (Attempt(_at(0), _at(280), "complete"),)


def test_commit_and_machine_texts():
    assert commit_text({"commit": "7ac42f90d420c71a", "dirty": False}) == "7ac42f9"
    assert commit_text({"commit": "7ac42f90d420c71a", "dirty": True}) == "7ac42f9+dirty"
    assert commit_text({"commit": "unknown", "dirty": None}) == "unknown"
    assert machine_text({}) == "not recorded"
    assert machine_text({"cpu": "AMD EPYC", "cpus": 2, "cpu_flags": ["avx2", "avx512f", "avx512_bf16"],
                         "memory_gib": 24}) == "AMD EPYC, 2 CPUs (avx2, avx512f, avx512_bf16), 24 GiB"
    assert machine_text({"cpu": "Intel Xeon", "cpus": 16, "cpu_flags": ["avx2"], "memory_gib": 128,
                         "gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]}) == \
        "Intel Xeon, 16 CPUs (avx2), 128 GiB, GPUs: 2 × NVIDIA H100 80GB HBM3"


def test_the_section_sums_stages_in_pipeline_order_and_writes_one_csv_row_per_run(tmp_path):
    runs = [_run("demo/eval/a", "eval_sft", (400, 460)), _run("cache/base/x", "base", (0, 300)),
            _run("demo/sft/s", "sft", (300, 350), (360, None)), _run("demo/sft/e", "sft", (300, 400))]
    lines, numbers = run_times_section(runs, tmp_path)
    assert lines[0] == "* Commit: abc1234 (all 4 runs)"
    assert lines[1] == "* Machine: AMD EPYC, 2 CPUs (avx2), 24 GiB (all 4 runs)"
    assert lines[2].startswith("* Working time: **7.7 min** (460 s) in which at least one of these runs was "
                               "working (the union of their attempts, 2026-11-26 10:00:00 to 2026-11-26 10:07:40 UTC)")
    table = lines[lines.index("| stage | runs | attempts | work (s) | longest run (s) |"):]
    assert table[2:5] == ["| base | 1 | 1 | 300 | 300 |", "| sft | 2 | 3 | 150 | 100 |",
                          "| eval_sft | 1 | 1 | 60 | 60 |"]
    assert "Attempts killed without an end (not counted): demo/sft/s." in lines
    assert numbers == {"working_s": 460, "runs": 4, "commits": ["abc1234"],
                       "machines": ["AMD EPYC, 2 CPUs (avx2), 24 GiB"]}
    rows = list(csv.DictReader((tmp_path / "run_times.csv").open()))
    assert [(row["run"], row["attempts"], row["killed_attempts"], row["work_s"]) for row in rows] == [
        ("demo/eval/a", "1", "0", "60"), ("cache/base/x", "1", "0", "300"), ("demo/sft/s", "2", "1", "50"),
        ("demo/sft/e", "1", "0", "100")]
    assert rows[2]["last_ended_at"] == "2026-11-26T10:05:50+00:00"


def test_mixed_commits_are_counted(tmp_path):
    runs = [_run("a", "sft", (0, 10)), _run("b", "sft", (0, 10))]
    runs[1] = RunTime("b", "sft", "complete", "def5678+dirty", runs[1].machine, runs[1].attempts)
    lines, _ = run_times_section(runs, tmp_path)
    assert lines[0] == "* Commit: abc1234 (1 of 2 runs); def5678+dirty (1 of 2 runs)"


def test_stage_run_records_the_machine_and_the_report_reads_it(tmp_path):
    with stage_run(tmp_path / "run", stage="sft", variant="v", config={}, announce=lambda _: None) as run_:
        assert run_.manifest.machine == machine_state()
    machine = read_manifest(tmp_path / "run").machine
    assert machine["cpus"] >= 1 and set(machine) <= {"cpus", "cpu", "cpu_flags", "memory_gib", "gpus"}
    write_manifest(tmp_path / "old", Manifest(stage="sft", variant="v", status="complete",
                                              started_at=_at(0).isoformat(), ended_at=_at(5).isoformat()))
    runs = read_run_times({"run": tmp_path / "run", "old": tmp_path / "old", "absent": tmp_path / "absent"})
    assert [run.name for run in runs] == ["run", "old"]
    assert runs[0].machine == machine_text(machine) and runs[1].machine == "not recorded"
    assert runs[1].work_s == 5
