"""What a plan will cost, printed before it starts (pipeline.estimates; issue 43: the paper dry run gave no GPU-hours,
long commands no time): measured rates times the plan's size, by hand."""
from __future__ import annotations

import json

import pytest

from common.config import compose
from common.preflight import model_parameters
from pipeline import estimates
from pipeline.run import run
from pipeline.stages import build_plan


def test_the_toy_estimate_sums_the_demos_measured_stage_times(tmp_path, capsys):
    overrides = ["experiment=demo", f"experiment.run_root={tmp_path}", "dry_run=true"]
    plan = build_plan(compose(overrides), overrides)
    # data, base, tokens, 2 SFT, 3 x 3 Table 1 evaluations, 2 DAPO runs, 2 x 3 Table 2 evaluations, report
    work = 7 + 383 + 10 + 2 * 112 + 9 * 27 + 2 * 669 + 6 * 20 + 22
    assert estimates.toy_minutes(plan, parallel=2) == pytest.approx(work * 1400 / 2347 / 60)
    assert estimates.toy_minutes(plan, parallel=1) == pytest.approx(work / 60)
    run(compose(overrides), overrides)
    assert "estimate: about 23 min for the 13 pending commands on a quiet 2-core CPU" in capsys.readouterr().out


def test_the_gpu_estimate_bounds_the_sft_runs_gpu_hours(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "num_key_value_heads": 2, "intermediate_size": 128,
                                                   "vocab_size": 1000, "tie_word_embeddings": True}))
    overrides = ["profile=paper", "experiment=table1", "profile.models=[qwen3_4b]", f"model.path={model}",
                 "experiment.methods=[sft,eksft]", "data.num_sft_rows=100", "sft.epochs=2", "data.max_length=1000",
                 f"experiment.run_root={tmp_path / 'runs'}", "dry_run=true"]
    cfg = compose(overrides)
    plan = build_plan(cfg, overrides)
    params = model_parameters(cfg)
    # 6 · P · (100 rows · 2 epochs · 1000 tokens) per SFT run, EKSFT's at 1.48 times SFT's step, at 31.4% of 989 TFLOP/s
    expected = 6 * params * 200 * 1000 * (1 + 1.48) / (0.314 * 989e12) / 3600
    assert estimates.sft_gpu_hours(plan) == pytest.approx(expected)
    capped = [*overrides, "sft.max_steps=1", "sft.grad_accum=4", "profile.nproc_per_node=1"]  # 1 step: 4 rows < 200
    assert estimates.sft_gpu_hours(build_plan(compose(capped), capped)) == pytest.approx(expected * 4 / 200)
    run(cfg, overrides)
    assert "estimate: SFT at most 0 GPU-hours (H100/H200 at SFT's measured 31% MFU" in capsys.readouterr().out
