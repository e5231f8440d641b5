"""The floor plan holds: imports between the parts of the package point one way.

README "Layout" is the map; this is the rule it draws. Every import counts,
at the top of a module, inside a function or under ``TYPE_CHECKING``: a
circle mypy and a reader see is a circle even when Python never runs it.
"""

from __future__ import annotations

import ast
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
        ".inventory",
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
    "dispatch": frozenset({"contract"}),
    "check": frozenset({"contract", "sshadapter.runners.interface"}),
    "daemon": frozenset({"contract", "runners", "dispatch"}),
}
# The bridge starts once per agent session: the socket client, the strict parser and the
# contract's import-free names only (tests/test_mcp_tools.py pins the libraries it loads).
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
    if mine in {"cli", "sshadapter.demo"}:  # the only modules that print and exit
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
    roots = LEAVES | {"sshadapter.cli", "sshadapter.demo"}
    for name in MODULES:
        assert name in roots or part(name) in PARTS, name


@pytest.mark.parametrize("source", sorted(GRAPH))
def test_imports_point_one_way(source: str) -> None:
    """Leaves < contract, runners < dispatch < daemon; check beside; mcp on leaves and codes."""
    wrong = sorted(target for target in GRAPH[source] if not allowed(source, target))
    assert wrong == [], f"{source} may not import {wrong}"


def test_the_contract_runs_no_event_loop_socket_or_process() -> None:
    """The engine judges bytes and a clock: asyncio, sockets and processes stay outside it."""
    for name, path in MODULES.items():
        if part(name) == "contract":
            found = {target.split(".")[0] for target in imported(path)} & CONTRACT_FORBIDDEN
            assert not found, f"{name} imports {sorted(found)}"


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
