"""The extra benchmarks (``data.extra_benchmarks``: aime26, hmmt_feb26) on local fixture files in the MathArena hub
sets' schema (tests/assets/matharena_2026: synthetic problems; ``problem_idx`` int, ``answer`` an int for AIME and a
LaTeX string for HMMT, ``problem_type`` for HMMT; 30 and 33 rows as the cards say): the loader, the scorer on
expression answers, their own run, and an evaluation that reads it while the data run keeps its identity."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.tiny_model import build_tiny_qwen3
from common.benchmarks import read_benchmark, write_benchmark
from common.config import compose
from common.manifest import read_manifest, stage_run
from common.paths import (
    benchmark_file,
    benchmark_path,
    data_run,
    eval_dir,
    extra_benchmark_run,
    selected_extra_benchmarks,
)
from common.seeding import derive_seed
from data.benchmarks import load_benchmark
from data.prepare import write_extra_benchmark
from eval.run import run as evaluate
from eval.scoring import verify
from eval_helpers import ScriptedSampler

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parents[1] / "assets" / "matharena_2026"
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def _config(root: Path, *overrides: str):
    return compose([f"experiment.run_root={root}", "data=openr1_local", "data.path=unused.parquet",
                    f"data.benchmark_dir={FIXTURES}", *overrides])


@pytest.mark.parametrize("name, count, first_answer", [("aime26", 30, "48"), ("hmmt_feb26", 33, "-\\frac{1}{21}")])
def test_the_fixtures_load_with_the_cards_counts_and_fields(tmp_path, name, count, first_answer):
    cfg = _config(tmp_path).data
    source = cfg.extra_benchmarks[name]
    assert (source.hub_split, source.problem_field, source.answer_field, source.id_field) == (
        "train", "problem", "answer", "problem_idx")
    records, provenance = load_benchmark(name, source, cfg)
    assert len(records) == count == source.expected_count and provenance["kind"] == "local"
    assert [r["id"] for r in records] == [str(i) for i in range(1, count + 1)]
    assert records[0]["answer"] == first_answer  # AIME's int64 answer as a plain integer string


def test_every_fixture_gold_is_scored_by_the_same_scorer_and_expressions_match_their_equivalents():
    for name in ("aime26", "hmmt_feb26"):
        golds = [str(json.loads(line)["answer"]) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
        assert all(verify(f"The answer is \\boxed{{{gold}}}.", gold) == 1.0 for gold in golds), name
    # HMMT answers are expressions: an equivalent form is right, a different value is wrong.
    for predicted, gold, verdict in (("-1/21", "-\\frac{1}{21}", 1.0), ("\\frac{1}{21}", "-\\frac{1}{21}", 0.0),
                                     ("\\frac{1}{\\sqrt[3]{3+\\sqrt{6}}}", "(3+\\sqrt{6})^{-1/3}", 1.0),
                                     ("\\sqrt{12}", "2\\sqrt{3}", 1.0), ("2\\sqrt{2}", "2\\sqrt{3}", 0.0),
                                     ("\\frac{9}{\\sqrt{23}}", "\\frac{9 \\sqrt{23}}{23}", 1.0)):
        assert verify(f"\\boxed{{{predicted}}}", gold) == verdict, (predicted, gold)


def test_registering_or_selecting_an_extra_benchmark_changes_no_run_identity(tmp_path):
    plain = _config(tmp_path, "data.extra_benchmarks={}")
    selected = _config(tmp_path, "eval.benchmarks=[aime24,aime25,amc,hmmt25,aime26,hmmt_feb26]")
    assert data_run(plain).directory == data_run(selected).directory
    assert selected_extra_benchmarks(selected) == ["aime26", "hmmt_feb26"] and not selected_extra_benchmarks(plain)
    run = extra_benchmark_run(selected, "hmmt_feb26")
    assert run.directory.parent == tmp_path / "table1" / "benchmarks" and run.config["data"] == data_run(plain).variant
    assert benchmark_path(selected, "hmmt_feb26") == run.directory / benchmark_file("hmmt_feb26")
    assert benchmark_path(selected, "aime24") == data_run(plain).directory / benchmark_file("aime24")


def test_an_extra_benchmark_has_its_own_run_and_is_evaluated_from_it(tmp_path):
    model = build_tiny_qwen3(tmp_path / "model", think_prompt=True)
    cfg = _config(tmp_path, "eval.benchmarks=[hmmt_feb26]", f"eval.model_path={model}", "eval.variant=tiny",
                  "eval.n=2", "eval.max_problems=2", "eval.max_tokens=16", "eval.kv_cache_memory_bytes=67108864",
                  "logging.progress=false")
    data = data_run(cfg)  # a finished data run: its own benchmark written with the system prompt
    with stage_run(data.directory, stage="data", variant=data.variant, config=data.config, inputs={}) as run:
        write_benchmark(data.directory / benchmark_file("aime24"),
                        [{"id": "a", "problem": "P?", "answer": "1", "answer_raw": "1"}], SYSTEM)
        run.add_output(benchmark_file("aime24"), "benchmark aime24")
    manifest = write_extra_benchmark(cfg, "hmmt_feb26")
    assert manifest.complete and manifest.metrics["num_problems"] == 33
    rows = read_benchmark(benchmark_path(cfg, "hmmt_feb26"))
    assert rows[0]["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": rows[0]["problem"]}]
    assert write_extra_benchmark(cfg, "hmmt_feb26").run_id == manifest.run_id  # complete and unchanged: skipped

    seed = {row["id"]: derive_seed(cfg.seed, f"eval/hmmt_feb26/{row['id']}") for row in rows[:2]}
    texts = {seed["1"]: ["</think>\\boxed{-1/21}", "</think>\\boxed{1/21}"],  # gold -\frac{1}{21}
             seed["2"]: ["</think>\\boxed{420261}", "</think>\\boxed{420262}"]}
    summary = evaluate(cfg, lambda *args: ScriptedSampler(texts))
    out = eval_dir(cfg, "hmmt_feb26")
    metrics = json.loads((out / "metrics.json").read_text())
    assert summary.complete and metrics["correct_counts"] == {"1": 1, "2": 1}
    recorded = read_manifest(out)
    assert recorded.config["benchmark_run"] == extra_benchmark_run(cfg, "hmmt_feb26").directory.name
    assert set(recorded.inputs) == {"benchmarks", "benchmark", "model"}
