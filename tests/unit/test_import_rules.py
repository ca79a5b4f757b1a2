"""Stage packages never import each other (one exception: the RL reward imports the evaluator's scorer), and the
shared pipeline modules they use import no stage, so stages can only hand off through files on disk."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGES = ("data", "sft", "rl", "eval")
SHARED = ("pipeline/config", "pipeline/manifest.py", "pipeline/paths.py", "pipeline/tracking.py",
          "pipeline/seeding.py", "pipeline/models.py", "pipeline/tiny_model.py")
ALLOWED = {("rl", "eval.scoring")}


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


def test_shared_modules_import_no_stage():
    violations = [f"{file.relative_to(REPO)} imports {module}"
                  for relative in SHARED for file in _python_files(relative)
                  for module in _imported_modules(file) if module.split(".")[0] in STAGES]
    assert not violations, "\n".join(violations)
