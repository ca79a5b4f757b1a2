"""LUFFY's extra evaluation sets (MATH-500, Minerva, OlympiadBench) read from the shared copy of LUFFY's
``valid.all.parquet`` by ``data_source`` (facts: integrations_2026.md, section D), and a model evaluated on benchmarks
alone: ``data.source=none`` writes the benchmarks without a training set (issue 43.4)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.config import compose
from common.paths import benchmark_path, data_run, eval_dir, extra_benchmark_run
from common.seeding import derive_seed
from data import prepare
from data.benchmarks import load_benchmark
from eval.run import run as evaluate
from eval_helpers import ScriptedSampler

pytestmark = pytest.mark.integration
SETS = {"math500": 500, "minerva": 272, "olympiad": 675}


def luffy_config(shared_data: Path, *overrides: str, profile: str = "paper"):
    parquet = shared_data / "raw" / "luffy_valid.all.parquet"
    return compose(["experiment=table1", f"profile={profile}", *(f"data.extra_benchmarks.{name}.path={parquet}"
                                                                 for name in SETS), *overrides])


@pytest.fixture(scope="module")
def records(shared_data) -> dict[str, list[dict]]:
    cfg = luffy_config(shared_data)
    return {name: load_benchmark(name, cfg.data.extra_benchmarks[name], cfg.data)[0] for name in SETS}


def test_each_set_has_its_count_and_ids_and_olympiad_golds_lose_their_dollars(records, shared_data):
    cfg = luffy_config(shared_data)
    assert {name: (cfg.eval.samples_for(name), cfg.report.benchmark_labels[name]) for name in SETS} == {
        "math500": (4, "MATH500"), "minerva": (4, "Minerva"), "olympiad": (4, "Olympiad")}
    for name, count in SETS.items():
        assert [record["id"] for record in records[name]] == [f"{name}-{i}" for i in range(count)]
    wrapped = [record for record in records["olympiad"] if record["answer_raw"].startswith("$")]
    whole = [record for record in wrapped
             if record["answer_raw"].endswith("$") and "$" not in record["answer_raw"][1:-1]]
    assert (len(wrapped), len(whole)) == (266, 245)  # the other 21 hold several $...$ spans (kept as they are)
    assert all(record["answer"] == record["answer_raw"][1:-1].strip() for record in whole)
    assert records["olympiad"][76]["answer"] == "$(-\\infty, 0) \\cup\\{1\\}$."  # a period after its $...$: kept


def test_a_model_is_evaluated_on_benchmarks_alone_without_a_training_set(shared_data, tmp_path):
    from bench.tiny_model import build_tiny_qwen3

    model = build_tiny_qwen3(tmp_path / "model", think_prompt=True)
    cfg = luffy_config(shared_data, f"experiment.run_root={tmp_path / 'runs'}", "data=openr1_local", "data.source=none",
                       f"data.benchmark_dir={shared_data / 'benchmarks'}",
                       f"data.system_prompt_path={shared_data / 'prompts' / 'luffy_system_prompt.txt'}",
                       "eval.benchmarks=[math500]", f"eval.model_path={model}", "eval.variant=tiny",
                       "eval.n=4", "eval.max_problems=2", "eval.max_tokens=16", "logging.progress=false",
                       profile="toy")
    manifest = prepare.run(cfg)
    assert manifest.complete and manifest.details["source"] == {"kind": "none"}
    assert not (data_run(cfg).directory / "sft.parquet").exists()
    rows = [json.loads(line) for line in benchmark_path(cfg, "math500").read_text().splitlines()]
    assert len(rows) == 500 and rows[0]["prompt"][0]["role"] == "system"
    spec = extra_benchmark_run(cfg, "math500")
    assert benchmark_path(cfg, "math500").is_relative_to(spec.directory)
    assert spec.inputs["benchmark_file"] == shared_data / "raw" / "luffy_valid.all.parquet"

    seeds = [derive_seed(cfg.seed, f"eval/math500/{row['id']}") for row in rows[:2]]
    texts = {seeds[0]: [f"</think>\\boxed{{{rows[0]['answer']}}}"] * 3 + ["</think>\\boxed{no}"],
             seeds[1]: ["</think>\\boxed{no}"] * 4}
    assert evaluate(cfg, lambda *args: ScriptedSampler(texts)).complete
    metrics = json.loads((eval_dir(cfg, "math500") / "metrics.json").read_text())
    assert metrics["correct_counts"] == {rows[0]["id"]: 3, rows[1]["id"]: 0}
