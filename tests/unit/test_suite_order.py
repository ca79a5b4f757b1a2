"""tests/suite_order.py: each pytest-xdist worker's first share of the suite starts with its part of the slow test
files, balanced by their known seconds, and every file's tests stay together and in order."""
from __future__ import annotations

from suite_order import SLOW_FILES, TESTS, chunk_sizes, worker_order


def test_the_shares_are_what_worksteal_deals_first():
    assert chunk_sizes(11, 2) == [5, 6]
    assert chunk_sizes(10, 3) == [3, 3, 4]
    assert chunk_sizes(1, 2) == [0, 1]


def test_each_share_starts_with_its_slow_files_heaviest_first_to_the_lightest_share():
    items = [("a", 1), ("a", 2), ("b", 1), ("c", 1), ("c", 2), ("d", 1), ("d", 2), ("d", 3), ("e", 1), ("f", 1),
             ("f", 2), ("f", 3)]
    order = worker_order(items, 2, lambda item: item[0], {"c": 50, "e": 40, "b": 30})
    assert order[:6] == [("c", 1), ("c", 2), ("a", 1), ("a", 2), ("d", 1), ("d", 2)]  # the first worker's share
    assert order[6:] == [("e", 1), ("b", 1), ("d", 3), ("f", 1), ("f", 2), ("f", 3)]  # 40 + 30 against 50
    assert worker_order(items, 1, lambda item: item[0], {}) == items


def test_a_slow_share_longer_than_a_worker_share_keeps_every_test_once():
    items = [("slow", index) for index in range(5)] + [("fast", 0)]
    assert worker_order(items, 2, lambda item: item[0], {"slow": 10}) == items


def test_every_listed_slow_file_exists():
    assert [name for name in SLOW_FILES if not (TESTS / name).is_file()] == []
