"""``toy.world`` dispatch: the one place that picks the arithmetic world (``arithmetic.py``) or the forking world
(``forking.py``) for pretraining documents, LUFFY rows and held-out benchmark problems."""
from __future__ import annotations

import random
from typing import Iterator

from common.config import ConfigError
from common.config.toy import FORK_BENCHMARK_PREFIX, FORK_FAMILIES, ToyConfig, fork_prefix
from toy import arithmetic, forking

ARITHMETIC_BENCHMARKS = ("add", "mixed")
"""The arithmetic world's benchmarks ``toy_add`` and ``toy_mixed``."""


def documents(toy: ToyConfig, seed: int) -> Iterator[str]:
    """The world's endless, seeded stream of pretraining documents."""
    if toy.world == "forking":
        return forking.documents(seed, forking.ForkingMix(toy.chat_doc_ratio, toy.fork_pretrain_best_share,
                                                          toy.fork_base_prefers, fork_prefix(toy.fork_position)))
    return arithmetic.documents(seed, arithmetic.DocumentMix(
        chat_ratio=toy.chat_doc_ratio, chat_style_weights=dict(toy.chat_style_weights),
        raw_style_weights=dict(toy.raw_style_weights), slip_rates=dict(toy.slip_rates),
        direct_error_rate=toy.direct_error_rate, min_terms=toy.min_terms, max_terms=toy.max_terms))


def training_rows(toy: ToyConfig, seed: int) -> list[dict]:
    """``toy.num_rows`` LUFFY rows: clean styled solutions (arithmetic) or the narrow teacher's (forking)."""
    if toy.world == "forking":
        return forking.teacher_rows(toy.num_rows, seed, dict(toy.fork_teacher_weights), toy.fork_teacher_verified,
                                    fork_prefix(toy.fork_position))
    return arithmetic.training_rows(toy.num_rows, seed, toy.min_terms, toy.max_terms, dict(toy.row_style_weights))


def benchmark_names(toy: ToyConfig) -> tuple[str, ...]:
    """The benchmark names this world can draw (``data.benchmarks`` keys)."""
    kinds = FORK_FAMILIES if toy.world == "forking" else ARITHMETIC_BENCHMARKS
    prefix = FORK_BENCHMARK_PREFIX if toy.world == "forking" else "toy_"
    return tuple(prefix + kind for kind in kinds)


def benchmark_problems(toy: ToyConfig, name: str, count: int, seed: int) -> list:
    """``count`` held-out problems of benchmark ``name`` (objects with ``expression`` and ``answer``)."""
    if name not in benchmark_names(toy):
        raise ConfigError(f"data.benchmarks.{name}: toy.world={toy.world} draws the benchmarks "
                          f"{list(benchmark_names(toy))}")
    if toy.world == "forking":
        return forking.benchmark_problems(name.removeprefix(FORK_BENCHMARK_PREFIX), count, seed)
    return arithmetic.benchmark_problems(name.removeprefix("toy_"), count, seed, toy.min_terms, toy.max_terms)


def benchmark_questions(toy: ToyConfig, name: str, count: int, seed: int) -> list[tuple[str, int]]:
    """The :func:`benchmark_problems` as (question, answer) pairs, each question phrased with ``random.Random(seed)``
    (the data stage's benchmark records)."""
    rng = random.Random(seed)
    return [(arithmetic.question(problem, rng), problem.answer)
            for problem in benchmark_problems(toy, name, count, seed)]


def health_check_problems(toy: ToyConfig, count: int, seed: int) -> list:
    """Held-out problems for the base model's greedy accuracy: ``toy_mixed`` (arithmetic), or an equal share of
    every family (forking; the remainder to the first families)."""
    if toy.world == "forking":
        return [problem for index, family in enumerate(FORK_FAMILIES)
                for problem in forking.benchmark_problems(
                    family, count // len(FORK_FAMILIES) + (index < count % len(FORK_FAMILIES)), seed)]
    return arithmetic.benchmark_problems("mixed", count, seed, toy.min_terms, toy.max_terms)
