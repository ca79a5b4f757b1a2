"""The order of the suite on pytest-xdist workers, so that they finish together: ``--dist worksteal`` first deals
the collected tests out in equal-count consecutive chunks, one a worker, and an idle worker later steals the tail of
a busy one's queue. A chunk that holds the long tests ends long after the others (the default suite used to end on
one worker: a 2-rank launch or a vLLM engine at the end of its alphabetical half). So each chunk starts with its share
of the slow test files, heaviest first, each put where the least known time is (longest processing time first), and
is filled up with the other tests, whose tail the other worker can steal. A file's tests stay together and in their
order (module-scoped fixtures are built once a worker). Without xdist the order is pytest's."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, TypeVar

import pytest

TESTS = Path(__file__).resolve().parent

SLOW_FILES = {
    # a test file (relative to tests/) → roughly the seconds its tests take on a loaded 2-core machine (`pytest
    # --durations`); only the order reads them, no test asserts a time
    "integration/test_golden_numbers.py": 100,
    "integration/test_eval_run.py": 70,
    "integration/test_bench_commands.py": 90,
    "integration/test_sft_lora.py": 50,
    "integration/test_sft_train.py": 60,
    "unit/test_orchestrator.py": 40,
    "integration/test_trl_integration.py": 40,
    "integration/test_sharded_load.py": 30,
    "unit/test_numerics.py": 30,
    "integration/test_eval_entropy.py": 26,
    "integration/test_sft_method_wiring.py": 26,
    "integration/test_reference_cache_exactness.py": 25,
    "integration/test_toy_forking_base.py": 25,
    "unit/test_ablations_plan.py": 23,
    "integration/test_toy_pipeline.py": 22,
    "integration/test_documented_eval_command.py": 20,
    "integration/test_eval_heldout_nll.py": 20,
    "integration/test_gpu_smoke_dry_run.py": 18,
    "integration/test_gpu_lora_check_dry_run.py": 18,
    "unit/test_rl_launch.py": 16,
    "integration/test_paper_artefacts_report.py": 15,
}

Item = TypeVar("Item")


def chunk_sizes(count: int, workers: int) -> list[int]:
    """How many of ``count`` tests each worker gets first: xdist's worksteal gives each idle worker in turn an equal
    share of what is left (``len(pending) // workers left``)."""
    sizes = []
    for left in range(workers, 0, -1):
        sizes.append((count - sum(sizes)) // left)
    return sizes


def worker_order(items: Sequence[Item], workers: int, file_of, seconds: dict[str, float]) -> list[Item]:
    """``items`` reordered for ``workers`` workers: each chunk of :func:`chunk_sizes` begins with the slow files
    (``seconds`` of ``file_of(item)``) given to it, heaviest first to the chunk with the least time so far, then
    the other files in their order, cut where the chunks end."""
    files: dict[str, list[Item]] = {}
    for item in items:
        files.setdefault(file_of(item), []).append(item)
    slow = sorted((name for name in files if name in seconds), key=lambda name: -seconds[name])
    chunks: list[list[Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for name in slow:
        lightest = load.index(min(load))
        chunks[lightest] += files[name]
        load[lightest] += seconds[name]
    rest = [item for name, group in files.items() if name not in seconds for item in group]
    for chunk, size in zip(chunks, chunk_sizes(len(items), workers)):
        take = max(0, size - len(chunk))
        chunk += rest[:take]
        del rest[:take]
    return [item for chunk in chunks for item in chunk] + rest


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` deselected: the chunks are of what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers > 1:
        items[:] = worker_order(items, workers, lambda item: item.path.relative_to(TESTS).as_posix(), SLOW_FILES)
