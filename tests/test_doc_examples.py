"""The docs' example operation passes every check a shipped operation passes.

The operator guide (docs/guide.md, "Write an operation") writes ``file_stat`` as ``guide:file``
blocks: the command file, its schema and its fixtures. docs/command-files.md shows "A minimal
schema" for the same tool. Both are taken from the docs as written (the guide's schema, and the
guide's operation with the minimal schema instead) into a commands/ and schemas/ directory
beside a copy of config.example.toml, and each goes through the checks the shipped operations
get in their own test files, by the same helper functions: `sshadapter check` and the schema
loader and lint (test_cli, test_schemas), the published envelope schema (test_envelope_schema),
the fuzzed closed envelope and the envelope guard (test_evaluate), the two validators
(test_schema_agreement), the bridge's envelopes (test_mcp_tools), and the dispatcher's policy
(test_dispatch).
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import test_dispatch
import test_envelope_schema
import test_evaluate
import test_mcp_tools
import test_schema_agreement
import test_schemas
from dispatch_support import registry_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_operator_guide import guide_blocks

ROOT = Path(__file__).resolve().parents[1]
TOOL = "file_stat"
GUIDE_DIRECTORY = "/etc/sshadapter/"  # where the guide writes the operation's files
MINIMAL_SCHEMA = "A minimal schema for a text extractor's object:"
VARIANTS = ["docs/guide.md", "docs/command-files.md"]


def minimal_schema() -> str:
    """The JSON block that follows "A minimal schema" in docs/command-files.md."""
    text = (ROOT / "docs" / "command-files.md").read_text()
    after = text[text.index(MINIMAL_SCHEMA) :]
    start = after.index("```json\n") + len("```json\n")
    return after[start : after.index("```\n", start)]


def example_tree(root: Path, variant: str) -> Path:
    """``root`` with config.toml, commands/ and schemas/ holding the docs' file_stat."""
    written = []
    for block in guide_blocks():
        if block.kind == "file" and f"/{TOOL}." in block.arg:
            assert block.arg.startswith(GUIDE_DIRECTORY), block.arg
            path = root / block.arg.removeprefix(GUIDE_DIRECTORY)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text)
            written.append(path.relative_to(root).as_posix())
        elif block.kind == "run":  # the guide's `touch` of an empty stdout
            for line in block.text.splitlines():
                if line.startswith(f"touch {GUIDE_DIRECTORY}") and f"/{TOOL}." in line:
                    path = root / line.removeprefix(f"touch {GUIDE_DIRECTORY}")
                    path.touch()
                    written.append(path.relative_to(root).as_posix())
    assert f"commands/{TOOL}.toml" in written and f"schemas/{TOOL}.v1.json" in written
    assert any(name.endswith(".case.json") for name in written), written
    if variant == "docs/command-files.md":
        schema = minimal_schema()
        assert json.loads(schema)["required"], schema
        (root / "schemas" / f"{TOOL}.v1.json").write_text(schema)
    shutil.copy(ROOT / "config.example.toml", root / "config.toml")  # paths relative to it
    return root


@pytest.fixture(scope="module", params=VARIANTS)
def example(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding one variant of the docs' example operation."""
    variant: str = request.param
    return example_tree(tmp_path_factory.mktemp("example"), variant)


@functools.cache
def loaded(example: Path, dispatch_hosts: tuple[str, ...] = ()) -> Any:
    """The example's registry (loaded once: hypothesis calls for it on every example)."""
    return registry_of(example / "commands", example / "schemas", dispatch_hosts)


def test_the_example_passes_sshadapter_check_and_the_schema_lint(example: Path) -> None:
    """`sshadapter check` over the example ends in 0 missed; its schema loads and lints clean."""
    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", "check", "--config", str(example / "config.toml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert " checks over 1 tools: " in last and last.endswith(" ok, 0 missed"), last
    test_schemas.assert_load_and_lint_clean(example / "schemas")
    op = loaded(example).operations[TOOL]
    assert op.spec.read_only  # as every shipped example


def test_the_examples_envelope_schema_shows_only_the_contract(example: Path) -> None:
    """Its published schema is self-contained, names no command, and has an $id of its own."""
    op = loaded(example).operations[TOOL]
    test_envelope_schema.assert_shows_only_the_contract(op)
    shipped = test_envelope_schema.SHIPPED.operations.values()
    assert op.envelope_schema["$id"] not in {other.envelope_schema["$id"] for other in shipped}


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data(), exit_status=test_evaluate.EXIT_STATUSES, stderr=test_evaluate.STDERRS)
def test_any_output_of_the_example_ends_in_a_closed_envelope(
    example: Path, data: st.DataObject, exit_status: int, stderr: bytes
) -> None:
    """Random and mutated outputs of the example never raise; a rejection carries none of them."""
    commands = example / "commands"
    args = data.draw(st.sampled_from(test_evaluate.fixture_args(commands, TOOL)), label="args")
    stdout = data.draw(test_evaluate.stdouts(commands), label="stdout")
    registry = loaded(example)
    test_evaluate.assert_a_closed_envelope(registry, TOOL, args, exit_status, stdout, stderr)


def test_the_examples_guard_validators_and_bridge_envelopes_agree(example: Path) -> None:
    """Guard and envelope schema, jsonschema-rs and the reference, bridge failures: all agree."""
    registry = loaded(example)
    assert test_evaluate.assert_guard_agrees(registry) > 0
    values = test_schema_agreement.parsed_values(registry)
    assert values
    for value in values:
        test_schema_agreement.assert_validators_agree(registry, *value.values)
    for code in ("INTERNAL", "OVERLOADED"):
        test_mcp_tools.assert_bridge_envelopes_fit(registry.operations[TOOL], code, True)


def test_the_examples_fixture_arguments_pass_the_dispatcher(example: Path) -> None:
    """Behind a dispatcher, every fixture's arguments run as exactly the daemon's argv."""
    registry = loaded(example, dispatch_hosts=("ci", "local"))
    test_dispatch.assert_fixture_arguments_pass(registry, registry.operations[TOOL])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_the_examples_commands_pass_the_dispatcher_exactly(
    example: Path, data: st.DataObject
) -> None:
    """Valid arguments give the daemon's argv; an edited command passes only if the daemon's."""
    registry = loaded(example, dispatch_hosts=("ci", "local"))
    op = registry.operations[TOOL]
    test_dispatch.assert_valid_arguments_pass(registry, op, data)
    test_dispatch.assert_a_mutated_command_is_refused(registry, op, data)
