"""The house rules a reader relies on: no function over 60 lines, train.py within 300 lines and
translate.py within 250 (a story read top to bottom, a thin command line)."""

import ast

import pytest
from helpers import ROOT

SOURCES = sorted((ROOT / "transformer").rglob("*.py")) + [
    ROOT / name for name in ("train.py", "translate.py", "serve.py")
]
MAX_FUNCTION_LINES = 60
SCRIPT_LINES = {"transformer/commands/train.py": 300, "transformer/commands/translate.py": 250}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'name (N lines)' of every function or method longer than ``limit``, its decorators and docstring in."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if node.end_lineno - first + 1 > limit:
                found.append(f"{node.name} ({node.end_lineno - first + 1} lines)")
    return found


def test_the_rule_counts_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    assert long_functions(f"def f():\n{body}") == ["f (61 lines)"]
    assert long_functions(f"def f():\n{body[: body.rindex('    x')]}") == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_is_over_60_lines(path):
    assert long_functions(path.read_text("utf-8")) == []


@pytest.mark.parametrize("name", SCRIPT_LINES)
def test_the_scripts_stay_short(name):
    assert len((ROOT / name).read_text("utf-8").splitlines()) <= SCRIPT_LINES[name]
