"""The unit tier imports no verl, vLLM or Ray, neither when a test module is collected nor while a test runs
(directly or through the code it calls): a module or test that does fails and names the new import."""
from __future__ import annotations

import sys

import pytest

HEAVY = ("verl", "vllm", "ray")
LOADED_BEFORE = pytest.StashKey[set]()


def _heavy_loaded() -> set[str]:
    return {name for name in HEAVY if name in sys.modules}


def _refusal(new: set[str]) -> str:
    return f"the unit tier imported {sorted(new)}: move the test to tests/integration/"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    before = _heavy_loaded()
    report = yield
    new = _heavy_loaded() - before
    if new and isinstance(collector, pytest.Module):
        report.outcome, report.longrepr = "failed", f"{collector.nodeid}: {_refusal(new)}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    item.stash[LOADED_BEFORE] = _heavy_loaded()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    new = _heavy_loaded() - item.stash.get(LOADED_BEFORE, set())
    if new:
        pytest.fail(_refusal(new), pytrace=False)
    return result
