"""Stage packages never import each other (two exceptions: the RL reward imports the evaluator's scorer, the data
stage draws toy rows and benchmarks from the toy world's dispatch ``toy.worlds``), the shared base ``common/``
imports no stage and not the orchestrator, and no stage imports the orchestrator ``pipeline/``, so stages can only
hand off through files on disk (docs/architecture.md). The unit tier imports no verl, vLLM or Ray and reads nothing
from ../shared; its conftest guards do what they say."""
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


def test_the_base_imports_no_stage_and_no_orchestrator():
    violations = [f"{file.relative_to(REPO)} imports {module}" for file in _python_files("common")
                  for module in _imported_modules(file) if module.split(".")[0] in (*STAGES, "pipeline")]
    assert not violations, "\n".join(violations)


def test_no_stage_imports_the_orchestrator():
    violations = [f"{file.relative_to(REPO)} imports {module}" for stage in STAGES for file in _python_files(stage)
                  for module in _imported_modules(file) if module.split(".")[0] == "pipeline"]
    assert not violations, "\n".join(violations)


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
