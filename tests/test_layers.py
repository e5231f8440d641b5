"""The floor plan holds: imports between the parts of the package point one way.

README "Layout" is the map; this is the rule it draws. Every import counts,
at the top of a module, inside a function or under ``TYPE_CHECKING``: a
circle mypy and a reader see is a circle even when Python never runs it.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sshadapter"
# Shipped as one file (the launcher with the dispatcher's source in it), never imported.
HOST_PROGRAMS = frozenset({"sshadapter.dispatch.dispatcher", "sshadapter.dispatch.launcher"})

# The root modules every part may use: they import only one another.
LEAVES = frozenset(
    f"sshadapter{name}"
    for name in (
        "",
        ".errors",
        ".rfc8259",
        ".strict_json",
        ".config",
        ".sections",
        ".config_read",
        ".bounded_read",
        ".client",
        ".shipped",
        ".shown",
        ".safe_write",
        ".pacing",
        ".catalog",
    )
)
# What each part may import besides itself and the leaves. The seam's value type
# (runners.interface.RunResult) is what the contract judges, so it may use that module.
ALLOWED: dict[str, frozenset[str]] = {
    "contract": frozenset({"sshadapter.runners.interface"}),
    "runners": frozenset(),
    "inventory": frozenset(),
    "dispatch": frozenset({"contract", "inventory"}),
    "check": frozenset({"contract", "sshadapter.runners.interface"}),
    # The trail's timestamps are the contract's one definition of a timestamp.
    "audit": frozenset({"sshadapter.contract.rfc3339"}),
    "daemon": frozenset({"contract", "runners", "dispatch", "audit", "inventory"}),
}
# The bridge starts once per agent session: the socket client, the strict parser and the
# contract's import-free names only (tests/mcp/test_mcp_tools.py pins the libraries it loads).
MCP_ALLOWED = frozenset(
    {
        "sshadapter",
        "sshadapter.rfc8259",
        "sshadapter.strict_json",
        "sshadapter.client",
        "sshadapter.contract",
        "sshadapter.contract.codes",
    }
)
# The command line is a part of its own: it may import every part, and none imports it.
PARTS = frozenset({*ALLOWED, "mcp", "cli"})
# The command line and its demo (with the demo's hosts): the only modules that print and exit.
PRINTING = frozenset({"cli", "sshadapter.demo", "sshadapter.demo_hosts"})
# The pure engine runs in evaluation workers and offline checks: no event loop, no network,
# no processes.
CONTRACT_FORBIDDEN = frozenset(
    {"asyncio", "socket", "selectors", "subprocess", "multiprocessing", "concurrent", "asyncssh"}
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path) -> Iterator[str]:
    """Every module name an import statement of ``path`` names (absolute imports only)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path}: a relative import"
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


GRAPH = {
    name: {target for target in imported(path) if target in MODULES} - {name}
    for name, path in MODULES.items()
    if name not in HOST_PROGRAMS
}


def part(name: str) -> str:
    """``contract`` for sshadapter.contract.*, the module itself for a root module."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PARTS else name


def allowed(source: str, target: str) -> bool:
    mine = part(source)
    if mine in PRINTING:
        return True
    if target in LEAVES:
        return mine != "mcp" or target in MCP_ALLOWED
    if mine == "mcp":
        return part(target) == "mcp" or target in MCP_ALLOWED
    if source in LEAVES:
        return False
    theirs = part(target)
    return theirs == mine or theirs in ALLOWED[mine] or target in ALLOWED[mine]


def test_the_tree_has_the_parts_the_map_names() -> None:
    """Every module belongs to a part of README "Layout" or is a root module the rule names."""
    roots = LEAVES | PRINTING
    for name in MODULES:
        assert name in roots or part(name) in PARTS, name


@pytest.mark.parametrize("source", sorted(GRAPH))
def test_imports_point_one_way(source: str) -> None:
    """Leaves < contract, runners, audit, inventory < dispatch < daemon; check and mcp beside."""
    wrong = sorted(target for target in GRAPH[source] if not allowed(source, target))
    assert wrong == [], f"{source} may not import {wrong}"


def test_the_contract_runs_no_event_loop_socket_or_process() -> None:
    """The engine judges bytes and a clock: asyncio, sockets and processes stay outside it."""
    for name, path in MODULES.items():
        if part(name) == "contract":
            found = {target.split(".")[0] for target in imported(path)} & CONTRACT_FORBIDDEN
            assert not found, f"{name} imports {sorted(found)}"


# What a module may not load, through every import it runs in turn (third-party ones too):
# the test above reads what the contract names, this one what Python loads. The contract
# runs in evaluation workers and offline checks, so no event loop, no SSH library, no
# environment reader and no processes; the metrics name the pool's close reasons, not its
# SSH library. (socket and selectors are not here: jsonschema's format checkers load them,
# and loading one opens nothing.)
NEVER_LOADED = frozenset(
    {"asyncio", "asyncssh", "pydantic_settings", "subprocess", "multiprocessing", "concurrent"}
)
LOADS_FORBIDDEN: dict[str, frozenset[str]] = {
    **{name: NEVER_LOADED for name in MODULES if part(name) == "contract"},
    "sshadapter.daemon.metrics": frozenset({"asyncssh"}),
}


# Under ./scripts/test, coverage's subprocess patch starts a measurement in every Python child
# it finds these variables in, and the measurement loads multiprocessing itself: the child that
# reports what a module loads runs unmeasured.
UNMEASURED = {
    key: value
    for key, value in os.environ.items()
    if key not in {"COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START"}
}


@pytest.mark.parametrize("name", sorted(LOADS_FORBIDDEN))
def test_what_a_module_loads_keeps_its_promise(name: str) -> None:
    """Imported alone in a fresh interpreter, the module loads none of its forbidden modules.

    What the interpreter had loaded before the import is not the module's doing (coverage,
    when the suite runs under it, starts in every interpreter and loads multiprocessing)."""
    code = (
        "import sys, importlib; before = {m.split('.')[0] for m in sys.modules}; "
        f"importlib.import_module({name!r}); "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=UNMEASURED,
    )
    assert sorted(LOADS_FORBIDDEN[name] & set(done.stdout.split())) == []


def test_nobody_imports_the_host_program() -> None:
    """sshadapter-dispatch runs on another machine: it is read as bytes, never imported."""
    assert set(MODULES) >= HOST_PROGRAMS
    for name, path in MODULES.items():
        assert HOST_PROGRAMS.isdisjoint(imported(path)), name


def test_there_is_no_import_circle() -> None:
    """No module reaches itself through its imports (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in GRAPH.get(name, ()):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = [stack.pop()]
            while component[-1] != name:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    assert circles == []


def layout_map() -> set[str]:
    """The module paths README "Layout" draws, rebuilt from its indentation."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout\n", 1)[1].split("```\n", 2)[1]
    paths: set[str] = set()
    stack: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = (len(line) - len(line.lstrip())) // 2
        first = line.split()[0]
        if indent == 0:
            stack = [first.rstrip("/")] if first == "sshadapter/" else []
            continue
        if not stack or not (first.endswith("/") or first.endswith(".py")):
            continue  # a continuation line, or outside the package
        del stack[indent:]
        if first.endswith("/"):
            stack.append(first.rstrip("/"))
        else:
            paths.add("/".join([*stack, first]))
    return paths


def test_the_readme_layout_names_every_module() -> None:
    """The map is the tree: every module listed where it is, and nothing that is not there."""
    modules = {
        str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"
    }
    assert layout_map() == modules


# Paths of the machine a module was written on, and of the studies beside the repository:
# a reader of the tree has neither. What the code relies on is said in docs/.
OUTSIDE_THE_TREE = re.compile(r"\.\./shared|/work/|research/")
# A Markdown file a source names: every one is a file of the tree (docs/..., or a
# fixture folder's PROVENANCE.md), never a study or a design note kept elsewhere.
NAMED_DOCUMENT = re.compile(r"[\w./-]+\.md\b")


def test_no_source_names_anything_outside_the_tree() -> None:
    """Modules and command files cite docs/ and the tree, never a path or a note beyond it."""
    basenames = {path.name for path in PACKAGE.rglob("*.md")}
    sources = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.toml")]
    assert len(sources) > len(MODULES)
    wrong = []
    for path in sources:
        text = path.read_text()
        wrong += [f"{path.relative_to(ROOT)}: {hit}" for hit in OUTSIDE_THE_TREE.findall(text)]
        for name in NAMED_DOCUMENT.findall(text):
            beside = (ROOT / name).is_file() or (path.parent / name).is_file()
            if not beside and ("/" in name or name not in basenames):
                wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert wrong == []


# A file or a part the drawing names: "runners/interface.py", "catalog/__init__.py", "daemon/".
DRAWN_NAME = re.compile(r"(?:\w+/)*\w+\.py|\w+/")


def drawn_name(token: str) -> str:
    """``contract`` for a part drawn as contract/, the module name for a file."""
    if token.endswith("/"):
        return token.rstrip("/")
    return module_name(PACKAGE / token)


def drawing() -> dict[str, set[str]]:
    """CONTRIBUTING's drawing of the tree: each row's key and the names it lists."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = text.split("The drawing of the tree", 1)[1].split("```text\n", 1)[1]
    rows: dict[str, set[str]] = {}
    key = ""
    for line in block.split("```", 1)[0].splitlines()[1:]:
        if not line.startswith("   "):  # a new row: its key, then its names
            key, _, line = line.strip().partition(" ")
            rows[key] = set()
        rows[key] |= {drawn_name(token) for token in DRAWN_NAME.findall(line)}
    return rows


def test_contributing_draws_the_rule_this_test_enforces() -> None:
    """CONTRIBUTING's drawing lists the leaves, parts, edges, bridge and printers enforced here."""
    rows = drawing()
    assert rows.pop("leaves") == set(LEAVES)
    assert rows.pop("mcp/") == set(MCP_ALLOWED)
    assert rows.pop("cli/") == PRINTING - {"cli"}
    assert rows.pop("unimported") == set(HOST_PROGRAMS)
    assert {key.rstrip("/"): names for key, names in rows.items()} == ALLOWED
    drawn = {key.rstrip("/") for key in drawing() if key.endswith("/")}
    assert drawn == PARTS
    assert all((PACKAGE / name / "__init__.py").is_file() for name in drawn)
