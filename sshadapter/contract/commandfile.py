"""The command-file format: what ``commands/<tool>.toml`` may say, and nothing else.

Reference: docs/command-files.md, which lists every key of every table with its
type, default and meaning (tests/test_docs.py derives the key list from these
models, so the two cannot drift apart). Unknown keys are errors; every error
names the file, the key and the reason.

This module knows the TOML format only. What the keys mean together (argv
placeholders against parameters, fields against the schema) is checked by
``registry`` when the file becomes an ``Operation``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from sshadapter.bounded_read import read_bounded
from sshadapter.contract.codes import TARGET_ARGUMENT
from sshadapter.contract.extract import FieldType
from sshadapter.contract.semantic import Checks
from sshadapter.errors import ConfigError
from sshadapter.sections import Allow
from sshadapter.strict_json import DEFAULT_MAX_DEPTH, MAX_DEPTH_LIMIT

PARAM_NAME: Final = r"^[a-z][a-z0-9_]{0,62}$"
# A Debian account name (adduser's default NAME_REGEX), as [hosts] `user` says it.
ACCOUNT_NAME: Final = r"^[a-z_][a-z0-9_-]{0,31}$"

DEFAULT_TIMEOUT_SECONDS: Final = 10.0  # a status query that takes longer is not a status query
MAX_TIMEOUT_SECONDS: Final = 600.0
DEFAULT_MAX_OUTPUT_BYTES: Final = 64 * 1024  # a fact for an agent is small; raise per tool
MAX_OUTPUT_BYTES: Final = 16 * 1024 * 1024  # hard ceiling: the daemon buffers the output
DEFAULT_MAX_STDERR_BYTES: Final = 64 * 1024  # stderr is audited, never shown: keep it bounded
MAX_COMMAND_FILE_BYTES: Final = 256 * 1024  # one operation, written by hand: larger is a mistake
MAX_RETRY_ATTEMPTS: Final = 5
EXIT_MEANINGS: Final = ("success", "NOT_FOUND", "UPSTREAM_UNAVAILABLE", "INVALID_RESPONSE")
FAILURE_MEANINGS: Final = EXIT_MEANINGS[1:]  # what stderr may choose between (never success)
MAX_STDERR_PATTERN_CHARS: Final = 1024  # a pattern names one known message, not a grammar
MAX_TARGETS: Final = 256  # names in one command file's `targets`: groups exist for more
# Fan-out bounds, each with its reason (docs/command-files.md "targets and fanout").
DEFAULT_FANOUT_MAX_HOSTS: Final = 1000  # one daemon's fleet; a larger call is a mistake
MAX_FANOUT_HOSTS: Final = 10_000
# An operation's hosts in flight: by default no bound of its own (the daemon's start rate
# bounds every fan-out, sshadapter/pacing.py); an operator lowers it for a rolling change.
MAX_FANOUT_CONCURRENCY: Final = 1024
DEFAULT_FANOUT_CONCURRENCY: Final = MAX_FANOUT_CONCURRENCY
DEFAULT_FANOUT_DEADLINE_SECONDS: Final = 60.0  # an agent waits a minute for a fleet, not more
# Entries in one answer: ~160 bytes each, so 100 is ~16 KB, well under the 25,000 tokens
# an agent host such as Claude Code accepts from one tool result by default.
DEFAULT_FANOUT_MAX_RESULTS: Final = 100
MAX_FANOUT_RESULTS: Final = 1000
# How long a call waits for a person's approval (docs/command-files.md "approval"). Five
# minutes for someone to read the command; at most ten, the wait tufantunc/ssh-mcp
# settled on after 60 s expired under people reading the prompt (its issue #91), and
# below the CLI client's CLIENT_TIMEOUT_SECONDS. At least a second: a person is slower.
DEFAULT_APPROVAL_TIMEOUT_SECONDS: Final = 300.0
MIN_APPROVAL_TIMEOUT_SECONDS: Final = 1.0
MAX_APPROVAL_TIMEOUT_SECONDS: Final = 600.0


class _Table(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=False)


class _KeyedError(ValueError):
    """A cross-key rule broken inside a table: pydantic locates it at the table, this at the key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


class StderrCase(_Table):
    """An exit status whose meaning depends on stderr: ``then`` if it passes the test, else
    ``otherwise``. Exactly one test: ``if_stderr = "empty"`` or ``if_stderr_matches``."""

    if_stderr: Literal["empty"] | None = None
    if_stderr_matches: (
        Annotated[str, Field(min_length=1, max_length=MAX_STDERR_PATTERN_CHARS)] | None
    ) = None
    then: str
    otherwise: str

    @model_validator(mode="after")
    def _one_test_two_failures(self) -> StderrCase:
        if (self.if_stderr is None) == (self.if_stderr_matches is None):
            raise _KeyedError("if_stderr", "give exactly one of if_stderr, if_stderr_matches")
        for key in ("then", "otherwise"):
            meaning = getattr(self, key)
            if meaning == "success":
                raise _KeyedError(
                    key, "stderr only chooses between failures: success is the exit status's"
                )
            if meaning not in FAILURE_MEANINGS:
                raise _KeyedError(key, f"{meaning!r} is not one of {', '.join(FAILURE_MEANINGS)}")
        if self.then == self.otherwise:
            raise _KeyedError("otherwise", "same as `then`: write the plain meaning instead")
        return self


# An exit_codes entry is a meaning or a table of stderr cases. Pydantic puts the tag of
# a discriminated union's member into an error's location; read_command_file drops it,
# since the operator wrote no such key.
_PLAIN: Final = "<meaning>"
_BY_STDERR: Final = "<by stderr>"


def _exit_entry_kind(value: Any) -> str:
    return _BY_STDERR if isinstance(value, dict | StderrCase) else _PLAIN


ExitEntry = Annotated[
    Annotated[str, Tag(_PLAIN)] | Annotated[StderrCase, Tag(_BY_STDERR)],
    Discriminator(_exit_entry_kind),
]


class OutputSection(_Table):
    format: Literal["json", "jsonl", "regex", "lines", "kv"]
    schema_file: str = Field(alias="schema", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\.json$")
    max_bytes: Annotated[int, Field(ge=1, le=MAX_OUTPUT_BYTES)] = DEFAULT_MAX_OUTPUT_BYTES
    max_stderr_bytes: Annotated[int, Field(ge=0, le=MAX_OUTPUT_BYTES)] = DEFAULT_MAX_STDERR_BYTES
    max_depth: Annotated[int, Field(ge=1, le=MAX_DEPTH_LIMIT)] = DEFAULT_MAX_DEPTH
    # json: the document becomes the one member of an object, so a top-level array
    # (ip -j) has a field to show the agent ([agent] fields names top-level members).
    wrap: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")] | None = None
    stderr: Literal["ignore", "reject"] = "ignore"
    exit_codes: dict[str, ExitEntry] = {"0": "success"}
    # text extractors
    pattern: str | None = None
    header: tuple[str, ...] = ()
    row: str | None = None
    shape: Literal["one", "rows", "keyed"] | None = None
    max_rows: Annotated[int, Field(ge=1, le=100_000)] | None = None
    types: dict[str, FieldType] = {}
    separator: Annotated[str, Field(min_length=1, max_length=8)] | None = None
    keys: tuple[str, ...] | None = None
    optional_keys: tuple[str, ...] = ()
    count_by: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")] | None = None

    @model_validator(mode="after")
    def _keys_fit_format(self) -> OutputSection:
        allowed = {
            "json": {"max_depth", "wrap"},
            "jsonl": {"max_depth", "max_rows"},
            "regex": {"pattern", "types"},
            "lines": {"header", "row", "shape", "max_rows", "types", "count_by"},
            "kv": {"separator", "keys", "optional_keys", "types"},
        }[self.format]
        extractor_keys = {
            "pattern",
            "header",
            "row",
            "shape",
            "max_rows",
            "types",
            "separator",
            "keys",
            "optional_keys",
            "max_depth",
            "count_by",
            "wrap",
        }
        for key in sorted((extractor_keys & self.model_fields_set) - allowed):
            raise _KeyedError(key, f"does not apply to format {self.format!r}")
        required = {"regex": ("pattern",), "lines": ("row", "shape"), "kv": ("separator", "keys")}
        for key in required.get(self.format, ()):
            if getattr(self, key) is None:
                raise _KeyedError(key, f"required key is missing for format {self.format!r}")
        if self.shape == "one" and self.max_rows not in (None, 1):
            raise _KeyedError(
                "max_rows", "shape 'one' is exactly one row: more rows would be read and ignored"
            )
        if self.count_by is not None and self.shape != "rows":
            raise _KeyedError("count_by", 'counts rows: needs shape = "rows"')
        if self.count_by is not None and self.types.get(self.count_by, "string") != "string":
            raise _KeyedError("count_by", "a count's keys are text: the field cannot be typed")
        for status, meaning in self.exit_codes.items():
            if not re.fullmatch(r"0|[1-9][0-9]{0,2}", status) or int(status) > 255:
                raise _KeyedError(f"exit_codes.{status}", "not an exit status 0-255")
            if isinstance(meaning, str) and meaning not in EXIT_MEANINGS:
                raise _KeyedError(
                    f"exit_codes.{status}", f"{meaning!r} is not one of {', '.join(EXIT_MEANINGS)}"
                )
        if "success" not in self.exit_codes.values():
            raise _KeyedError("exit_codes", "no status means success")
        for key in self.optional_keys:
            if key in (self.keys or ()):
                raise _KeyedError("optional_keys", f"{key!r} is also in `keys`")
        return self

    @property
    def meanings(self) -> frozenset[str]:
        """Every meaning some exit status may have, stderr cases included."""
        found: set[str] = set()
        for entry in self.exit_codes.values():
            found |= {entry} if isinstance(entry, str) else {entry.then, entry.otherwise}
        return frozenset(found)


# Rows an agent may be shown of a table (`[agent] rows`): a top N is a few lines to read,
# and the fan-out answer repeats them for every host.
MAX_AGENT_ROWS: Final = 100


class AgentSection(_Table):
    fields: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], ...] = Field(
        min_length=1
    )
    rows: Annotated[int, Field(ge=1, le=MAX_AGENT_ROWS)] | None = None
    """The agent sees the first N items of the field ``rows`` (a top N after the command's own
    sort); the schema and the checks still judge every row."""


class RetrySection(_Table):
    attempts: Annotated[int, Field(ge=1, le=MAX_RETRY_ATTEMPTS)] = 1
    budget_seconds: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] = 30.0
    # Only a transport failure may be retried: bad evidence (INVALID_RESPONSE) is never
    # retryable, so a table that lists it would promise what no call does.
    on: tuple[Literal["UPSTREAM_UNAVAILABLE"], ...] = ()


class FanoutSection(_Table):
    """How a call on a group runs: docs/command-files.md "targets and fanout"."""

    enabled: bool | None = None
    """A group may be named; None: only for a `read_only` operation."""
    max_hosts: Annotated[int, Field(ge=1, le=MAX_FANOUT_HOSTS)] = DEFAULT_FANOUT_MAX_HOSTS
    concurrency: Annotated[int, Field(ge=1, le=MAX_FANOUT_CONCURRENCY)] = DEFAULT_FANOUT_CONCURRENCY
    deadline_seconds: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] = (
        DEFAULT_FANOUT_DEADLINE_SECONDS
    )
    max_results: Annotated[int, Field(ge=1, le=MAX_FANOUT_RESULTS)] = DEFAULT_FANOUT_MAX_RESULTS
    single_host: bool = True
    """The agent may also name one member host of a listed group."""


class ApprovalSection(_Table):
    """A person approves each call before it runs: docs/command-files.md "approval"."""

    required: bool = False
    timeout_seconds: Annotated[
        float, Field(ge=MIN_APPROVAL_TIMEOUT_SECONDS, le=MAX_APPROVAL_TIMEOUT_SECONDS)
    ] = DEFAULT_APPROVAL_TIMEOUT_SECONDS


TargetName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]


class CommandFile(_Table):
    description: Annotated[str, Field(min_length=1, max_length=500)]
    version: Annotated[int, Field(ge=1)]
    host: TargetName | None = None
    targets: tuple[TargetName, ...] = Field(default=(), max_length=MAX_TARGETS)
    fanout: FanoutSection = FanoutSection()
    argv: tuple[Annotated[str, Field(max_length=4096)], ...] = Field(min_length=1, max_length=256)
    timeout_seconds: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] = DEFAULT_TIMEOUT_SECONDS
    idempotent: bool = False
    read_only: bool = False
    """The command changes nothing on the host: published as MCP ``readOnlyHint``.

    An operator's statement, never inferred from argv. Hosts let read-only tools
    run without a confirmation (Claude Code's plan mode blocks the others).
    """
    run_as: Annotated[str, Field(pattern=ACCOUNT_NAME)] | None = None
    """The account the command runs as, through ``sudo -n -u ACCOUNT --`` on a dispatch host:
    docs/dispatcher.md "Root operations" (``sshadapter sudoers`` writes the host's rule)."""
    allow: Allow | None = None
    params: dict[Annotated[str, Field(pattern=PARAM_NAME)], dict[str, Any]] = {}
    output: OutputSection
    checks: Checks = Checks()
    agent: AgentSection
    retry: RetrySection = RetrySection()
    approval: ApprovalSection = ApprovalSection()

    @property
    def multi(self) -> bool:
        """It runs on targets the agent names (``targets``), not on one fixed ``host``."""
        return bool(self.targets)

    @property
    def fans_out(self) -> bool:
        """A group may be named: `[fanout] enabled`, by default only when read-only."""
        return self.read_only if self.fanout.enabled is None else self.fanout.enabled

    @model_validator(mode="after")
    def _one_place_to_run(self) -> CommandFile:
        if (self.host is None) == (not self.targets):
            raise _KeyedError("targets", "give exactly one of `host` or `targets`")
        if len(set(self.targets)) != len(self.targets):
            raise _KeyedError("targets", "a target is listed twice")
        if TARGET_ARGUMENT in self.params:
            raise _KeyedError(
                f"params.{TARGET_ARGUMENT}",
                f"{TARGET_ARGUMENT!r} is reserved: it is the argument that names the target",
            )
        if self.host is not None and "fanout" in self.model_fields_set:
            raise _KeyedError("fanout", "applies to an operation with `targets`, not `host`")
        return self

    @model_validator(mode="after")
    def _retries_need_idempotence(self) -> CommandFile:
        if self.retry.attempts > 1 and self.retry.on and not self.idempotent:
            raise _KeyedError(
                "retry", "retrying after the command may have run needs `idempotent = true`"
            )
        return self


def read_command_bytes(path: Path) -> bytes:
    """A command file's bytes (a regular file, within its bound), or ConfigError."""
    return read_bounded(path, MAX_COMMAND_FILE_BYTES)


def parse_command_file(
    path: Path, raw: bytes, overrides: Mapping[str, Any] | None = None
) -> CommandFile:
    """The parsed contents of the command file ``path`` whose bytes are ``raw``, or ConfigError.

    ``overrides``: what the configuration replaces in a catalog file (sshadapter/catalog/):
    top-level keys, and under ``params`` keywords of a declared parameter (its ``enum``).
    """
    file = str(path)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
        if overrides:
            data = _overridden(file, data, overrides)
        # Strict, through JSON: TOML has real types, so "yes" is no boolean, "5" no
        # number and 256.0 no integer; JSON mode still reads arrays as tuples.
        spec = CommandFile.model_validate_json(orjson.dumps(data), strict=True)
    except UnicodeDecodeError as exc:
        raise ConfigError(file, "", "not UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"] if p not in (_PLAIN, _BY_STDERR)]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, _KeyedError):
            loc.append(cause.key)
        key = ".".join(loc)
        reason = {"extra_forbidden": "unknown key", "missing": "required key is missing"}.get(
            first["type"], str(first["msg"]).removeprefix("Value error, ")
        )
        raise ConfigError(file, key, reason) from exc
    return spec


def _overridden(file: str, data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with the top-level keys of ``overrides`` replaced and its ``params`` merged
    into the parameters the file declares (one it does not declare is the file's error)."""
    merged = {**data, **{k: v for k, v in overrides.items() if k != "params"}}
    declared = data.get("params", {})
    params = dict(declared) if isinstance(declared, dict) else {}
    for name, keywords in overrides.get("params", {}).items():
        if not isinstance(params.get(name), dict):
            reason = "required: the configuration lists its values"
            raise ConfigError(file, f"params.{name}", reason)
        params[name] = {**params[name], **keywords}
    if params:
        merged["params"] = params
    return merged
