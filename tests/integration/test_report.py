"""The report stage: tables, plots and report.md from the eval stages' metrics files of an experiment."""
from __future__ import annotations

import datetime
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from eval.intervals import cluster_spearman
from report import run as report
from common.config import compose
from common import manifest as manifest_module
from common.manifest import Manifest, is_current, read_manifest, write_manifest
from common.paths import RL_DISCARDED_GROUPS, RL_GROUPS_KEPT, eval_run, report_dir
from common.grid import arm_named, report_run
from wandb_helpers import offline_record

pytestmark = pytest.mark.integration


def _write_metrics(cfg, phase, variant, benchmark, counts: dict[str, int], n: int = 4, **extra) -> None:
    folder = eval_run(cfg, phase, variant, benchmark, arm_named(cfg, variant).model(phase)).directory
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"n": n, "correct_counts": counts, **extra}))


def test_report_stage_on_the_toy_world(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft,eksft]"])
    for variant, counts in (("base", {"p1": 0, "p2": 4}), ("sft", {"p1": 1, "p2": 4}), ("eksft", {"p1": 2, "p2": 3})):
        for bench in ("toy_add", "toy_mixed"):
            _write_metrics(cfg, "sft", variant, bench, counts)
    manifest = report.run(cfg)
    out = report_dir(cfg)
    table = (out / "table1.md").read_text()
    # Columns named by the config; the second metric is pass@4 because only 4 samples were drawn (table_k is 32).
    assert table.splitlines()[0] == ("| Method | Toy-Add pass@1 | Toy-Add pass@4 | Toy-Mixed pass@1 | "
                                     "Toy-Mixed pass@4 | Avg pass@1 | Avg pass@4 |")
    # pass@1 per problem: base (0, 1), sft (1/4, 1), eksft (1/2, 3/4). A resample of two problems averages two
    # draws, so the 2.5th/97.5th percentiles are the smaller / larger value: base [0, 100], sft [25, 100],
    # eksft [50, 75]. SFT and EKSFT tie at 62.5 (pass@4 at 100): not separated, so "n.s." and no mark below.
    assert ("| SFT | 62.5 [25.0, 100.0] n.s. | 100.0 [100.0, 100.0] n.s. | 62.5 [25.0, 100.0] n.s. |") in table
    assert "| Base | 50.0 [0.0, 100.0] | 50.0 [0.0, 100.0] |" in table
    # Paired differences to SFT on the same resampled problems: eksft − sft = (+1/4, −1/4) -> [−25, +25];
    # base − sft = (−1/4, 0) -> mean −12.5, [−25, 0]; pass@4: (−1, 0) -> −50 [−100, 0].
    lines = table.splitlines()
    eksft = lines.index(next(line for line in lines if line.startswith("| EKSFT (paper eq.) |")))
    # The default primary endpoints are Avg pass@1 and Avg pass@32 of every method but SFT: EKSFT's Avg pass@1 Δ
    # (one seed: no t-test, so no p) and no pass@32 column (4 samples); Base and every other cell are exploratory.
    assert lines[eksft + 1] == ("| <sub>Δ vs SFT</sub> | <sub>+0.0 [−25.0, +25.0] expl.</sub> | "
                                "<sub>+0.0 [+0.0, +0.0] expl.</sub> | <sub>+0.0 [−25.0, +25.0] expl.</sub> | "
                                "<sub>+0.0 [+0.0, +0.0] expl.</sub> | <sub>+0.0 [−25.0, +25.0] p(Holm) n/a</sub> | "
                                "<sub>+0.0 [+0.0, +0.0] expl.</sub> |")
    assert ("| <sub>Δ vs SFT</sub> | <sub>−12.5 [−25.0, +0.0] expl.</sub> | "
            "<sub>−50.0 [−100.0, +0.0] expl.</sub> |") in table
    assert sum(line.startswith("| <sub>Δ vs SFT") for line in lines) == 2  # base and eksft, not sft itself
    assert not (out / "table2.md").exists()
    text = (out / "report.md").read_text()
    assert "only ours are shown" in text and "plots/passk_Toy-Qwen3-0.8M_sft_toy_add.png" in text
    assert ("Primary comparisons (`report.primary_endpoints.sft`: Avg pass@1, Avg pass@32; the primary arms' Δ cells, "
            "marked p(Holm)): 1, of which 0 with a p-value") in text
    assert "p(Holm) ≤ 0.05: none. Declared endpoints this table has no cell for: Avg pass@32." in text
    assert "Unjudged samples" in text and "scored 0 above): 0 of 48; 0 re-judged." in text  # 3 rows x 2 x 2 x 4
    assert (out / "plots" / "passk_Toy-Qwen3-0.8M_sft_toy_add.png").stat().st_size > 1000
    assert manifest.complete
    assert read_manifest(out).complete
    assert report.run(cfg).run_id == manifest.run_id  # unchanged inputs: skipped


def test_report_aggregates_seeds(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft,eksft]",
                   "experiment.seeds=[3,7]", "report.analysis.run=[]"])
    # One problem per benchmark, n = 4; per seed (3, 7) the correct count.
    counts = {"base": (0, 0), "sft": (1, 3), "eksft": (2, 4)}
    for variant, (first, second) in counts.items():
        for seed, count in ((3, first), (7, second)):
            for bench in ("toy_add", "toy_mixed"):
                _write_metrics(replace(cfg, seed=seed), "sft", variant, bench, {"p": count})
    manifest = report.run(cfg)
    out = report_dir(cfg)
    table = (out / "table1.md").read_text()
    # Resampling two seeds gives (a, a), (a, b), (b, a) or (b, b): the interval spans the two seeds' values.
    # sft: 25 and 75 -> 50 [25, 75]; eksft: 50 and 100 -> 75 [50, 100]; they overlap: n.s. The seed-level
    # t-interval: sd 35.36, t_{0.975, 1} = 12.706, half-width 12.706 · 35.36 / sqrt(2) = 317.7: what two seeds say.
    assert "| SFT | 50.0 [25.0, 75.0] ⟨−267.7, 367.7⟩ |" in table
    assert "| EKSFT (paper eq.) | 75.0 [50.0, 100.0] ⟨−242.7, 392.7⟩ n.s. |" in table
    # Paired per seed: eksft − sft = +25 for both seeds -> +25 [+25, +25] (unpaired intervals overlap).
    assert "| <sub>Δ vs SFT</sub> | <sub>+25.0 [+25.0, +25.0] ⟨+25.0, +25.0⟩ expl.</sub> |" in table
    # Avg pass@1 is a primary endpoint: both seeds' differences are +25, so sd = 0 and the t-test says nothing
    # (issue 40: it used to print p = 0); the CSV and the metrics say "no spread" too.
    assert "<sub>+25.0 [+25.0, +25.0] ⟨+25.0, +25.0⟩ p(Holm) n/a (no spread)</sub>" in table
    rows = (out / "table1.csv").read_text().splitlines()
    assert rows[0].endswith(",num_seeds,seed_t_low,seed_t_high,delta_seed_t_low,delta_seed_t_high,delta_p_t,"
                            "delta_role,delta_p_holm,seed 3,seed 7")
    assert ("Toy-Qwen3-0.8M,SFT,sft,Toy-Add,pass@1,50.0000,25.0000,75.0000,,,,,,,2,-267.6551,367.6551,,,,,,"
            "25.0000,75.0000") in rows
    assert "mean [95% interval] over seeds 3, 7 and problems" in (out / "report.md").read_text()
    eksft = manifest.metrics["sft"]["Toy-Qwen3-0.8M/EKSFT (paper eq.)"]
    assert eksft["Avg pass@1"] == 75.0 and eksft["Avg pass@1 95%"] == [50.0, 100.0]
    assert eksft["Avg pass@1 Δ vs reference"] == [25.0, 25.0, 25.0]
    assert eksft["Avg pass@1 seed t 95%"] == pytest.approx([75 - 317.655, 75 + 317.655], abs=1e-3)
    assert eksft["Avg pass@1 Δ vs reference seed t 95%"] == [25.0, 25.0]
    assert eksft["Avg pass@1 Δ vs reference p(Holm)"] == "no spread" and "Avg pass@4 Δ vs reference p(Holm)" not in eksft


def test_a_table_caption_names_the_seeds_it_holds(tmp_path):
    # With seed 7 not evaluated yet, the caption said "over seeds 3, 7" (a line further down named the missing seed).
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft]", "experiment.seeds=[3,7]",
                   "report.analysis.run=[]"])
    for variant in ("base", "sft"):
        for bench in ("toy_add", "toy_mixed"):
            _write_metrics(replace(cfg, seed=3), "sft", variant, bench, {"p": 1})
    report.run(cfg)
    text = (report_dir(cfg) / "report.md").read_text()
    assert "mean [95% interval] over seed 3 and problems" in text
    assert "Seeds missing (cells use the seeds present): Toy-Qwen3-0.8M / Base / Toy-Add: seed 7" in text


def test_report_sums_the_run_times_its_evaluations_record(tmp_path):
    # Two evaluations with manifests: base one attempt of 30 s; sft interrupted after 20 s and resumed an hour later
    # for 10 s. Work 30 + 30; working time 60 s (no overlap), not the hour between the sft attempts.
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft]", "report.analysis.run=[]",
                   "eval.benchmarks=[toy_add]"])
    attempts = {"base": [("10:00:00", "10:00:30", "complete")],
                "sft": [("10:01:00", "10:01:20", "interrupted"), ("11:01:00", "11:01:10", "complete")]}
    for variant, spans in attempts.items():
        _write_metrics(cfg, "sft", variant, "toy_add", {"p": 1})
        folder = eval_run(cfg, "sft", variant, "toy_add", arm_named(cfg, variant).model("sft")).directory
        stamps = [{"started_at": f"2026-11-26T{start}+00:00", "ended_at": f"2026-11-26T{end}+00:00",
                   "status": status} for start, end, status in spans]
        write_manifest(folder, Manifest(stage="eval_sft", variant=variant, status="complete", attempts=stamps,
                                        git={"commit": "0123456789abcdef", "dirty": False},
                                        machine={"cpu": "AMD EPYC", "cpus": 2, "cpu_flags": ["avx2"]}))
    manifest = report.run(cfg)
    text = (report_dir(cfg) / "report.md").read_text()
    runs = text[text.index("## Runs"):]
    assert "* Commit: 0123456 (all 2 runs)" in runs and "* Machine: AMD EPYC, 2 CPUs (avx2) (all 2 runs)" in runs
    assert "* Working time: **1.0 min** (60 s)" in runs and "| eval_sft | 2 | 3 | 60 | 30 |" in runs
    assert manifest.metrics["runs"]["working_s"] == 60 and "run_times.csv" in manifest.outputs


def test_report_counts_the_samples_left_unjudged_under_each_table(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft]", "report.analysis.run=[]"])
    for variant in ("base", "sft"):
        for bench in ("toy_add", "toy_mixed"):
            extra = {}
            if (variant, bench) == ("sft", "toy_mixed"):  # evaluated before re-judging existed: 3 never re-judged
                extra = {"time_limited_samples": 3}
            elif (variant, bench) == ("base", "toy_add"):  # 2 re-judged, 1 of them still without a verdict
                extra = {"time_limited_samples": 1, "rejudged_samples": 2}
            else:
                extra = {"time_limited_samples": 0, "rejudged_samples": 0}
            _write_metrics(cfg, "sft", variant, bench, {"p1": 1, "p2": 0}, **extra)
    report.run(cfg)
    lines = (report_dir(cfg) / "report.md").read_text().splitlines()
    found = [line for line in lines if line.startswith("Unjudged samples")]
    assert len(found) == 1  # one table (no Table 2 evaluations), one line under it
    assert found[0] == ("Unjudged samples (no verdict within the scorer's time limit, nor when judged once more with "
                        "the longer `eval.rejudge_timeout_s`; scored 0 above): 4 of 32; 2 re-judged. By evaluation: "
                        "Toy-Qwen3-0.8M / Base / Toy-Add / seed 0: 1 of 8; Toy-Qwen3-0.8M / SFT / Toy-Mixed / seed 0: "
                        "3 of 8. Never re-judged (evaluated before re-judging existed; `python -m pipeline.run "
                        "force=[<eval command>]` samples and judges them again): Toy-Qwen3-0.8M / SFT / Toy-Mixed / "
                        "seed 0.")


def test_report_shows_the_papers_numbers_next_to_ours(tmp_path):
    cfg = compose(["profile=paper", "experiment=table1", f"experiment.run_root={tmp_path}"])
    _write_metrics(cfg, "sft", "eksft", "aime24", {"p": 16}, n=32)
    report.run(cfg)
    table = (report_dir(cfg) / "table1.md").read_text()
    # One row with values: nothing to rank, so no mark (issue 43: a one-row Table 2 had every cell bold).
    assert "| EKSFT (paper eq.) | 50.0 [50.0, 50.0] (45.7) | 100.0 [100.0, 100.0] (73.3) | – (33.4) |" in table
    assert "***Qwen3-8B***" in table
    assert "Missing evaluations" in (report_dir(cfg) / "report.md").read_text()


def test_report_training_curves_and_rl_headroom(tmp_path):
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft,eksft]", "experiment.rl_methods=[]",
                   "experiment.seeds=[0,1]", "report.analysis.run=[]", "rl.rollout_n=2",
                   "rl.micro_batch_size_per_gpu=16"])
    # One problem per benchmark (both benchmarks alike), n = 4: correct counts per (arm, seed) before / after RL.
    before = {"base": (0, 1), "sft": (2, 3), "eksft": (1, 2)}
    after = {"base": (2, 2), "sft": (3, 3), "eksft": (4, 3)}
    entropy = {"base": (1.0, 0.8), "sft": (0.6, 0.4), "eksft": (1.2, 0.9)}  # pre-RL, nats/token: the benchmarks' mean
    for phase, counts in (("sft", before), ("rl", after)):
        for variant, per_seed in counts.items():
            for seed, count in zip((0, 1), per_seed):
                for bench, shift in (("toy_add", 0.1), ("toy_mixed", -0.1)):
                    _write_metrics(replace(cfg, seed=seed), phase, variant, bench, {"p": count},
                                   mean_token_entropy_nats=entropy[variant][seed] + shift)
    for seed in (0, 1):
        scfg = replace(cfg, seed=seed)
        sft_log = [{"step": step, "loss": 2.0 / step, "stats/ce": 1.0 / step, "stats/entropy_mean_M": 1.0,
                    "stats/entropy_mean_rest": 0.5, "stats/kl_mean_M": 0.1 * step, "stats/kl_mean_rest": 0.01,
                    "stats/num_M": 10, "stats/num_T": 40} for step in (1, 2, 3)]
        folder = arm_named(scfg, "eksft").sft
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft_log))
        rl_log = [{"step": step, "critic/score/mean": 0.1 * step, "response_length/mean": 30.0, "actor/entropy": 0.9,
                   "timing_s/step": 5.0} for step in (1, 2)]
        rl_log[0][RL_DISCARDED_GROUPS] = 2 * cfg.rl.train_batch_size  # step 2 discarded none: it logs no count
        folder = arm_named(scfg, "sft").rl
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rl_log))
    manifest = report.run(cfg)
    out = report_dir(cfg)
    text = (out / "report.md").read_text()
    assert "![SFT training curves](plots/curves_Toy-Qwen3-0.8M_sft.png)" in text
    assert "![RL (DAPO) training curves](plots/curves_Toy-Qwen3-0.8M_rl.png)" in text
    assert "one line per run and seed (2 runs)" in text  # eksft, seeds 0 and 1 (the sft run logged nothing)
    assert "Not logged by any run: validation accuracy" in text
    for phase in ("sft", "rl"):
        assert (out / f"plots/curves_Toy-Qwen3-0.8M_{phase}.png").stat().st_size > 1000
    # pre-RL pass@1 (base, sft, eksft; seeds 0, 1) = 0, 25 | 50, 75 | 25, 50; gain = 50, 25 | 25, 0 | 75, 25;
    # pass@4 = 0 for base seed 0, else 100. Average ranks: pass@1 (1, 2.5, 4.5, 6, 2.5, 4.5), gain (5, 3, 3, 1, 6, 3):
    # ρ = −13 / sqrt(16.5 · 15.5); pass@4 ranks (1, 4, 4, 4, 4, 4): ρ = −4.5 / sqrt(7.5 · 15.5).
    headroom = manifest.metrics["headroom"]
    assert headroom["points"] == 6
    assert headroom["spearman_pass1"] == pytest.approx(-13 / (16.5 * 15.5) ** 0.5)
    assert headroom["spearman_pass_n"] == pytest.approx(-4.5 / (7.5 * 15.5) ** 0.5)
    # Its interval resamples the 3 arms (each with both its seeds), not the 6 pairs.
    arms = ["base", "base", "sft", "sft", "eksft", "eksft"]
    by_arms = cluster_spearman([0, 25, 50, 75, 25, 50], [50, 25, 25, 0, 75, 25], arms).estimate
    assert headroom["arms"] == 3 and headroom["spearman_pass1 95% arms"] == [by_arms.low, by_arms.high]
    assert f"| Avg pass@1 | -0.81 [{by_arms.low:+.2f}, {by_arms.high:+.2f}] |" in text
    assert "| Avg pass@n (k = n, all samples) | -0.42 [" in text
    # entropy 1.0, 0.8 | 0.6, 0.4 | 1.2, 0.9: ranks (5, 3, 2, 1, 6, 4) against the gain ranks: ρ = 15.5 / sqrt(17.5 · 15.5).
    assert headroom["spearman_entropy"] == pytest.approx(15.5 / (17.5 * 15.5) ** 0.5)
    assert "| mean sample entropy (nats/token) | +0.94 [" in text and "] (6 of 6 pairs) |" in text
    # Mixed groups of G = 2 of 4 samples: c = 0 -> 0, c = 1 or 3 -> 1 − 3/6 = 0.5, c = 2 -> 4/6; so
    # (0, 0.5, 0.667, 0.5, 0.5, 0.667), ranks (1, 3, 5.5, 3, 3, 5.5) against the gain ranks: ρ = −5.5 / sqrt(15 · 15.5).
    assert headroom["spearman_mixed_groups"] == pytest.approx(-5.5 / (15 * 15.5) ** 0.5)
    assert "| share of mixed groups of G = rl.rollout_n samples | -0.36 [" in text
    assert "| Toy-Qwen3-0.8M | EKSFT (paper eq.) | 0 | 25.0 | 100.0 (4) | 0.500 | 1.200 | n/a | +75.0 |" in text
    assert "held-out NLL on a held-out slice of the SFT set | not computed" in text
    # RL gain per arm (pass@1, seeds 0, 1): base 50, 25 | sft 25, 0 | eksft 75, 25; minus SFT's of the same seed:
    # base 25, 25 | eksft 50, 25. One problem per benchmark, so only the two seeds are resampled.
    gains = manifest.metrics["rl_gain"]
    # Seed level (t_{0.975, 1} = 12.706): EKSFT's gains 75, 25 -> 50 ± 12.706 · 35.355 / sqrt(2) = 50 ± 317.655; its
    # differences to SFT's 50, 25 -> 37.5 ± 158.83, t = 37.5 / 12.5 = 3, p = 1 − 2 atan(3) / π. No rl_gain endpoint
    # is declared by default, so no Holm p.
    eksft = gains["Toy-Qwen3-0.8M/EKSFT (paper eq.)/pass@1"]
    assert {key: eksft[key] for key in ("before", "after", "gain", "low", "high", "versus_reference")} == {
        "before": 37.5, "after": 87.5, "gain": 50.0, "low": 25.0, "high": 75.0, "versus_reference": 37.5}
    assert eksft["seed_t"] == pytest.approx([50 - 317.655, 50 + 317.655], abs=1e-3)
    assert eksft["versus_seed_t"] == pytest.approx([37.5 - 158.828, 37.5 + 158.828], abs=1e-3)
    assert eksft["versus_p_t"] == pytest.approx(1 - 2 * math.atan(3) / math.pi) and "versus_p_holm" not in eksft
    assert gains["Toy-Qwen3-0.8M/SFT/pass@1"]["versus_reference"] is None
    # Against the control, after RL: EKSFT 100, 75 against Base + DAPO's 50, 50 -> +50, +25: 37.5, t = 3 as above.
    assert eksft["versus_control"] == 37.5 and eksft["versus_control_interval"] == [25.0, 50.0]
    assert eksft["versus_control_p_t"] == pytest.approx(1 - 2 * math.atan(3) / math.pi)
    assert "versus_control" not in gains["Toy-Qwen3-0.8M/Base/pass@1"]
    assert "| Δ vs SFT | Δ after RL vs Base + DAPO | Avg pass@" in text
    # Each gain beside both levels (issue 43): Base's Avg pass@1 0, 25 -> 12.5 before RL, 50, 50 -> 50.0 after.
    assert ("| Toy-Qwen3-0.8M | Base | 2 | 12.5 → 50.0 | +37.5 [+25.0, +50.0] ⟨−121.3, +196.3⟩ | +25.0 [+25.0, +25.0] "
            "⟨+25.0, +25.0⟩ expl. |") in text
    # Groups DAPO kept: only the sft arm's RL runs logged steps; 2 steps of B kept against 2·B discarded, both seeds.
    assert "| 0: +25.0, 1: +0.0 | 50.0% |" in text and "| 0: +50.0, 1: +25.0 | – |" in text
    assert gains[f"Toy-Qwen3-0.8M/SFT/{RL_GROUPS_KEPT}"] == 0.5
    assert text.index("## RL gain per arm") < text.index("## RL headroom")


def test_report_reaches_wandb_offline(tmp_path, monkeypatch):
    """logging.wandb_mode=offline: the report's wandb run (group = experiment) holds each CSV as a table (table1 with
    the CSV's header and rows), each plot as an image, and the rows' Avg numbers as scalars."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose([f"experiment.run_root={tmp_path}", "experiment.methods=[sft]", "logging.wandb_mode=offline",
                   "report.analysis.run=[]"])
    for variant, counts in (("base", {"p1": 0, "p2": 4}), ("sft", {"p1": 1, "p2": 4})):
        for bench in ("toy_add", "toy_mixed"):
            _write_metrics(cfg, "sft", variant, bench, counts)
    report.run(cfg)
    out = report_dir(cfg)
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    table = json.loads(next((run_dir / "files/media/table").glob("table1_*.table.json")).read_text())
    header, *rows = (out / "table1.csv").read_text().splitlines()
    assert table["columns"] == header.split(",") and len(table["data"]) == len(rows)
    images = {path.name.rsplit("_", 2)[0] for path in (run_dir / "files/media/images/plots").glob("*.png")}
    assert "passk_Toy-Qwen3-0.8M_sft_toy_add" in images
    record = offline_record(run_dir)
    assert b"table1/Toy-Qwen3-0.8M/SFT/Avg pass@1" in record and b"table1/report" in record


def test_switching_a_setting_back_renders_that_settings_table_again(tmp_path, monkeypatch):
    # Issue 32, item 1: `pipeline.run $O`, then `$O sft.lr=3e-3`, then `$O` again printed "report: done (manifests
    # unchanged)" and report.md still showed the lr=3e-3 evaluation: the report recorded every evaluation folder of
    # the experiment as its inputs, so both configs had one report identity. Its inputs are the runs the current
    # config reads. Issue 39: every report starts in the same second here (the clock stands still), as both did on a
    # fast machine; a re-run is told apart by its run id, never by a one-second timestamp.
    class StoppedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 11, 27, tzinfo=tz)
    monkeypatch.setattr(manifest_module, "_dt", SimpleNamespace(datetime=StoppedClock, timezone=datetime.timezone))
    overrides = [f"experiment.run_root={tmp_path}", "experiment.methods=[sft]", "report.analysis.run=[]"]
    default, changed = compose(overrides), compose([*overrides, "sft.lr=3e-3"])
    for cfg, sft_count in ((default, 1), (changed, 4)):  # the base model's evaluation is the same under both
        for bench in ("toy_add", "toy_mixed"):
            _write_metrics(cfg, "sft", "base", bench, {"p": 0})
            _write_metrics(cfg, "sft", "sft", bench, {"p": sft_count})
    def sft_avg_pass1(manifest) -> float:
        table = (report_dir(default) / "table1.md").read_text()
        assert f"{manifest.metrics['sft']['Toy-Qwen3-0.8M/SFT']['Avg pass@1']:.1f}" in next(
            line for line in table.splitlines() if line.startswith("| SFT |"))  # the file, not only the manifest
        return manifest.metrics["sft"]["Toy-Qwen3-0.8M/SFT"]["Avg pass@1"]

    first = report.run(default)
    assert sft_avg_pass1(first) == 25.0
    assert sft_avg_pass1(report.run(changed)) == 100.0
    spec = report_run(default)
    assert not is_current(report_dir(default), spec.config_hash, spec.inputs, optional_inputs=True)  # no skip
    again = report.run(default)
    assert again.run_id != first.run_id and again.started_at == first.started_at and sft_avg_pass1(again) == 25.0

