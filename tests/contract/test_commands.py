"""The command loader: every rule of docs/command-files.md, one test each.

Each test builds a small commands/ and schemas/ pair in tmp_path from one
minimal valid operation and changes exactly one thing in it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sshadapter.contract.argv import MAX_COMMAND_BYTES
from sshadapter.contract.registry import Operation, Registry, load_registry
from sshadapter.contract.schemas import DRAFT_2020_12
from sshadapter.errors import ConfigError, RequestError

HOSTS = ("ci",)

SCHEMA: dict[str, Any] = {
    "$schema": DRAFT_2020_12,
    "type": "object",
    "required": ["item_id", "state"],
    "properties": {
        "item_id": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "state": {"type": "string", "enum": ["up", "down"]},
        "note": {"type": "string", "maxLength": 64},
    },
    "additionalProperties": False,
}

COMMAND = """\
description = "State of one item."
version = 1
host = "ci"
argv = ["item-cli", "status", "{item_id}"]

[params.item_id]
type = "string"
pattern = '^[a-z]{1,8}$'

[output]
format = "json"
schema = "item.v1.json"
exit_codes = { 0 = "success", 4 = "NOT_FOUND" }

[checks]
equal = { item_id = "item_id" }

[agent]
fields = ["item_id", "state"]
"""

# Text formats need an extractor; these replace the `format = "json"` line.
LINES = 'format = "lines"\nshape = "one"\nrow = \'^(?P<item_id>[a-z]+) (?P<state>up|down)$\''
REGEX = "format = \"regex\"\npattern = '^(?P<item_id>[a-z]+) (?P<state>up|down)$'"

# An operation built to exercise argv templates: placeholders inside elements,
# literal braces, an integer, a boolean and a deliberately permissive free-text param.
TEMPLATE = """\
description = "Echo its arguments."
version = 1
host = "ci"
argv = ["echo", "--project={project}", "{{literal}}", "{text}", "--count={count}", "{flag}"]

[params.project]
type = "string"
pattern = '^[a-z0-9-]{1,20}$'

[params.text]
type = "string"
pattern = '^[\\s\\S]{0,200}$'

[params.count]
type = "integer"
minimum = 0
maximum = 100

[params.flag]
type = "boolean"

[output]
format = "json"
schema = "item.v1.json"

[agent]
fields = ["item_id"]
"""


def replaced(old: str, new: str, text: str = COMMAND) -> str:
    """``text`` with the one occurrence of ``old`` replaced: the single change of a test."""
    assert text.count(old) == 1, f"{old!r} must occur exactly once"
    return text.replace(old, new)


def write(
    root: Path, commands: dict[str, str | bytes], schemas: dict[str, Any] | None = None
) -> tuple[Path, Path]:
    commands_dir, schemas_dir = root / "commands", root / "schemas"
    commands_dir.mkdir()
    schemas_dir.mkdir()
    for name, text in commands.items():
        data = text.encode() if isinstance(text, str) else text
        (commands_dir / name).write_bytes(data)
    for name, schema in (schemas or {"item.v1.json": SCHEMA}).items():
        (schemas_dir / name).write_text(json.dumps(schema))
    return commands_dir, schemas_dir


def load(
    root: Path,
    text: str | bytes = COMMAND,
    *,
    name: str = "item_status.toml",
    hosts: tuple[str, ...] | None = HOSTS,
) -> Registry:
    commands_dir, schemas_dir = write(root, {name: text})
    return load_registry(commands_dir, schemas_dir, hosts=hosts)


def refused(root: Path, text: str | bytes, *, name: str = "item_status.toml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(root, text, name=name)
    return info.value


def assert_names(
    exc: ConfigError, root: Path, key: str, phrase: str, name: str = "item_status.toml"
) -> None:
    assert Path(exc.file) == root / "commands" / name
    assert exc.key == key
    assert phrase in exc.reason
    assert str(exc) == (f"{exc.file}: {key}: {exc.reason}" if key else f"{exc.file}: {exc.reason}")


def test_minimal_operation_loads(tmp_path: Path) -> None:
    """The minimal example every other test mutates is itself valid."""
    registry = load(tmp_path)
    op = registry.get("item_status")
    assert op is not None
    assert op.command({"item_id": "abc"}) == "item-cli status abc"
    assert op.exit_meaning(4) == ("NOT_FOUND", "")
    assert op.exit_meaning(3) is None


def test_read_only_is_false_unless_the_operator_says_so(tmp_path: Path) -> None:
    """`read_only` defaults to false, is taken as written, and must be a boolean."""
    for sub in "abc":
        (tmp_path / sub).mkdir()
    assert load(tmp_path / "a").operations["item_status"].spec.read_only is False
    said = load(tmp_path / "b", replaced('host = "ci"', 'host = "ci"\nread_only = true'))
    assert said.operations["item_status"].spec.read_only is True
    exc = refused(tmp_path / "c", replaced('host = "ci"', 'host = "ci"\nread_only = "maybe"'))
    assert exc.key == "read_only"


def test_every_shipped_operation_is_marked_read_only() -> None:
    """The examples only read: each says so, so MCP hosts may run them without asking."""
    root = Path(__file__).resolve().parents[2]
    shipped = load_registry(root / "commands", root / "schemas", hosts=None)
    assert shipped.operations
    assert all(op.spec.read_only for op in shipped.operations.values())


# --- unknown keys -------------------------------------------------------------------------------


def test_unknown_top_level_key_is_refused(tmp_path: Path) -> None:
    """A top-level key the contract does not define is an error, not ignored."""
    exc = refused(tmp_path, replaced("version = 1\n", "version = 1\nnope = true\n"))
    assert_names(exc, tmp_path, "nope", "unknown key")


def test_unknown_output_key_is_refused(tmp_path: Path) -> None:
    """A typo inside [output] is named with its table."""
    exc = refused(tmp_path, replaced('format = "json"', 'format = "json"\nmax_byte = 10'))
    assert_names(exc, tmp_path, "output.max_byte", "unknown key")


def test_missing_schema_file_is_refused(tmp_path: Path) -> None:
    """output.schema must name a file of schemas/."""
    exc = refused(tmp_path, replaced('"item.v1.json"', '"other.v1.json"'))
    assert_names(exc, tmp_path, "output.schema", "no schema 'other.v1.json'")


# --- params and placeholders --------------------------------------------------------------------


def test_undefined_placeholder_is_refused(tmp_path: Path) -> None:
    """A placeholder must be a declared parameter."""
    exc = refused(tmp_path, replaced('"{item_id}"]', '"{item_id}", "{nope}"]'))
    assert_names(exc, tmp_path, "argv", "placeholder {nope} is not a declared [params.nope]")


def test_unused_param_is_refused(tmp_path: Path) -> None:
    """A declared parameter that no argv element uses is an error."""
    extra = '[params.extra]\ntype = "boolean"\n\n[output]'
    exc = refused(tmp_path, replaced("[output]", extra))
    assert_names(exc, tmp_path, "params.extra", "not used in argv")


def test_string_param_without_pattern_or_enum_is_refused(tmp_path: Path) -> None:
    """Every string parameter must be constrained by a pattern or an enum."""
    exc = refused(tmp_path, replaced("pattern = '^[a-z]{1,8}$'", "maxLength = 8"))
    assert_names(exc, tmp_path, "params.item_id", "needs `pattern` or `enum`")


def test_integer_param_without_bounds_is_refused(tmp_path: Path) -> None:
    """An integer parameter needs both minimum and maximum."""
    text = replaced('"{item_id}"]', '"{item_id}", "{count}"]')
    text = replaced("[output]", '[params.count]\ntype = "integer"\nminimum = 0\n\n[output]', text)
    exc = refused(tmp_path, text)
    assert_names(exc, tmp_path, "params.count", "needs `minimum` and `maximum`")


# --- exit codes and retries ---------------------------------------------------------------------


def test_unknown_exit_meaning_is_refused(tmp_path: Path) -> None:
    """An exit status may only map to success or a known error code."""
    exc = refused(tmp_path, replaced('4 = "NOT_FOUND"', '3 = "BROKEN"'))
    assert_names(exc, tmp_path, "output.exit_codes.3", "'BROKEN' is not one of")


def test_exit_status_out_of_range_is_refused(tmp_path: Path) -> None:
    """An exit status is 0-255; 256 cannot happen and is a typo."""
    exc = refused(tmp_path, replaced('4 = "NOT_FOUND"', '256 = "NOT_FOUND"'))
    assert_names(exc, tmp_path, "output.exit_codes.256", "not an exit status 0-255")


def test_exit_codes_without_success_are_refused(tmp_path: Path) -> None:
    """Some exit status must mean success."""
    exc = refused(tmp_path, replaced('0 = "success", ', ""))
    assert_names(exc, tmp_path, "output.exit_codes", "no status means success")


# An exit status whose meaning depends on stderr (findmnt's 1: silent when nothing is
# mounted there, a usage message when it lacks an option).
BY_EMPTY = '4 = { if_stderr = "empty", then = "NOT_FOUND", otherwise = "INVALID_RESPONSE" }'
BY_PATTERN = (
    "4 = { if_stderr_matches = '^item-cli: [a-z]+: no such item$', "
    'then = "NOT_FOUND", otherwise = "UPSTREAM_UNAVAILABLE" }'
)


def by_stderr(tmp_path: Path, entry: str) -> Operation:
    op = load(tmp_path, replaced('4 = "NOT_FOUND"', entry)).get("item_status")
    assert op is not None
    return op


def test_exit_status_by_empty_stderr(tmp_path: Path) -> None:
    """`if_stderr = "empty"`: `then` only for no stderr byte at all, `otherwise` for any."""
    op = by_stderr(tmp_path, BY_EMPTY)
    assert op.exit_meaning(4, b"") == ("NOT_FOUND", "stderr empty")
    assert op.exit_meaning(4, b"\n") == ("INVALID_RESPONSE", "stderr not empty")
    assert op.exit_meaning(4, b"item-cli: invalid option -- 'J'\n") == (
        "INVALID_RESPONSE",
        "stderr not empty",
    )
    assert op.exit_meaning(0, b"warning\n") == ("success", "")  # success is the status's alone
    assert op.exit_meaning(3, b"") is None


@pytest.mark.parametrize(
    ("stderr", "meaning"),
    [
        (b"item-cli: abc: no such item\n", "NOT_FOUND"),
        (b"item-cli: abc: no such item", "NOT_FOUND"),  # the final newline is optional
        (b"", "UPSTREAM_UNAVAILABLE"),
        (b"item-cli: abc: no such item\n\n", "UPSTREAM_UNAVAILABLE"),  # only one newline
        (b"item-cli: abc: no such item\nitem-cli: abc: no such item\n", "UPSTREAM_UNAVAILABLE"),
        (b"warning: x\nitem-cli: abc: no such item\n", "UPSTREAM_UNAVAILABLE"),  # whole stderr
        (b"item-cli: abc: no such item (cached)\n", "UPSTREAM_UNAVAILABLE"),
        (b"item-cli: ab\xff: no such item\n", "UPSTREAM_UNAVAILABLE"),  # not UTF-8
        (b"item-cli: abc: permission denied\n", "UPSTREAM_UNAVAILABLE"),
    ],
)
def test_exit_status_by_stderr_pattern(tmp_path: Path, stderr: bytes, meaning: str) -> None:
    """`if_stderr_matches`: the pattern must match all of stderr, less one final newline."""
    found = by_stderr(tmp_path, BY_PATTERN).exit_meaning(4, stderr)
    assert found is not None and found.meaning == meaning


def error_codes(op: Operation) -> list[str]:
    codes: list[str] = op.envelope_schema["oneOf"][1]["properties"]["error"]["properties"]["code"][
        "enum"
    ]
    return codes


def test_not_found_in_a_stderr_case_is_published(tmp_path: Path) -> None:
    """NOT_FOUND named only by a stderr case is among the envelope's codes, and only then."""
    assert "NOT_FOUND" in error_codes(by_stderr(tmp_path, BY_EMPTY))
    (other := tmp_path / "other").mkdir()
    without = BY_EMPTY.replace('"NOT_FOUND"', '"UPSTREAM_UNAVAILABLE"')
    assert "NOT_FOUND" not in error_codes(by_stderr(other, without))


@pytest.mark.parametrize(
    ("entry", "key", "phrase"),
    [
        (
            '4 = { if_stderr = "empty", then = "success", otherwise = "NOT_FOUND" }',
            "output.exit_codes.4.then",
            "stderr only chooses between failures",
        ),
        (
            '4 = { if_stderr = "empty", then = "NOT_FOUND", otherwise = "BROKEN" }',
            "output.exit_codes.4.otherwise",
            "'BROKEN' is not one of NOT_FOUND, UPSTREAM_UNAVAILABLE, INVALID_RESPONSE",
        ),
        (
            '4 = { if_stderr = "empty", then = "NOT_FOUND", otherwise = "NOT_FOUND" }',
            "output.exit_codes.4.otherwise",
            "same as `then`",
        ),
        (
            '4 = { then = "NOT_FOUND", otherwise = "INVALID_RESPONSE" }',
            "output.exit_codes.4.if_stderr",
            "exactly one of if_stderr, if_stderr_matches",
        ),
        (
            '4 = { if_stderr = "empty", if_stderr_matches = \'^x$\', then = "NOT_FOUND", '
            'otherwise = "INVALID_RESPONSE" }',
            "output.exit_codes.4.if_stderr",
            "exactly one of if_stderr, if_stderr_matches",
        ),
        (
            '4 = { if_stderr = "blank", then = "NOT_FOUND", otherwise = "INVALID_RESPONSE" }',
            "output.exit_codes.4.if_stderr",
            "'empty'",
        ),
        (
            '4 = { if_stderr = "empty", then = "NOT_FOUND" }',
            "output.exit_codes.4.otherwise",
            "required key is missing",
        ),
        (
            '4 = { if_stderr = "empty", then = "NOT_FOUND", otherwise = "INVALID_RESPONSE", '
            'else = "UPSTREAM_UNAVAILABLE" }',
            "output.exit_codes.4.else",
            "unknown key",
        ),
        (
            "4 = { if_stderr_matches = '^(x$', then = \"NOT_FOUND\", "
            'otherwise = "INVALID_RESPONSE" }',
            "output.exit_codes.4.if_stderr_matches",
            "not a valid regular expression",
        ),
        ("4 = 5", "output.exit_codes.4", "valid string"),
    ],
    ids=[
        "success",
        "unknown-meaning",
        "same-twice",
        "no-test",
        "two-tests",
        "unknown-test",
        "no-otherwise",
        "unknown-key",
        "bad-pattern",
        "not-a-meaning",
    ],
)
def test_bad_stderr_case_is_refused(tmp_path: Path, entry: str, key: str, phrase: str) -> None:
    """A stderr case names every case and nothing else; each mistake names its key."""
    exc = refused(tmp_path, replaced('4 = "NOT_FOUND"', entry))
    assert_names(exc, tmp_path, key, phrase)


def test_retry_after_run_needs_idempotent(tmp_path: Path) -> None:
    """Retrying on a result (attempts > 1 with `on`) needs idempotent = true."""
    retry = '\n[retry]\nattempts = 2\non = ["UPSTREAM_UNAVAILABLE"]\n'
    exc = refused(tmp_path, COMMAND + retry)
    assert_names(exc, tmp_path, "retry", "needs `idempotent = true`")


@pytest.mark.parametrize(
    "text",
    [
        # The command may run twice: fine for an idempotent operation.
        replaced("version = 1\n", "version = 1\nidempotent = true\n")
        + '\n[retry]\nattempts = 2\non = ["UPSTREAM_UNAVAILABLE"]\n',
        # No `on`: only failures before the channel opened (nothing ran) are retried.
        COMMAND + "\n[retry]\nattempts = 2\n",
    ],
    ids=["idempotent", "no-on"],
)
def test_allowed_retries_load(tmp_path: Path, text: str) -> None:
    """Retries load when idempotent, or when they cover only failures before the run."""
    assert load(tmp_path, text).get("item_status") is not None


# --- output extractors --------------------------------------------------------------------------


def test_extractor_key_for_another_format_is_refused(tmp_path: Path) -> None:
    """`pattern` belongs to format regex; with format json it is an error."""
    exc = refused(tmp_path, replaced('format = "json"', "format = \"json\"\npattern = '^x$'"))
    assert_names(exc, tmp_path, "output.pattern", "does not apply to format 'json'")


def test_wrap_applies_to_json_only(tmp_path: Path) -> None:
    """`wrap` names the member a json document becomes; with another format it is an error."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    text = replaced('format = "json"', 'format = "lines"\nrow = \'^x$\'\nshape = "one"\nwrap = "x"')
    assert_names(refused(tmp_path / "a", text), tmp_path / "a", "output.wrap", "does not apply to")
    bad = replaced('format = "json"', 'format = "json"\nwrap = "Links"')
    assert_names(refused(tmp_path / "b", bad), tmp_path / "b", "output.wrap", "")


def test_missing_extractor_key_is_refused(tmp_path: Path) -> None:
    """Format lines needs `row`."""
    exc = refused(tmp_path, replaced('format = "json"', 'format = "lines"\nshape = "one"'))
    assert_names(exc, tmp_path, "output.row", "required key is missing for format 'lines'")


def test_text_formats_load(tmp_path: Path) -> None:
    """The lines and regex variants the next tests break are valid as written."""
    commands_dir, schemas_dir = write(
        tmp_path,
        {
            "lines_item.toml": replaced(
                'format = "json"', LINES + '\ntypes = { state = "string" }'
            ),
            "regex_item.toml": replaced('format = "json"', REGEX),
        },
    )
    registry = load_registry(commands_dir, schemas_dir, hosts=HOSTS)
    assert sorted(registry.operations) == ["lines_item", "regex_item"]


def test_invalid_row_regex_is_refused(tmp_path: Path) -> None:
    """A row pattern that does not compile names output.row."""
    unclosed = 'format = "lines"\nshape = "one"\nrow = \'(?P<item_id>[a-z\''
    text = replaced('format = "json"', unclosed)
    exc = refused(tmp_path, text)
    assert_names(exc, tmp_path, "output.row", "not a valid regular expression")


def test_types_for_a_field_the_pattern_lacks_is_refused(tmp_path: Path) -> None:
    """`types` may only name a group of the pattern."""
    text = replaced('format = "json"', REGEX + '\ntypes = { count = "integer" }')
    exc = refused(tmp_path, text)
    assert_names(exc, tmp_path, "output.types.count", "no such field in the extractor")


KV = 'format = "kv"\nseparator = "="\nkeys = ["item_id", "state"]'


def test_kv_optional_keys_load(tmp_path: Path) -> None:
    """A kv key that may be absent is declared in `optional_keys`, and may be typed."""
    text = replaced(
        'format = "json"', KV + '\noptional_keys = ["note"]\ntypes = { note = "string" }'
    )
    op = load(tmp_path, text).get("item_status")
    assert op is not None
    assert op.parser.parse(b"state=up\nitem_id=abc\n") == {"item_id": "abc", "state": "up"}


@pytest.mark.parametrize(
    ("change", "key", "phrase"),
    [
        (
            ('format = "json"', 'format = "json"\noptional_keys = ["note"]'),
            "output.optional_keys",
            "does not apply to format 'json'",
        ),
        (
            ('format = "json"', KV + '\noptional_keys = ["state"]'),
            "output.optional_keys",
            "'state' is also in `keys`",
        ),
        (
            (
                'format = "json"',
                'format = "kv"\nseparator = "="\nkeys = ["item_id"]\noptional_keys = ["state"]',
            ),
            "output.optional_keys",
            "'state' may be absent but item.v1.json requires it",
        ),
    ],
    ids=["other-format", "also-required", "schema-requires-it"],
)
def test_bad_optional_keys_are_refused(
    tmp_path: Path, change: tuple[str, str], key: str, phrase: str
) -> None:
    """An optional key belongs to kv, is not also a key, and is not required by the schema."""
    exc = refused(tmp_path, replaced(*change))
    assert_names(exc, tmp_path, key, phrase)


# --- fields, checks, host -----------------------------------------------------------------------


def test_agent_field_not_in_schema_is_refused(tmp_path: Path) -> None:
    """The agent may only be shown properties the schema defines."""
    exc = refused(tmp_path, replaced('["item_id", "state"]', '["item_id", "secret"]'))
    assert_names(exc, tmp_path, "agent.fields", "'secret' is not a property of item.v1.json")


def test_equal_check_naming_unknown_param_is_refused(tmp_path: Path) -> None:
    """checks.equal must compare a result field with a declared parameter."""
    exc = refused(tmp_path, replaced('{ item_id = "item_id" }', '{ item_id = "project" }'))
    assert_names(exc, tmp_path, "checks.equal.item_id", "'project' is not a parameter")


def test_unknown_host_is_refused(tmp_path: Path) -> None:
    """The host alias must be a [hosts.<alias>] of the configuration."""
    exc = refused(tmp_path, replaced('host = "ci"', 'host = "prod"'))
    assert_names(exc, tmp_path, "host", "no [hosts.prod] in the configuration")


def test_host_check_skipped_without_hosts(tmp_path: Path) -> None:
    """hosts=None (no configuration file) skips the host check."""
    registry = load(tmp_path, replaced('host = "ci"', 'host = "prod"'), hosts=None)
    assert list(registry.operations) == ["item_status"]


# --- file names and file contents ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        ("Bad-Name.toml", "must match ^[a-z][a-z0-9_]{1,62}$"),
        ("x.toml", "must match ^[a-z][a-z0-9_]{1,62}$"),
        ("sshadapter.toml", "'sshadapter' is reserved"),
    ],
)
def test_bad_tool_file_names_are_refused(tmp_path: Path, name: str, phrase: str) -> None:
    """The file stem is the tool name: it must match the name rule and not be reserved."""
    exc = refused(tmp_path, COMMAND, name=name)
    assert_names(exc, tmp_path, "", phrase, name=name)


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    """A command file must be UTF-8."""
    exc = refused(tmp_path, COMMAND.encode() + b"# caf\xe9\n")
    assert_names(exc, tmp_path, "", "not UTF-8")


def test_invalid_toml_is_refused(tmp_path: Path) -> None:
    """A file tomllib cannot parse (a key defined twice) is refused."""
    exc = refused(tmp_path, replaced("version = 1\n", "version = 1\nversion = 2\n"))
    assert_names(exc, tmp_path, "", "not valid TOML")


def test_unreadable_file_is_refused(tmp_path: Path) -> None:
    """A command file that cannot be read (a dangling symlink) is a ConfigError, not a crash."""
    commands_dir, schemas_dir = write(tmp_path, {})
    (commands_dir / "item_status.toml").symlink_to(tmp_path / "elsewhere.toml")
    with pytest.raises(ConfigError) as info:
        load_registry(commands_dir, schemas_dir, hosts=HOSTS)
    assert_names(info.value, tmp_path, "", "cannot read")


@pytest.mark.parametrize("bad", ["a_broken.toml", "z_broken.toml"])
def test_one_bad_file_fails_the_whole_directory(tmp_path: Path, bad: str) -> None:
    """A directory loads whole or not at all, whichever order the files sort in."""
    commands_dir, schemas_dir = write(
        tmp_path, {"item_status.toml": COMMAND, bad: replaced("version = 1", "version = 0")}
    )
    with pytest.raises(ConfigError) as info:
        load_registry(commands_dir, schemas_dir, hosts=HOSTS)
    assert_names(info.value, tmp_path, "version", "greater than or equal to 1", name=bad)


# --- argv templates and quoting -----------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Operation:
    registry = load(tmp_path_factory.mktemp("template"), TEMPLATE, name="echo_args.toml")
    op = registry.get("echo_args")
    assert op is not None
    return op


def args(text: Any = "hello", **overrides: Any) -> dict[str, Any]:
    return {"project": "bluebird", "text": text, "count": 3, "flag": False, **overrides}


def filled(a: dict[str, Any]) -> list[str]:
    """The argv the template must produce for ``a``, written out by hand."""
    flag = "true" if a["flag"] else "false"
    return [
        "echo",
        f"--project={a['project']}",
        "{literal}",
        a["text"],
        f"--count={a['count']}",
        flag,
    ]


def test_placeholder_inside_element_is_filled_and_quoted_once(template: Operation) -> None:
    """`--project={project}` is filled in place and the whole element is one shell word."""
    command = template.command(args(text="two words", project="blue-bird"))
    assert command.split(" ")[1] == "--project=blue-bird"
    assert shlex.quote("two words") in command
    assert shlex.split(command)[1] == "--project=blue-bird"


def test_doubled_braces_are_literal(template: Operation) -> None:
    """`{{literal}}` is the text {literal}, not a placeholder."""
    assert shlex.split(template.command(args()))[2] == "{literal}"


@pytest.mark.parametrize("element", ["st{atus", "st}atus", "{}", "{Item}", "{item_id"])
def test_stray_brace_is_refused(tmp_path: Path, element: str) -> None:
    """A brace that is neither doubled nor a {name} placeholder is an error."""
    exc = refused(tmp_path, replaced('"status"', json.dumps(element)))
    assert_names(exc, tmp_path, "argv[1]", "stray brace")


# Shell syntax an agent (or a thief, tests/dispatch/test_dispatch_sshd.py) may try in an argument.
HOSTILE_ARGUMENTS = [
    "$(rm -rf /)",
    "`id`",
    "a; rm -rf /",
    "line\nnext",
    "it's",
    'say "hi"',
    "",
    "-n",
    "a\\b",
    "*",
    "~root",
    "$HOME",
    "x && y || z",
    "> /etc/passwd",
    "\t\r",
    "é ü",
]


@pytest.mark.parametrize("hostile", HOSTILE_ARGUMENTS)
def test_hostile_argument_is_one_inert_word(template: Operation, hostile: str) -> None:
    """Shell syntax in an argument comes back as exactly that argument after shlex.split."""
    a = args(text=hostile)
    template.check_args(a)
    assert shlex.split(template.command(a)) == filled(a)


@given(
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=200)
)
def test_any_text_round_trips_through_the_shell_quoting(template: Operation, text: str) -> None:
    """For any text the permissive pattern admits but NUL, shlex.split gives back the argv."""
    a = args(text=text)
    template.check_args(a)
    assert shlex.split(template.command(a)) == filled(a)


@given(st.text(max_size=20), st.text(max_size=20))
def test_a_nul_byte_is_refused_whatever_the_pattern(template: Operation, a: str, b: str) -> None:
    """NUL passes the permissive pattern but never reaches a command: unsendable_argument."""
    call = args(text=f"{a}\x00{b}")
    template.check_args(call)
    with pytest.raises(RequestError) as refused:
        template.command(call)
    assert refused.value.reason == "unsendable_argument"
    assert "text" in refused.value.detail


def test_a_command_over_the_limit_is_refused(template: Operation) -> None:
    """An argument that makes the command longer than MAX_COMMAND_BYTES: command_too_long."""
    call = args(text="é" * (MAX_COMMAND_BYTES // 2))
    with pytest.raises(RequestError) as refused:
        template.command(call)
    assert refused.value.reason == "command_too_long"


def test_integral_float_is_written_as_an_integer(template: Operation) -> None:
    """5.0 is the JSON Schema integer 5: it passes the schema and is written `5`, not `5.0`."""
    a = args(count=5.0, flag=True)
    template.check_args(a)
    assert shlex.split(template.command(a))[4:] == ["--count=5", "true"]


# --- the published parameter schema and check_args ----------------------------------------------


def test_params_schema_is_closed(template: Operation) -> None:
    """The published args schema has every param, requires all of them and nothing else."""
    schema = template.params_schema
    assert schema["$schema"] == DRAFT_2020_12
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["count", "flag", "project", "text"]
    assert set(schema["properties"]) == {"count", "flag", "project", "text"}
    assert schema["properties"]["count"] == {"type": "integer", "minimum": 0, "maximum": 100}


def test_operation_without_params_takes_an_empty_object(tmp_path: Path) -> None:
    """No [params]: the only valid args are {}."""
    text = replaced('"{item_id}"]', "]")
    text = replaced("[params.item_id]\ntype = \"string\"\npattern = '^[a-z]{1,8}$'\n\n", "", text)
    text = replaced('equal = { item_id = "item_id" }', "", text)
    op = load(tmp_path, text).get("item_status")
    assert op is not None
    op.check_args({})
    with pytest.raises(RequestError):
        op.check_args({"item_id": "abc"})


@pytest.mark.parametrize(
    "bad",
    [
        args(extra="x"),
        {k: v for k, v in args().items() if k != "flag"},
        args(count="3"),
        args(count=True),
        args(count=3.5),
        args(count=101),
        args(flag=1),
        args(flag="true"),
        args(text=7),
        args(project="Blue Bird"),
        args(project="x" * 21),
        args(text="x" * 201),
        [],
        "project=bluebird",
        None,
    ],
    ids=[
        "extra",
        "missing",
        "int-as-string",
        "bool-as-int",
        "fraction",
        "over-maximum",
        "int-as-bool",
        "string-as-bool",
        "int-as-string-param",
        "pattern",
        "too-long",
        "free-text-too-long",
        "array",
        "string",
        "null",
    ],
)
def test_check_args_rejects(template: Operation, bad: Any) -> None:
    """Extra, missing, mistyped or pattern-breaking arguments are a RequestError."""
    with pytest.raises(RequestError) as info:
        template.check_args(bad)
    assert info.value.reason == "bad_arguments"


def test_unknown_parameter_keyword_is_refused(tmp_path: Path) -> None:
    """A typo such as `maxLenght` would silently drop a bound: it is an error naming the key."""
    typo = "pattern = '^[a-z]{1,8}$'\nmaxLenght = 8"
    exc = refused(tmp_path, replaced("pattern = '^[a-z]{1,8}$'", typo))
    assert_names(exc, tmp_path, "params.item_id.maxLenght", "unknown parameter keyword")


# --- strict types: TOML has real ones (issue 10) ---------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('host = "ci"', 'host = "ci"\nidempotent = "yes"', "idempotent"),
        ("version = 1", 'version = "1"', "version"),
        ('host = "ci"', 'host = "ci"\ntimeout_seconds = "5"', "timeout_seconds"),
        (
            'schema = "item.v1.json"',
            'schema = "item.v1.json"\nmax_bytes = 256.0',
            "output.max_bytes",
        ),
        ('fields = ["item_id", "state"]', 'fields = "item_id"', "agent.fields"),
    ],
)
def test_a_value_of_the_wrong_type_is_a_load_error(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    """No coercion: "yes" is not true, "1" not 1, 256.0 not 256; the file and key are named."""
    exc = refused(tmp_path, replaced(old, new))
    assert_names(exc, tmp_path, key, "Input should be a valid")


def test_an_extractor_field_the_schema_does_not_declare_is_a_load_error(tmp_path: Path) -> None:
    """A named group the schema has no property for would fail every output: refused at load."""
    text = replaced(
        'format = "json"',
        "format = \"regex\"\npattern = '^(?P<item_id>[a-z]+) (?P<status>up|down)$'",
    )
    exc = refused(tmp_path, text)
    assert_names(exc, tmp_path, "output.pattern", "field 'status' is not a property")


def test_a_kv_key_the_schema_does_not_declare_is_a_load_error(tmp_path: Path) -> None:
    """The same for a kv key: the loader names output.keys."""
    text = replaced(
        'format = "json"', 'format = "kv"\nseparator = "="\nkeys = ["item_id", "State"]'
    )
    exc = refused(tmp_path, text)
    assert_names(exc, tmp_path, "output.keys", "field 'State' is not a property")


def test_shape_one_with_more_than_one_row_is_a_load_error(tmp_path: Path) -> None:
    """shape = "one" reads exactly one row: a max_rows above 1 would read rows and ignore them."""
    text = replaced('format = "json"', LINES + "\nmax_rows = 3")
    exc = refused(tmp_path, text)
    assert_names(exc, tmp_path, "output.max_rows", "shape 'one' is exactly one row")


def test_retrying_bad_evidence_is_a_load_error(tmp_path: Path) -> None:
    """retry.on may name UPSTREAM_UNAVAILABLE only: INVALID_RESPONSE is never retried."""
    text = COMMAND.replace('host = "ci"', 'host = "ci"\nidempotent = true') + (
        '\n[retry]\nattempts = 2\non = ["INVALID_RESPONSE"]\n'
    )
    exc = refused(tmp_path, text)
    assert exc.key.startswith("retry.on")


def test_keyed_row_without_a_key_group_is_refused(tmp_path: Path) -> None:
    """shape = keyed names each member by the row's `key` group: a row without one is refused."""
    text = replaced(
        'format = "json"', 'format = "lines"\nshape = "keyed"\nrow = \'^(?P<state>[a-z]+)$\''
    )
    exc = refused(tmp_path, text)
    assert_names(exc, tmp_path, "output.row", "shape 'keyed' needs a group named 'key'")


# --- counting and top N -------------------------------------------------------------------------

ROWS = 'format = "lines"\nshape = "rows"\nrow = \'^(?P<item_id>[a-z]+) (?P<state>up|down)$\''


@pytest.mark.parametrize(
    ("output", "key", "phrase"),
    [
        (f'{LINES}\ncount_by = "state"', "output.count_by", 'needs shape = "rows"'),
        (f'{ROWS}\ncount_by = "colour"', "output.count_by", "'colour' is no field of `row`"),
        (
            f'{ROWS}\ncount_by = "state"\ntypes = {{ state = "integer" }}',
            "output.count_by",
            "cannot be typed",
        ),
        (f'{ROWS}\ncount_by = "state"', "output.count_by", "'total' is not a property"),
    ],
)
def test_a_count_that_cannot_work_is_refused(
    tmp_path: Path, output: str, key: str, phrase: str
) -> None:
    """count_by needs a rows table, a field of `row`, text, and a schema with total and counts."""
    exc = refused(tmp_path, replaced('format = "json"', output))
    assert_names(exc, tmp_path, key, phrase)


def test_agent_rows_needs_a_rows_array(tmp_path: Path) -> None:
    """`[agent] rows` on a tool whose schema has no `rows` array is refused at load."""
    exc = refused(
        tmp_path, replaced('fields = ["item_id", "state"]', 'fields = ["item_id"]\nrows = 5')
    )
    assert_names(exc, tmp_path, "agent.rows", "needs `rows` in agent.fields")
