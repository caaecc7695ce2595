"""The engine never imports ``scheduler.devtools`` (a node needs none of it): the only
import of it outside the subpackage is the CLI's, inside the ``demo`` command."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "scheduler"


def devtools_imports() -> list[tuple[str, str]]:
    """``(module path, enclosing function or '<module>')`` of every import of scheduler.devtools
    in the scheduler package outside scheduler/devtools/, in file and line order."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if relative.startswith("scheduler/devtools/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for child in ast.walk(node):
                    scopes.setdefault(child, node.name)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if any(name == "scheduler.devtools" or name.startswith("scheduler.devtools.") for name in names):
                found.append((relative, scopes.get(node, "<module>")))
    return found


def test_only_the_demo_command_imports_devtools() -> None:
    assert devtools_imports() == [("scheduler/cli.py", "demo_cmd")]
