"""Which solution styles a toy-world model samples, and how often each is right.

    python scripts/toy_styles.py runs/demo            # every evaluation of the experiment
    python scripts/toy_styles.py runs/demo --phase rl --benchmark toy_add

Reads each evaluation's ``samples.jsonl`` (``eval/<model>/<phase>/<variant>/<benchmark>/``), classifies every
sample with ``data.toy.world.solution_style`` and prints one Markdown row per evaluation: per style, the share of
samples and their accuracy (share / accuracy). This is how RL's effect on the toy world is read: which styles it
up-weights and whether they are the ones the model executes best (docs/toy_world.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.toy.world import STYLES, solution_style  # noqa: E402


def style_mix(samples_file: Path) -> dict[str, tuple[int, int]]:
    """Per style, (samples, correct samples)."""
    counts: dict[str, list[int]] = {style: [0, 0] for style in STYLES}
    with open(samples_file, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                sample = json.loads(line)
                text, correct = sample["text"], int(sample["correct"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                raise SystemExit(f"{samples_file}:{number}: not an evaluation sample ({error})") from error
            style = counts[solution_style(text)]
            style[0] += 1
            style[1] += correct
    return {style: (n, right) for style, (n, right) in counts.items()}


def table(experiment_dir: Path, phase: str | None, benchmark: str | None) -> str:
    files = sorted(experiment_dir.glob("eval/*/*/*/*/samples.jsonl"))
    rows = []
    for samples_file in files:
        model, file_phase, variant, file_benchmark = samples_file.parent.parts[-4:]
        if (phase and file_phase != phase) or (benchmark and file_benchmark != benchmark):
            continue
        mix = style_mix(samples_file)
        total = sum(n for n, _ in mix.values())
        if total == 0:
            continue
        accuracy = sum(right for _, right in mix.values()) / total
        cells = [f"{n / total:.2f} / {right / n:.2f}" if n else "0 / —" for n, right in mix.values()]
        rows.append(f"| {model} | {file_phase} | {variant} | {file_benchmark} | {accuracy:.3f} | " + " | ".join(cells) + " |")
    if not rows:
        raise SystemExit(f"no evaluation samples under {experiment_dir}/eval matching phase={phase} benchmark={benchmark}")
    header = "| model | phase | variant | benchmark | pass@1 | " + " | ".join(STYLES) + " |"
    return "\n".join([header, "|" + "---|" * (5 + len(STYLES)), *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment_dir", type=Path, help="runs/<experiment>")
    parser.add_argument("--phase", choices=("sft", "rl"), help="only Table 1 (sft) or Table 2 (rl) evaluations")
    parser.add_argument("--benchmark", help="only this benchmark, e.g. toy_add")
    args = parser.parse_args()
    print(table(args.experiment_dir, args.phase, args.benchmark))


if __name__ == "__main__":
    main()
