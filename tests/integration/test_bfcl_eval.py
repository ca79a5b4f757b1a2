"""BFCL evaluation end to end on CPU: real BFCL live and irrelevance questions, prompted with a tools-aware chat
template, sampled from a tiny random Qwen3 (HF backend), judged by BFCL's checker in its venv (skips without it)."""
from __future__ import annotations

import json

from bench.tiny_model import build_tiny_qwen3
from common.config.data import CHATML_TOOLS_TEMPLATE
from eval.bfcl.checker import LIVE_CATEGORIES, evaluate
from eval.sample import make_sampler
from common.config import compose
from common.models import load_tokenizer


def test_tiny_model_on_bfcl_subset(tmp_path, checker):
    model = build_tiny_qwen3(tmp_path / "tiny")
    tokenizer = load_tokenizer(str(model))
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.save_pretrained(model)
    cfg = compose([f"experiment.run_root={tmp_path}", "data=openr1_local", "data.path=unused.parquet",
                   f"eval.model_path={model}", "eval.variant=tiny", "eval.backend=hf", "eval.temperature=0",
                   "eval.max_tokens=6", "logging.progress=false"])
    sampler = make_sampler(str(model), cfg, max_model_len=0)
    categories = [*LIVE_CATEGORIES, "live_irrelevance"]
    records, table = evaluate(sampler, load_tokenizer(str(model)), checker, categories, max_per_category=2)
    sampler.close()
    assert [r["category"] for r in records] == [c for c in categories for _ in range(2)]
    first = checker.entries("live_simple")[0]
    prompt = load_tokenizer(str(model)).apply_chat_template(first["question"][0], tools=first["function"],
                                                            add_generation_prompt=True, tokenize=False)
    assert json.dumps(first["function"][0]) in prompt
    # six random tokens never form a tool call: every live question fails, every irrelevance question passes
    assert all(not r["valid"] for r in records if r["category"] in LIVE_CATEGORIES)
    assert all(r["valid"] for r in records if r["category"] == "live_irrelevance")
    assert table["bfcl_live"] == 0.0 and table["bfcl_live_total"] == 8
    assert table["irrelevance_detection"] == 100.0 and table["irrelevance_set"] == "live_irrelevance"
