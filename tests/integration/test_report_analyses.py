"""The report stage's analyses on a constructed run tree: a tiny random Qwen3 as the toy base model, two "SFT
exports" (the base with perturbed weights), an EKSFT metrics log, a tokenised SFT row and sweep evaluations."""
from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bench.tiny_model import build_tiny_qwen3
from report import run as report
from report.sections.iou import iou_section
from common.config import compose
from common.config.sft import EKSFTMethod
from common.manifest import stage_run
from common.paths import base_model_path, eval_run, hf_export_dir, report_dir, sft_run, sft_tokens_path, toy_base_dir
from common.grid import arm, arm_named, experiment_grid, with_method

pytestmark = pytest.mark.integration


def _complete(folder, stage, config=None):
    with stage_run(folder, stage=stage, variant="test", config=config or {"folder": str(folder)},
                   announce=lambda _: None):
        pass


def _complete_sft(cfg, method):
    """A complete SFT run of ``method`` whose manifest records its identity (and so its method); returns its arm."""
    spec = sft_run(with_method(cfg, method))
    _complete(spec.directory, "sft", spec.config)
    return arm(cfg, method)


def _export(base, folder, scale, seed):
    """The base model with every weight moved by N(0, scale²)·|w| (a stand-in for an SFT run's output)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale * parameter.abs())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)


def _build_tree(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft,eksft]", "logging.progress=false",
                   "report.analysis.case_study_max_tokens=12"])
    base = build_tiny_qwen3(base_model_path(cfg), dtype="float32")
    _complete(toy_base_dir(cfg), "base")
    for label, scale in (("sft", 0.05), ("eksft", 0.005)):
        folder = arm_named(cfg, label).sft
        _export(base, hf_export_dir(folder), scale, seed=len(label))
        _complete_sft(cfg, arm_named(cfg, label).method)
    log = [{"step": 1, "stats/iou": 0.0, "stats/num_T": 40, "stats/num_M_H": 8, "stats/num_M_KL": 0, "stats/num_M": 8},
           {"step": 2, "stats/iou": 0.2, "stats/num_T": 40, "stats/num_M_H": 8, "stats/num_M_KL": 8, "stats/num_M": 12},
           {"step": 3, "stats/iou": 0.6, "stats/num_T": 40, "stats/num_M_H": 8, "stats/num_M_KL": 8, "stats/num_M": 10}]
    (arm_named(cfg, "eksft").sft / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    (arm_named(cfg, "sft").sft / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Compute 3 + 4 * 5."}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer("4 * 5 = 20. 3 + 20 = 23. The answer is \\boxed{23}.<|im_end|>",
                             add_special_tokens=False)["input_ids"]
    tokens = sft_tokens_path(cfg)
    tokens.parent.mkdir(parents=True)
    pq.write_table(pa.table({"row_id": ["row-0"], "input_ids": [prompt_ids + response_ids],
                             "labels": [[-100] * len(prompt_ids) + response_ids]}), tokens)

    # two sweep points: SFT runs of the same config with another rho (the report finds them by their manifests)
    points = [_complete_sft(cfg, EKSFTMethod(rho=rho)) for rho in (0.1, 0.4)]
    for evaluated, counts in ((arm_named(cfg, "base"), [0, 2]), (arm_named(cfg, "sft"), [1, 4]),
                              (arm_named(cfg, "eksft"), [2, 3]), (points[0], [1, 3]), (points[1], [0, 1])):
        for bench in ("toy_add", "toy_mixed"):
            folder = eval_run(cfg, "sft", evaluated.variant, bench, evaluated.sft).directory
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"n": 4, "correct_counts": {"p1": counts[0],
                                                                                      "p2": counts[1]}}))
    return cfg


def test_report_renders_every_analysis(tmp_path):
    cfg = _build_tree(tmp_path)
    manifest = report.run(cfg)
    out = report_dir(cfg)
    text = (out / "report.md").read_text()
    for relative in ("plots/drift_Toy-Qwen3-0.8M_sft_layers.png", "plots/drift_Toy-Qwen3-0.8M_sft_fraction.png",
                     "plots/iou_Toy-Qwen3-0.8M.png", "plots/iou_Toy-Qwen3-0.8M_mask_fractions.png",
                     "plots/case_study_Toy-Qwen3-0.8M.png", "case_study_Toy-Qwen3-0.8M.html",
                     "plots/sweep_Toy-Qwen3-0.8M_sft_eksft_rho.png", "sweep_Toy-Qwen3-0.8M_sft_eksft_rho.md",
                     "plots/curves_Toy-Qwen3-0.8M_sft.png"):
        assert f"({relative})" in text, relative
        assert (out / relative).stat().st_size > 300, relative
        assert relative in manifest.outputs
    assert "Phase rl: skipped, no complete RL export" in text

    drift = json.loads((out / "drift_Toy-Qwen3-0.8M_sft.json").read_text())["methods"]
    # Weights moved by 5% vs 0.5% of their size: the SFT export drifts ~10x more, and nearly every weight of both
    # moved by more than 0.1% of itself (|N(0,1)|·scale > 1e-3 fails only for |N| < 0.02 resp. 0.2).
    assert drift["SFT"]["relative_change"] == pytest.approx(10 * drift["EKSFT (paper eq.)"]["relative_change"], rel=0.1)
    assert drift["SFT"]["fraction_above_threshold"] > 0.95 > drift["EKSFT (paper eq.)"]["fraction_above_threshold"] > 0.8

    # Step 1 (empty M_KL) is left out: min 0.2, avg 0.4, max 0.6 over steps 2-3; the plain SFT run has no IoU.
    assert "| EKSFT (paper eq.) | 2 | 0.20 | 0.40 | 0.60 |" in (out / "iou_Toy-Qwen3-0.8M.md").read_text()
    assert "| SFT |" not in (out / "iou_Toy-Qwen3-0.8M.md").read_text()

    case = json.loads((out / "case_study_Toy-Qwen3-0.8M.json").read_text())
    assert list(case["probabilities"]) == ["Base", "SFT", "EKSFT (paper eq.)"] and len(case["tokens"]) == 12
    assert all(0 < p < 1 for values in case["probabilities"].values() for p in values)
    assert "".join(case["tokens"]) == "4 * 5 = 20. 3 +"

    # Sweep rows rho = 0.1, 0.2 (the default label eksft), 0.4; Avg pass@1 = mean of (c1 + c2) / 8 over benchmarks.
    sweep = (out / "sweep_Toy-Qwen3-0.8M_sft_eksft_rho.md").read_text()
    assert sweep.splitlines()[0].startswith("| rho | Toy-Add pass@1 | Toy-Add pass@4 |")
    assert [line.split(" | ")[0] for line in sweep.splitlines()[3:]] == ["| 0.1", "| 0.2", "| 0.4"]
    # rho 0.2 (counts 2, 3 of 4) leads pass@1 with 62.5 [50, 75] but overlaps rho 0.1's [25, 75]: n.s., no marks;
    # rho 0.4 (0, 1 of 4): 12.5 [0, 25] and pass@4 50 [0, 100]. A sweep has no SFT row, so no Δ lines.
    assert "| 0.2 | 62.5 [50.0, 75.0] n.s. | 100.0 [100.0, 100.0] n.s. |" in sweep
    assert "| 0.4 | 12.5 [0.0, 25.0] | 50.0 [0.0, 100.0] | 12.5 [0.0, 25.0] |" in sweep and "Δ" not in sweep
    assert report.run(cfg).run_id == manifest.run_id  # unchanged inputs: skipped


class _Outputs:
    """Records what a report section declares as outputs (the part of a stage run it uses)."""

    def __init__(self):
        self.outputs = {}

    def add_output(self, relative, description):
        self.outputs[relative] = description


def test_iou_gives_every_seed_its_own_row(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft,eksft]", "experiment.seeds=[0,1]",
                   "logging.progress=false"])
    for seed, ious in ((0, (0.2, 0.6)), (1, (0.5, 0.7))):
        folder = _complete_sft(replace(cfg, seed=seed), arm_named(cfg, "eksft").method).sft
        hf_export_dir(folder).mkdir(parents=True)
        log = [{"step": step, "stats/iou": iou} for step, iou in enumerate(ious, 1)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    out = tmp_path / "report"
    lines, summaries = iou_section(cfg, experiment_grid(cfg).models[0], out, _Outputs())
    # Issue 43: the toy's IoU (0.97) beside the paper's 0.50 with no word on why; now one sentence says it.
    assert any("Paper (Qwen3, ρ = 0.2): min 0.09, avg 0.50, max 0.59. Why a toy model's IoU is far above the "
               "paper's 0.50" in line for line in lines)
    assert {label: (s["min"], s["max"]) for label, s in summaries.items()} == {
        "EKSFT (paper eq.), seed 0": (0.2, 0.6), "EKSFT (paper eq.), seed 1": (0.5, 0.7)}
    assert "| EKSFT (paper eq.), seed 1 | 2 | 0.50 | 0.60 | 0.70 |" in (out / "iou_Toy-Qwen3-0.8M.md").read_text()
