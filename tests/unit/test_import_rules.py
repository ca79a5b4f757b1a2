"""Stage packages never import each other (two exceptions: the RL reward imports the evaluator's scorer, the data
stage draws toy rows and benchmarks from the toy world's dispatch ``toy.worlds``), the shared base ``common/``
imports no stage, not the report and not the orchestrator, and no stage imports the orchestrator ``pipeline/`` or
the report ``report/``, so stages can only hand off through files on disk (docs/architecture.md). The report, the
floor above the stages, imports the base and only the evaluation's statistics. No module imports another that
imports it back, not even from inside a function. The unit tier imports no verl, vLLM or Ray and reads nothing from
../shared; its conftest guards do what they say."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGES = ("data", "sft", "rl", "eval", "toy")
ALLOWED = {("rl", "eval.scoring"), ("data", "toy.worlds")}
REPORT_READS = ("eval.metrics", "eval.intervals", "eval.bfcl.checker")
"""What the report may import from the stages: the evaluation's statistics (pass@k, intervals, BFCL's accuracy)."""
PACKAGES = ("common", *STAGES, "pipeline", "report")
HEAVY = ("verl", "vllm", "ray")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _python_files(relative: str) -> list[Path]:
    path = REPO / relative
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def test_stage_packages_do_not_import_each_other():
    violations = []
    for stage in STAGES:
        for file in _python_files(stage):
            for module in _imported_modules(file):
                top = module.split(".")[0]
                if top in STAGES and top != stage and (stage, module) not in ALLOWED:
                    violations.append(f"{file.relative_to(REPO)} imports {module}")
    assert not violations, "\n".join(violations)


def test_the_base_imports_no_stage_no_report_and_no_orchestrator():
    violations = [f"{file.relative_to(REPO)} imports {module}" for file in _python_files("common")
                  for module in _imported_modules(file) if module.split(".")[0] in (*STAGES, "pipeline", "report")]
    assert not violations, "\n".join(violations)


def test_no_stage_imports_the_orchestrator_or_the_report():
    violations = [f"{file.relative_to(REPO)} imports {module}" for stage in STAGES for file in _python_files(stage)
                  for module in _imported_modules(file) if module.split(".")[0] in ("pipeline", "report")]
    assert not violations, "\n".join(violations)


def test_the_report_imports_the_base_and_the_evaluations_statistics_only():
    """The orchestrator starts the report as a process and never imports it; the report reads runs through
    ``common.paths`` and takes from the stages only the statistics of :data:`REPORT_READS`."""
    violations = [f"{file.relative_to(REPO)} imports {module}" for file in _python_files("report")
                  for module in _imported_modules(file) if module.split(".")[0] in (*STAGES, "pipeline")
                  and not module.startswith(REPORT_READS)]
    violations += [f"{file.relative_to(REPO)} imports {module}" for file in _python_files("pipeline")
                   for module in _imported_modules(file) if module.split(".")[0] == "report"]
    assert not violations, "\n".join(violations)


def _module_name(file: Path) -> str:
    parts = file.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports anywhere in its file (inside functions too); ``from a
    import b`` counts ``a.b`` when that is a module."""
    modules = {_module_name(file): file for package in PACKAGES for file in _python_files(package)}
    graph = {}
    for name, file in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), filename=str(file))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
        graph[name] = {module for module in imported if module in modules and module != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycle_not_even_through_an_import_inside_a_function():
    # eval.run imported eval.bfcl_stage inside run() because eval.bfcl_stage imported eval.run: a cycle, hidden.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(_import_graph()) == []


def test_unit_tests_import_no_engine_even_inside_a_function():
    violations = [f"{file.relative_to(REPO)} imports {module}" for file in _python_files("tests/unit")
                  for module in _imported_modules(file) if module.split(".")[0] in HEAVY]
    assert not violations, "\n".join(violations)


def test_unit_tests_name_no_shared_folder():
    """No path component ``shared`` and no path starting ``../shared`` (this file names them to look for them)."""
    files = [file for file in _python_files("tests/unit") if file != Path(__file__).resolve()]
    violations = [f"{file.relative_to(REPO)}:{node.lineno} {node.value!r}" for file in files
                  for node in ast.walk(ast.parse(file.read_text(encoding="utf-8")))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and (node.value == "shared" or node.value.startswith("../shared"))]
    assert not violations, "\n".join(violations)


def _load(relative: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"loaded_{relative.replace('/', '_')[:-3]}", REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_unit_guard_fails_a_test_that_imports_an_engine(monkeypatch):
    guard = _load("tests/unit/conftest.py")
    item = SimpleNamespace(stash=pytest.Stash())
    with monkeypatch.context() as patch:  # undone before this test's own guard looks at sys.modules
        for name in HEAVY:
            patch.delitem(sys.modules, name, raising=False)
        setup = guard.pytest_runtest_setup(item)
        next(setup)
        with pytest.raises(StopIteration):
            setup.send(None)
        call = guard.pytest_runtest_call(item)
        next(call)
        patch.setitem(sys.modules, "ray", ModuleType("ray"))
        with pytest.raises(pytest.fail.Exception, match=r"imported \['ray'\]"):
            call.send(None)


class _Item:
    def __init__(self, path: Path, marks: tuple[str, ...] = (), fixtures: tuple[str, ...] = ()):
        self.path, self.nodeid, self.fixturenames = path, str(path.relative_to(REPO)), list(fixtures)
        self.marks = [SimpleNamespace(name=mark) for mark in marks]

    def iter_markers(self):
        return iter(self.marks)

    def add_marker(self, name: str) -> None:
        self.marks.append(SimpleNamespace(name=name))


def test_tier_is_the_folder():
    tiers = _load("tests/conftest.py")
    fine = [_Item(REPO / "tests/unit/test_a.py"), _Item(REPO / "tests/e2e/test_b.py", marks=("e2e",))]
    tiers.pytest_collection_modifyitems(fine)
    assert [[mark.name for mark in item.iter_markers()] for item in fine] == [["unit"], ["e2e", "e2e"]]
    misplaced = [_Item(REPO / "tests/integration/test_c.py", marks=("e2e",)),
                 _Item(REPO / "tests/unit/test_d.py", fixtures=("tmp_path", "shared_data"))]
    with pytest.raises(pytest.UsageError) as error:
        tiers.pytest_collection_modifyitems(misplaced)
    assert str(error.value).splitlines()[1:] == [
        "tests/integration/test_c.py: marked ['e2e'] but lives in tests/integration/ (move it to tests/e2e/)",
        "tests/unit/test_d.py: a unit test reads ../shared (move it to tests/integration/)"]


def test_the_verl_plugin_imports_before_anything_else():
    """verl imports ``rl.verl_cpu_plugin`` first in each Ray worker; an import cycle through the config package
    showed only there (as verl's 'Unknown platform cpu')."""
    import subprocess

    result = subprocess.run([sys.executable, "-c", "import rl.verl_cpu_plugin"], cwd=REPO, capture_output=True,
                            text=True, env={"PATH": "", "VERL_PLATFORM": ""})
    assert result.returncode == 0, result.stderr[-2000:]
