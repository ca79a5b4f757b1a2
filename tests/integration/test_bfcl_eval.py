"""BFCL evaluation end to end on CPU: real BFCL live and irrelevance questions, prompted with a tools-aware chat
template, sampled from a tiny random Qwen3 (HF backend) by the evaluation stage's BFCL family, judged by BFCL's
checker in its venv (skips without it)."""
from __future__ import annotations

import json

from bench.tiny_model import build_tiny_qwen3
from common.config import compose
from common.config.data import CHATML_TOOLS_TEMPLATE, LIVE_CATEGORIES
from common.models import load_tokenizer
from common.paths import EVAL_METRICS_FILE, SAMPLES_FILE, eval_dir
from data import prepare
from eval.bfcl.evaluate import run_bfcl
from eval.sample import make_sampler


def test_tiny_model_on_bfcl_subset(tmp_path, checker):
    model = build_tiny_qwen3(tmp_path / "tiny")
    tokenizer = load_tokenizer(str(model))
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.save_pretrained(model)
    categories = [*LIVE_CATEGORIES, "live_irrelevance"]
    cfg = compose(["experiment=bfcl", "profile=toy", "data=synthetic_tools", "data.num_sft_rows=5",
                   f"experiment.run_root={tmp_path / 'runs'}", f"eval.model_path={model}", "eval.variant=tiny",
                   "eval.backend=hf", "eval.temperature=0", "eval.max_tokens=6", "eval.max_problems=2",
                   f"eval.benchmarks=[{','.join(categories)}]", "logging.progress=false"])
    prepare.run(cfg)
    summary = run_bfcl(cfg, make_sampler, checker)
    records = {c: [json.loads(line) for line in (eval_dir(cfg, c) / SAMPLES_FILE).read_text()
                   .splitlines()] for c in categories}
    assert [len(found) for found in records.values()] == [2] * len(categories)
    first = checker.entries("live_simple")[0]
    prompt = load_tokenizer(str(model)).apply_chat_template(first["question"][0], tools=first["function"],
                                                            add_generation_prompt=True, tokenize=False)
    assert json.dumps(first["function"][0]) in prompt
    # six random tokens never form a tool call: every live question fails, every irrelevance question passes
    assert all(not r["valid"] for c in LIVE_CATEGORIES for r in records[c])
    assert all(r["valid"] for r in records["live_irrelevance"])
    table = summary.metrics["bfcl"]
    assert table["bfcl_live"] == 0.0 and table["bfcl_live_total"] == 8
    assert table["irrelevance_detection"] == 100.0 and table["irrelevance_set"] == "live_irrelevance"
    metrics = json.loads((eval_dir(cfg, "live_simple") / EVAL_METRICS_FILE).read_text())
    assert metrics["total"] == 2 and metrics["protocol"]["n"] == 1
