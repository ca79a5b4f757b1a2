"""The evaluation stage's bfcl family (``eval.bfcl.evaluate``, issue 16): per-category samples.jsonl and metrics.json
judged by BFCL's real checker, resumed after a crash without re-sampling finished questions, skipped when complete.

The sampler is scripted (fixed texts, so the verdicts are known: text with no ``<tool_call>`` decodes to no call,
which BFCL's checker rejects on live categories and accepts on irrelevance); the checker is BFCL's own (skips
without ``make bfcl-env``)."""
from __future__ import annotations

import json

import pytest

from bench.tiny_model import build_tiny_tokenizer
from common.config import compose
from common.config.data import CHATML_TOOLS_TEMPLATE
from common.paths import eval_dir
from data import prepare
from eval.bfcl.evaluate import run_bfcl
from eval.sample import Completion

REFUSAL = "None of the available functions can do that."


class ScriptedSampler:
    backend, version, settings = "scripted", "0", {}

    def __init__(self, calls: list[int], fail_on_call: int | None = None):
        self.calls, self.fail_on_call = calls, fail_on_call

    def sample(self, prompts, seeds, n, finished=None):
        self.calls.append(len(prompts))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("engine died")
        return [[Completion(REFUSAL, 9, "stop")] for _ in prompts]

    def close(self):
        pass


@pytest.fixture
def cfg(tmp_path):
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "tok")
    cfg = compose(["experiment=bfcl", "profile=toy", "data=synthetic_tools", "data.num_sft_rows=5",
                   f"experiment.run_root={tmp_path / 'runs'}", f"eval.model_path={tmp_path / 'tok'}",
                   "eval.variant=probe", "eval.max_problems=3", "eval.problems_per_batch=1", "eval.backend=hf",
                   "eval.benchmarks=[live_simple,live_irrelevance]", "logging.progress=false"])
    prepare.run(cfg)
    return cfg


def test_bfcl_family_resumes_after_a_crash_and_skips_when_complete(cfg, checker):
    calls: list[int] = []
    with pytest.raises(RuntimeError, match="engine died"):
        run_bfcl(cfg, lambda *args: ScriptedSampler(calls, fail_on_call=2), checker)
    simple_dir = eval_dir(cfg, "live_simple")
    assert len((simple_dir / "samples.jsonl").read_text().splitlines()) == 1
    assert json.loads((simple_dir / "manifest.json").read_text())["status"] == "failed"

    calls.clear()
    summary = run_bfcl(cfg, lambda *args: ScriptedSampler(calls), checker)
    assert calls == [1, 1, 1, 1, 1]  # live_simple: the 2 missing questions; live_irrelevance: all 3
    assert summary.status == "complete"
    simple = json.loads((simple_dir / "metrics.json").read_text())
    records = [json.loads(line) for line in (simple_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["problem_id"] for r in records] == list(simple["correct_counts"]) and len(records) == 3
    assert all(not r["valid"] and r["error_type"] and r["correct"] == 0 for r in records)
    assert (simple["accuracy"], simple["interval"], simple["correct"], simple["total"]) == (0.0, [0.0, 0.0], 0, 3)
    irrelevance = json.loads((eval_dir(cfg, "live_irrelevance") / "metrics.json").read_text())
    assert (irrelevance["accuracy"], irrelevance["correct"], irrelevance["total"]) == (100.0, 3, 3)
    assert irrelevance["protocol"]["bfcl_eval_version"] == "2026.3.23"
    assert irrelevance["protocol"]["irrelevance_set"] == "live_irrelevance"
    manifest = json.loads((simple_dir / "manifest.json").read_text())
    assert manifest["details"]["irrelevance_set"] == "live_irrelevance" and manifest["status"] == "complete"
    assert summary.metrics["bfcl"]["bfcl_live"] == 0.0 and summary.metrics["bfcl"]["irrelevance_detection"] == 100.0

    calls.clear()
    again = run_bfcl(cfg, lambda *args: ScriptedSampler(calls), checker)
    assert calls == [] and again.metrics["live_simple"]["accuracy"] == 0.0
