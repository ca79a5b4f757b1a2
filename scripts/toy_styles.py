"""Which solution styles (arithmetic world) or strategies (forking world) a toy model samples, and how often each
is right.

    python scripts/toy_styles.py runs/demo            # every evaluation of the experiment
    python scripts/toy_styles.py runs/demo --phase rl --benchmark toy_add
    python scripts/toy_styles.py runs/forking         # forking world: one row per evaluation and problem family

Reads each evaluation's ``samples.jsonl`` (``eval/<model>/<phase>/<variant>/<benchmark>/``), classifies every
sample and prints one Markdown row per evaluation: per style or strategy, the share of samples and their accuracy
(share / accuracy). Arithmetic benchmarks (``toy_add``, ``toy_mixed``) are classified with
``toy.world.solution_style``; forking benchmarks (``toy_fork_<family>``, one problem family each) with
``toy.forking.solution_strategy``, so their rows are the strategy shares per family (``other``: a sample that
opens with no strategy). Each world gets its own table. This is how SFT's and RL's effect on the toy worlds is read:
which styles or strategies they up-weight, and whether these are the ones that are right (docs/toy_world.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.config.toy import FORK_STRATEGIES  # noqa: E402
from toy.forking import BENCHMARK_PREFIX, solution_strategy  # noqa: E402
from toy.world import STYLES, solution_style  # noqa: E402

OTHER = "other"
CLASSES = {"arithmetic": STYLES, "forking": FORK_STRATEGIES + (OTHER,)}
"""Per world, the columns of its table."""


def world_of(benchmark: str) -> str:
    return "forking" if benchmark.startswith(BENCHMARK_PREFIX) else "arithmetic"


def classify(text: str, world: str) -> str:
    if world == "forking":
        return solution_strategy(text) or OTHER
    return solution_style(text)


def style_mix(samples_file: Path, world: str = "arithmetic") -> dict[str, tuple[int, int]]:
    """Per style (or strategy), (samples, correct samples)."""
    counts: dict[str, list[int]] = {name: [0, 0] for name in CLASSES[world]}
    with open(samples_file, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                sample = json.loads(line)
                text, correct = sample["text"], int(sample["correct"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                raise SystemExit(f"{samples_file}:{number}: not an evaluation sample ({error})") from error
            entry = counts[classify(text, world)]
            entry[0] += 1
            entry[1] += correct
    return {name: (n, right) for name, (n, right) in counts.items()}


def table(experiment_dir: Path, phase: str | None, benchmark: str | None) -> str:
    files = sorted(experiment_dir.glob("eval/*/*/*/*/samples.jsonl"))
    rows: dict[str, list[str]] = {world: [] for world in CLASSES}
    for samples_file in files:
        model, file_phase, variant, file_benchmark = samples_file.parent.parts[-4:]
        if (phase and file_phase != phase) or (benchmark and file_benchmark != benchmark):
            continue
        world = world_of(file_benchmark)
        mix = style_mix(samples_file, world)
        total = sum(n for n, _ in mix.values())
        if total == 0:
            continue
        accuracy = sum(right for _, right in mix.values()) / total
        cells = [f"{n / total:.2f} / {right / n:.2f}" if n else "0 / —" for n, right in mix.values()]
        rows[world].append(f"| {model} | {file_phase} | {variant} | {file_benchmark} | {accuracy:.3f} | "
                           + " | ".join(cells) + " |")
    if not any(rows.values()):
        raise SystemExit(f"no evaluation samples under {experiment_dir}/eval matching phase={phase} benchmark={benchmark}")
    tables = []
    for world, world_rows in rows.items():
        if world_rows:
            header = "| model | phase | variant | benchmark | pass@1 | " + " | ".join(CLASSES[world]) + " |"
            tables.append("\n".join([header, "|" + "---|" * (5 + len(CLASSES[world])), *world_rows]))
    return "\n\n".join(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment_dir", type=Path, help="runs/<experiment>")
    parser.add_argument("--phase", choices=("sft", "rl"), help="only Table 1 (sft) or Table 2 (rl) evaluations")
    parser.add_argument("--benchmark", help="only this benchmark, e.g. toy_add or toy_fork_carry")
    args = parser.parse_args()
    print(table(args.experiment_dir, args.phase, args.benchmark))


if __name__ == "__main__":
    main()
