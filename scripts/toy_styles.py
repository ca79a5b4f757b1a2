"""Which solution styles (arithmetic world) or strategies (forking world) a toy model samples, and how often each
is right.

    python scripts/toy_styles.py runs/demo            # every evaluation of the experiment
    python scripts/toy_styles.py runs/demo --phase rl --benchmark toy_add
    python scripts/toy_styles.py runs/forking         # forking world: one row per evaluation and problem family
    python scripts/toy_styles.py runs/forking --pool-seeds   # one row per method: the seeds' samples pooled
    python scripts/toy_styles.py runs/forking --fork         # each evaluated model's exact fork distribution
    python scripts/toy_styles.py runs/<experiment> --fork --fork-position mid   # a run with toy.fork_position=mid

Reads each evaluation's ``samples.jsonl`` (``eval/<model>/<phase>/<variant>/<benchmark>/``), classifies every
sample and prints one Markdown row per evaluation: per style or strategy, the share of samples and their accuracy
(share / accuracy). Arithmetic benchmarks (``toy_add``, ``toy_mixed``) are classified with
``toy.arithmetic.solution_style``; forking benchmarks (``toy_fork_<family>``, one problem family each) with
``toy.forking.solution_strategy``, so their rows are the strategy shares per family (``other``: a sample that
opens with no strategy). Each world gets its own table. This is how SFT's and RL's effect on the toy worlds is read:
which styles or strategies they up-weight, and whether these are the ones that are right (docs/toy_world.md).
``--pool-seeds`` pools the evaluations that differ only in their run id (the seeds of one method: every seed's
evaluation has the same number of samples, so pooled shares are the seeds' mean) and gives the number of runs.
``--fork`` reads no samples: for every model a forking evaluation names in its manifest it computes the exact
fork distribution (``common.forks``, one forward pass per held-out problem) and prints one row per
method and phase, its seeds pooled: the fork entropy (mean over the seeds, with their range) and the mean
probability of each family's right strategy (``column`` on small, ``round`` on carry, ``place`` on plain). It reads
runs made in any checkout: a model path a manifest holds relative to its own checkout is looked up under the run
root the experiment folder lies in (:func:`model_folder`). An evaluation of an RL run made with an algorithm other
than DAPO (``rl/algorithm=``) is its own method, ``<variant>+<algorithm>`` (:func:`method`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.config.rl import RLConfig, algorithm_suffix  # noqa: E402
from common.config.toy import (  # noqa: E402
    FORK_BENCHMARK_PREFIX,
    FORK_BEST_STRATEGY,
    FORK_FAMILIES,
    FORK_POSITIONS,
    FORK_STRATEGIES,
    ToyConfig,
)
from common.errors import user_errors_in_one_line  # noqa: E402
from common.forks import FORK_ENTROPY, best_strategy_key, summarize  # noqa: E402
from common.manifest import Manifest, read_manifest  # noqa: E402
from toy.forking import solution_strategy  # noqa: E402
from toy.arithmetic import STYLES, solution_style  # noqa: E402

OTHER = "other"
CLASSES = {"arithmetic": STYLES, "forking": FORK_STRATEGIES + (OTHER,)}
"""Per world, the columns of its table."""


LEGEND = {
    "arithmetic": {"chain": "one running equation", "steps": "one equation per operation",
                   "careful": "each step checked by its inverse and redone on a mismatch",
                   "direct": "the answer alone, a guessing mode (right ~20% of the time in pretraining)"},
    "forking": {"column": "right to left, a carry per column (right iff a + b <= 99)",
                "place": "place sums side by side (right iff the ones do not carry)",
                "round": "round b up to the next ten (right iff the ones carry)",
                OTHER: "opens with no strategy"},
}
"""Per world, what each column means (docs/toy_world.md, "Solution styles" and "Problems, families and strategies")."""


def legend(tables: str) -> str:
    """The legend of the worlds whose tables ``tables`` holds: what a cell is and what each style or strategy is."""
    lines = ["cells: share of the samples / accuracy of those samples; pass@1: accuracy of all samples"]
    for world, names in LEGEND.items():
        if f"| {' | '.join(CLASSES[world])} |" in tables:
            lines += [f"  {name}: {meaning}" for name, meaning in names.items()]
    return "\n".join(lines)


def world_of(benchmark: str) -> str:
    return "forking" if benchmark.startswith(FORK_BENCHMARK_PREFIX) else "arithmetic"


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


RUN_ID_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
"""The run id that ends an evaluation's variant folder (``sft-9210f287``): one per seed."""


def method(evaluation: Path, evaluated: Manifest | None, experiment_dir: Path, pool_seeds: bool) -> str:
    """The evaluation's variant folder (its run id dropped with ``pool_seeds``), followed for an evaluation of an RL
    run made with an algorithm other than DAPO by ``+<algorithm>`` (:func:`common.config.rl.algorithm_suffix`), read
    from that run's manifest (``evaluated``: the evaluation's own): the points of an ``rl/algorithm`` sweep start from
    the same runs and share their variant names, so without it their evaluations would be pooled as one method."""
    phase, variant = evaluation.parent.parent.name, evaluation.parent.name
    name = RUN_ID_SUFFIX.sub("", variant) if pool_seeds else variant
    upstream = (evaluated.details.get("model") or {}).get("upstream_run") if phase == "rl" and evaluated else None
    if not upstream:
        return name
    rl_run = read_manifest(model_folder(upstream, experiment_dir, evaluation))
    algorithm = ((rl_run.config if rl_run else {}).get("rl") or {}).get("algorithm", RLConfig.algorithm)
    return name + algorithm_suffix(algorithm)


def table(experiment_dir: Path, phase: str | None, benchmark: str | None, pool_seeds: bool = False) -> str:
    files = sorted(experiment_dir.glob("eval/*/*/*/*/samples.jsonl"))
    groups: dict[tuple[str, str, str, str], list[dict[str, tuple[int, int]]]] = {}
    for samples_file in files:
        model, file_phase, _, file_benchmark = samples_file.parent.parts[-4:]
        if (phase and file_phase != phase) or (benchmark and file_benchmark != benchmark):
            continue
        variant = method(samples_file.parent, read_manifest(samples_file.parent), experiment_dir, pool_seeds)
        groups.setdefault((model, file_phase, variant, file_benchmark), []).append(
            style_mix(samples_file, world_of(file_benchmark)))
    rows: dict[str, list[str]] = {world: [] for world in CLASSES}
    for (model, file_phase, variant, file_benchmark), mixes in groups.items():
        mix = {name: (sum(m[name][0] for m in mixes), sum(m[name][1] for m in mixes)) for name in mixes[0]}
        total = sum(n for n, _ in mix.values())
        if total == 0:
            continue
        accuracy = sum(right for _, right in mix.values()) / total
        cells = [f"{n / total:.2f} / {right / n:.2f}" if n else "0 / —" for n, right in mix.values()]
        runs = f" {len(mixes)} |" if pool_seeds else ""
        rows[world_of(file_benchmark)].append(f"| {model} | {file_phase} | {variant} | {file_benchmark} |{runs} "
                                              f"{accuracy:.3f} | " + " | ".join(cells) + " |")
    if not any(rows.values()):
        raise SystemExit(f"no evaluation samples under {experiment_dir}/eval matching phase={phase} benchmark={benchmark}")
    tables = []
    for world, world_rows in rows.items():
        if world_rows:
            runs = ["runs"] if pool_seeds else []
            columns = ["model", "phase", "variant", "benchmark", *runs, "pass@1", *CLASSES[world]]
            tables.append("\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *world_rows]))
    return "\n\n".join(tables)


def model_folder(recorded: str, experiment_dir: Path, evaluation: Path) -> str:
    """The folder of a model an evaluation's manifest names (``recorded``): as given when it is absolute and there,
    else the longest tail of it that lies under this experiment's run root (``experiment_dir``'s parent). A run root
    given as a relative path (``runs``, the default) makes the manifests hold paths relative to the checkout the run
    was made in, so the run root is the one place to look for them from anywhere else."""
    path = Path(recorded)
    if path.is_absolute() and path.exists():
        return recorded
    run_root = experiment_dir.parent
    for start in range(len(path.parts)):
        candidate = run_root.joinpath(*path.parts[start:])
        if candidate.exists():
            return str(candidate)
    raise SystemExit(f"{evaluation.relative_to(experiment_dir)}: its model {recorded} is not under the run root "
                     f"{run_root}; pass runs/<experiment> of the run root that holds it")


def fork_table(experiment_dir: Path, phase: str | None, measure: Callable[[str], dict[str, float]]) -> str:
    """One row per (model, phase, method): ``measure(model_path)`` (a :func:`common.forks.fork_distribution` of that
    model) for every model a forking evaluation of the method names, once per model (found by :func:`model_folder`),
    pooled by :func:`common.forks.summarize`: the fork entropy as the mean over the models with their range, the
    right strategy's probability per family as the mean."""
    models: dict[tuple[str, str, str], set[str]] = {}
    for manifest_file in sorted(experiment_dir.glob(f"eval/*/*/*/{FORK_BENCHMARK_PREFIX}*/manifest.json")):
        model, file_phase = manifest_file.parent.parts[-4:-2]
        if phase and file_phase != phase:
            continue
        manifest = read_manifest(manifest_file.parent)
        if not manifest.complete:
            continue
        key = (model, file_phase, method(manifest_file.parent, manifest, experiment_dir, pool_seeds=True))
        models.setdefault(key, set()).add(
            model_folder(manifest.details["model"]["path"], experiment_dir, manifest_file.parent))
    if not models:
        raise SystemExit(f"no complete forking evaluation under {experiment_dir}/eval matching phase={phase}")
    families = [f"p({FORK_BEST_STRATEGY[family]} \\| {family})" for family in FORK_FAMILIES]
    columns = ["model", "phase", "variant", "runs", "fork H (nats)", *families]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for (model, file_phase, variant), paths in sorted(models.items()):
        pooled = summarize([measure(path) for path in sorted(paths)], FORK_FAMILIES)
        low, high = pooled["fork_entropy_range"]
        cells = [f"{pooled[FORK_ENTROPY]:.2f} [{low:.2f}, {high:.2f}]",
                 *(f"{pooled[best_strategy_key(family)]:.2f}" for family in FORK_FAMILIES)]
        rows.append(f"| {model} | {file_phase} | {variant} | {len(paths)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def exact_fork_distribution(problems: int, fork_position: str) -> Callable[[str], dict[str, float]]:
    """``model_path -> toy.entropy.fork_distribution`` (:func:`common.forks.fork_distribution` of the toy world's
    held-out problems) on ``problems`` held-out problems (world seed 0), the fork where the run's
    ``toy.fork_position`` puts it."""
    import torch

    from common.models import load_causal_lm, load_tokenizer
    from toy.entropy import fork_distribution

    # One prompt per forward pass through a 0.84M model: intra-op threads gain nothing, and beside two running DAPO
    # stages on two cores they cost (19 models: unfinished after 30 min with two threads at nice 5, 2.5 min with
    # one thread and GOMP_SPINCOUNT=10000).
    torch.set_num_threads(1)
    toy = ToyConfig(world="forking", fork_entropy_problems=problems, fork_position=fork_position)
    toy.validate()

    def measure(model_path: str) -> dict[str, float]:
        return fork_distribution(load_causal_lm(model_path).eval(), load_tokenizer(model_path), toy)

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment_dir", type=Path, help="runs/<experiment>")
    parser.add_argument("--phase", choices=("sft", "rl"), help="only Table 1 (sft) or Table 2 (rl) evaluations")
    parser.add_argument("--benchmark", help="only this benchmark, e.g. toy_add or toy_fork_carry")
    parser.add_argument("--pool-seeds", action="store_true", help="one row per method: its seeds' samples pooled")
    parser.add_argument("--fork", action="store_true",
                        help="forking world: the exact fork distribution of every evaluated model, seeds pooled")
    parser.add_argument("--fork-problems", type=int, default=300,
                        help="with --fork: held-out problems, a third per family")
    parser.add_argument("--fork-position", choices=FORK_POSITIONS, default="first",
                        help="with --fork: the run's toy.fork_position (mid: the fork follows a fixed prefix)")
    args = parser.parse_args()
    with user_errors_in_one_line():
        if args.fork:
            print(fork_table(args.experiment_dir, args.phase, exact_fork_distribution(args.fork_problems, args.fork_position)))
        else:
            tables = table(args.experiment_dir, args.phase, args.benchmark, args.pool_seeds)
            print(f"{tables}\n\n{legend(tables)}")


if __name__ == "__main__":
    main()
