"""The report of small fixture grids, byte for byte against ``tests/assets/report_golden/<grid>.json``: a safety net
for refactors of ``report/`` and of the experiment grid (``report.md``, every table and CSV the report writes, and its
manifest's metrics must not change).

The expected files were written by the code before a refactor:

    python tests/integration/test_report_golden.py --record       # rewrites tests/assets/report_golden/

Compared: every output whose name ends in .md, .csv, .tex, .json or .html (the run root replaced by ``<run_root>``),
the list of every output (PNG plots by name only: their bytes depend on matplotlib and its fonts) and the manifest's
metrics. Not compared: ``manifest.json`` itself (start and end times, commit, machine).
"""
from __future__ import annotations

import json
import random
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO / "tests" / "assets" / "report_golden"
TEXT_SUFFIXES = (".md", ".csv", ".tex", ".json", ".html")

pytestmark = pytest.mark.integration


def _counts(*key: object, problems: int = 5, n: int = 8) -> dict[str, int]:
    """Correct counts of ``problems`` problems, fixed by ``key`` (crc32: the same on every machine and run)."""
    rng = random.Random(zlib.crc32(repr(key).encode()))
    return {f"p{i}": rng.randint(0, n) for i in range(problems)}


def _write_metrics(folder: Path, counts: dict[str, int], n: int, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"n": n, "correct_counts": counts, **extra}))


def _math_grid(cfg, benchmarks: list[str], n: int = 8) -> None:
    """An evaluation of every arm of every model and seed the report reads, both phases (rl: the RL arms)."""
    from common.paths import eval_run
    from common.grid import experiment_grid

    for model in experiment_grid(cfg).models:
        for seed, scfg in model.seeds.items():
            for a in model.arms[seed].values():
                for phase in ("sft", "rl"):
                    if phase == "rl" and a.variant not in model.rl_variants:
                        continue
                    for bench in benchmarks:
                        key = (model.cfg.model.name, seed, a.variant, phase, bench)
                        rng = random.Random(zlib.crc32(repr(key).encode()))
                        _write_metrics(eval_run(scfg, phase, a.variant, bench, a.model(phase)).directory,
                                       _counts(*key, n=n), n, mean_token_entropy_nats=round(rng.uniform(0.2, 1.5), 3),
                                       time_limited_samples=rng.randint(0, 2), rejudged_samples=rng.randint(0, 1))


def _training_logs(cfg) -> None:
    """SFT logs of the EKSFT arm and RL logs of the SFT arm, every seed."""
    from common.paths import RL_DISCARDED_GROUPS
    from common.grid import arm_named, seed_configs

    for seed, scfg in seed_configs(cfg).items():
        folder = arm_named(scfg, "eksft").sft
        folder.mkdir(parents=True, exist_ok=True)
        log = [{"step": step, "loss": 2.0 / step, "stats/ce": 1.0 / step, "stats/entropy_mean_M": 1.0,
                "stats/entropy_mean_rest": 0.5, "stats/kl_mean_M": 0.1 * step, "stats/kl_mean_rest": 0.01,
                "stats/iou": 0.1 * step + 0.01 * seed, "stats/num_T": 40, "stats/num_M_H": 8, "stats/num_M_KL": 6,
                "stats/num_M": 10} for step in (1, 2, 3)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
        rl_log = [{"step": step, "critic/score/mean": 0.1 * step + 0.05 * seed, "response_length/mean": 30.0,
                   "actor/entropy": 0.9, "timing_s/step": 5.0} for step in (1, 2)]
        rl_log[0][RL_DISCARDED_GROUPS] = 2 * cfg.rl.train_batch_size
        folder = arm_named(scfg, "sft").rl
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rl_log))


def _sweep_points(cfg) -> None:
    """Two complete SFT runs of EKSFT with another ρ per seed (the sweep analysis finds them by their manifests), their
    commit, machine and times fixed (the report's "Runs" section shows them)."""
    from common.config.sft import EKSFTMethod
    from common.manifest import read_manifest, stage_run, write_manifest
    from common.paths import sft_run
    from common.grid import seed_configs, with_method

    for seed, scfg in seed_configs(cfg).items():
        for minute, rho in enumerate((0.1, 0.4)):
            spec = sft_run(with_method(scfg, EKSFTMethod(rho=rho)))
            with stage_run(spec.directory, stage="sft", variant="test", config=spec.config, announce=lambda _: None):
                pass
            manifest = read_manifest(spec.directory)
            start, end = f"2026-11-27T0{seed}:{minute}0:00+00:00", f"2026-11-27T0{seed}:{minute}7:30+00:00"
            manifest.git, manifest.started_at, manifest.ended_at = {"commit": "0123456789abcdef", "dirty": False}, \
                start, end
            manifest.machine = {"cpu": "AMD EPYC", "cpus": 2, "cpu_flags": ["avx2"], "memory_gib": 24}
            manifest.attempts = [{"started_at": start, "ended_at": end, "status": "complete"}]
            write_manifest(spec.directory, manifest)


def build_toy(run_root: Path):
    """The default toy experiment on two seeds: SFT and EKSFT, both phases, training logs, a ρ sweep."""
    from common.config import compose

    cfg = compose([f"experiment.run_root={run_root}", "experiment.methods=[sft,eksft]", "experiment.seeds=[0,1]",
                   "rl.rollout_n=2", "logging.progress=false"])
    _sweep_points(cfg)
    _math_grid(cfg, ["toy_add", "toy_mixed"])
    _training_logs(cfg)
    return cfg


def build_demo(run_root: Path):
    """``experiment=demo``: SFT and EKSFT, DAPO from EKSFT."""
    from common.config import compose

    cfg = compose(["experiment=demo", f"experiment.run_root={run_root}", "logging.progress=false"])
    _math_grid(cfg, ["toy_fork_small", "toy_fork_carry", "toy_fork_plain"])
    return cfg


def build_forking(run_root: Path):
    """``experiment=forking``: 15 arms, 3 seeds, its pre-registered primary endpoints, DAPO for 5 arms."""
    from common.config import compose

    cfg = compose(["experiment=forking", f"experiment.run_root={run_root}", "logging.progress=false"])
    _math_grid(cfg, ["toy_fork_small", "toy_fork_carry", "toy_fork_plain"], n=32)
    return cfg


def build_bfcl(run_root: Path):
    """``experiment=bfcl`` on the paper profile: the BFCL appendix tables of both models."""
    from common.config import compose
    from common.config.data import LIVE_CATEGORIES
    from common.paths import eval_run
    from common.grid import arms, model_configs

    cfg = compose(["experiment=bfcl", "profile=paper", f"experiment.run_root={run_root}", "logging.progress=false"])
    for mcfg in model_configs(cfg):
        for a in arms(mcfg):
            for category in [*LIVE_CATEGORIES, "live_irrelevance"]:
                _write_metrics(eval_run(mcfg, "sft", a.variant, category, a.sft).directory,
                               _counts(mcfg.model.name, a.variant, category, problems=12, n=1), 1)
    return cfg


GRIDS = {"toy": build_toy, "demo": build_demo, "forking": build_forking, "bfcl": build_bfcl}


def render(name: str, run_root: Path) -> dict:
    """Builds grid ``name`` under ``run_root``, runs the report and returns what is compared."""
    from common.paths import report_dir
    from report import run as report

    cfg = GRIDS[name](run_root)
    manifest = report.run(cfg)
    out = report_dir(cfg)
    files = {relative: (out / relative).read_text(encoding="utf-8").replace(str(run_root), "<run_root>")
             for relative in sorted(manifest.outputs) if relative.endswith(TEXT_SUFFIXES)}
    return {"outputs": sorted(manifest.outputs), "files": files,
            "metrics": manifest.metrics}


@pytest.mark.parametrize("name", list(GRIDS))
def test_the_report_of_a_fixture_grid_is_unchanged(name, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    expected = json.loads((GOLDEN_DIR / f"{name}.json").read_text(encoding="utf-8"))
    found = render(name, tmp_path)
    assert found["outputs"] == expected["outputs"]
    for relative, text in expected["files"].items():
        assert found["files"][relative] == text, f"{relative} of grid {name} changed"
    assert json.dumps(found["metrics"], sort_keys=True) == json.dumps(expected["metrics"], sort_keys=True)


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(REPO))
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: python {Path(__file__).relative_to(REPO)} --record")
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    for grid in GRIDS:
        with tempfile.TemporaryDirectory() as root:
            (GOLDEN_DIR / f"{grid}.json").write_text(
                json.dumps(render(grid, Path(root)), indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                encoding="utf-8")
        print(f"recorded {grid}")
