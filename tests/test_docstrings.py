"""Every test says in one line what it shows (CONTRIBUTING.md, "Rules a change must keep").

Read with ast from the source, so a test in a class, a nested one or one pytest would not
collect is held to the rule too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# A sentence ends at ".", "?" or "!" followed by a space and a capital letter: "e.g. the"
# and "`a.b` is" do not end one.
SENTENCE_END = re.compile(r"[.?!]\s+[A-Z]")


def source_files() -> list[Path]:
    """The Python files of tests/ and of its folders (parts, support/, bench/; not node_modules)."""
    return sorted([*TESTS.glob("*.py"), *TESTS.glob("*/*.py")])


def summary_problem(doc: str | None) -> str | None:
    """What is wrong with a test's docstring, or None when its first line is one sentence."""
    if doc is None or not doc.strip():
        return "no docstring"
    lines = doc.splitlines()
    first = lines[0].strip()
    if not first:
        return "the first line is empty"
    if len(lines) > 1 and lines[1].strip():
        return "the first sentence runs onto the second line (leave a blank line after it)"
    if not first.endswith((".", "?", "!")):
        return "the first line does not end a sentence"
    if SENTENCE_END.search(first[:-1]):
        return "the first line holds more than one sentence"
    return None


def test_every_test_has_a_one_sentence_docstring() -> None:
    """Every test_* function of tests/, in a class or not, opens its docstring with one sentence."""
    problems = []
    checked = 0
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("test_"):
                checked += 1
                problem = summary_problem(ast.get_docstring(node))
                where = f"{path.relative_to(TESTS)}:{node.lineno} {node.name}"
                if problem:
                    problems.append(f"{where}: {problem}")
    assert checked > 400  # the walk found the suite
    assert problems == []


def test_the_rule_catches_what_it_names() -> None:
    """The check refuses a missing docstring, a wrapped first line and two sentences on it."""
    assert summary_problem(None) == "no docstring"
    assert summary_problem("Shows a thing.") is None
    assert summary_problem("Shows a thing.\n\nAnd explains it at length.") is None
    assert summary_problem("`a.b` is checked, e.g. twice.") is None
    assert summary_problem("Shows a thing and\nanother.") is not None
    assert summary_problem("Shows a thing") is not None
    assert summary_problem("Shows a thing. Then another.") is not None
    assert summary_problem("\nShows a thing.") is not None
