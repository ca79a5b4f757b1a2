"""The report's head (report.sections.head): the fork table of a forking-world experiment, measured on the data run's
benchmark prompts for the base model and every complete SFT export, and the claims it states with their numbers."""
from __future__ import annotations

from pathlib import Path

import pytest

from report.sections import head
from common.benchmarks import write_benchmark
from common.config import compose
from common.config.toy import FORK_FAMILIES, MID_RESPONSE_PREFIX
from common.grid import experiment_grid
from common.manifest import stage_run
from common.paths import base_run, benchmark_file, data_dir, hf_export_dir

FORKS = {"base": (1.08, 0.61, 0.45, 0.40), "sft": (0.28, 0.02, 0.00, 0.98), "eksft": (1.77, 0.30, 0.34, 0.33)}
"""Model folder's run → (fork H, p(column | small), p(round | carry), p(place | plain)), the demo's measured values."""


def _complete(folder: Path) -> None:
    with stage_run(folder, stage="x", variant="x", config={}, announce=lambda _: None):
        pass
    hf_export_dir(folder).mkdir()


@pytest.mark.parametrize("position, prefix", [("first", ""), ("mid", MID_RESPONSE_PREFIX)])
def test_the_fork_table_measures_base_and_sft_exports_on_the_benchmark_prompts(tmp_path, position, prefix):
    # Issue 43: the fork (toy_styles --fork's measurement) was not in the report. Issue 40: in the world
    # toy.fork_position=mid the fork is the token after the fixed prefix, not the first response token.
    cfg = compose(["experiment=demo", f"experiment.run_root={tmp_path}", "logging.progress=false",
                   f"toy.fork_position={position}"])
    for family, count in zip(FORK_FAMILIES, (3, 2, 1)):
        write_benchmark(data_dir(cfg) / benchmark_file(f"toy_fork_{family}"),
                        [{"id": str(i), "problem": f"{family} {i}", "answer": "1", "answer_raw": "1"}
                         for i in range(count)], system_prompt="Think.")
    grid = experiment_grid(cfg)
    arms = grid.models[0].arms[cfg.seed]
    folders = {"base": base_run(cfg).directory, "sft": arms["sft"].sft, "eksft": arms["eksft"].sft}
    for folder in folders.values():
        _complete(folder)
    names = {str(hf_export_dir(folder)): name for name, folder in folders.items()}
    seen = []

    def measure(folder, prompts, fork_prefix):
        assert fork_prefix == prefix
        seen.append((names[folder], {family: len(found) for family, found in prompts.items()}))
        assert prompts["carry"][0] == [{"role": "system", "content": "Think."}, {"role": "user", "content": "carry 0"}]
        entropy, column, round_, place = FORKS[names[folder]]
        return {"fork_entropy_nats": entropy, "fork_small_p_column": column, "fork_carry_p_round": round_,
                "fork_plain_p_place": place}

    forks = head.fork_measurements(grid, ["small", "carry", "plain"], measure)
    assert sorted(name for name, _ in seen) == ["base", "eksft", "sft"]  # no RL export yet: nothing after RL
    assert all(counts == {"small": 3, "carry": 2, "plain": 1} for _, counts in seen)
    assert list(forks) == [("Toy-Qwen3-0.8M", "before RL", label) for label in ("Base", "SFT", "EKSFT (paper eq.)")]
    table = head.fork_table(cfg, forks, ["small", "carry", "plain"])
    assert table[2] == ("| model | phase | method | fork H (nats) | p(column \\| Fork-Small) | p(round \\| Fork-Carry) "
                        "| p(place \\| Fork-Plain) |")
    assert table[4:] == ["| Toy-Qwen3-0.8M | before RL | Base | 1.08 [1.08, 1.08] | 0.61 | 0.45 | 0.40 |",
                         "| Toy-Qwen3-0.8M | before RL | SFT | 0.28 [0.28, 0.28] | 0.02 | 0.00 | 0.98 |",
                         "| Toy-Qwen3-0.8M | before RL | EKSFT (paper eq.) | 1.77 [1.77, 1.77] | 0.30 | 0.34 | 0.33 |"]
    assert head.fork_claims(cfg, forks, ["small", "carry", "plain"]) == [
        "* **Toy-Qwen3-0.8M, the fork before RL:** fork entropy (nats) Base 1.08, SFT 0.28, EKSFT (paper eq.) 1.77; "
        "p(the right strategy: column on Fork-Small / round on Fork-Carry / place on Fork-Plain) Base 0.61 / 0.45 / "
        "0.40, SFT 0.02 / 0.00 / 0.98, EKSFT (paper eq.) 0.30 / 0.34 / 0.33."]


def test_an_experiment_without_forking_benchmarks_has_no_fork_table():
    assert head.fork_families(compose([])) == []
    assert head.fork_families(compose(["experiment=demo"])) == ["small", "carry", "plain"]
