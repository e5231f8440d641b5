#!/usr/bin/python3 -IS
"""sshadapter-dispatch: the forced command on a host, so the adapter's key runs only its operations.

This file runs on the remote host, not in the daemon: Python 3.9 or later, the
standard library only. ``sshadapter dispatcher --write PATH`` writes it out as
the ``SOURCE`` of sshadapter/dispatch/launcher.py, one file, which runs it from
code ``PATH --compile`` compiled ahead when that is trusted and current, else
from this source (write_compiled below writes it). The daemon never imports it.
Reference: docs/dispatcher.md.

sshd runs it for every session of the adapter's key, through the key's
``authorized_keys`` line (one line, cut here)::

    restrict,from="ADDR",command="/usr/local/libexec/sshadapter-dispatch
    /etc/sshadapter-dispatch/policy.json" ssh-ed25519 ...

with the client's command in ``SSH_ORIGINAL_COMMAND``. The policy (written by
``sshadapter policy HOST_ALIAS``) lists the host's operations: an argv template
and a schema per parameter. The command must be exactly what the daemon sends
(every argv element ``shlex.quote``-d once, joined by single spaces), match one
template and no other, and give every placeholder a value its schema accepts.
Then the argv is ``execv``-ed directly, without a shell, with a fixed PATH, the
environment reduced to ``ENVIRONMENT``, stdin on /dev/null and the signal
dispositions Python changed put back.

Anything else runs nothing: it exits ``REFUSED_STATUS`` with one line on stderr,
``sshadapter-dispatch: refused (REASON) sha256:HEX``, and logs the reason and
the command's sha256 (never the command) to syslog. ``DIGEST_COMMAND`` is
answered here, with the policy's digests, for the daemon's drift check.
"""

# Every call starts this process anew, so its imports are the cost of a call (a benchmark,
# tests/bench/bench_dispatch.py). An allowed call imports only builtin or C modules: _json's
# scanner and encoder instead of json (json.decoder imports re, enum, functools), posix and
# _stat instead of os and stat, _signal instead of signal (its enums), the builtin sha256
# instead of hashlib (OpenSSL's start-up), no typing and no __future__ (annotations are
# strings); re only for a parameter with a pattern or a date-time (docs/dispatcher.md
# "Start-up").
import _socket
import _stat
import posix  # os's functions themselves; importing os costs ~1.6 ms under -I -S
import pwd
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:  # what the checker reads for the C modules below: the same functions
    import signal as _signal
    from collections.abc import Callable, Mapping
    from hashlib import sha256 as _SHA256
    from types import ModuleType
    from typing import Any

    _make_scanner: Any
    _make_encoder: Any
    _quote_json: Any
else:
    import _signal

    try:  # the builtin sha256: _sha256 up to 3.11, _sha2 since 3.12; else hashlib's
        from _sha256 import sha256 as _SHA256
    except ImportError:  # pragma: no cover - depends on the host's Python
        try:
            from _sha2 import sha256 as _SHA256
        except ImportError:
            from hashlib import sha256 as _SHA256
    try:  # the C halves of json (every CPython builds them); json itself is the fallback
        from _json import encode_basestring_ascii as _quote_json
        from _json import make_encoder as _make_encoder
        from _json import make_scanner as _make_scanner
    except ImportError:  # pragma: no cover - depends on the host's Python
        _make_scanner = _make_encoder = _quote_json = None


def sha256_hex(data: bytes) -> str:
    return str(_SHA256(data).hexdigest())


VERSION = 1
POLICY_FORMAT = "sshadapter-dispatch-policy/1"

# Exit statuses. 77 is sysexits.h EX_NOPERM ("you did not have sufficient permission");
# 126 and 127 are what a shell says when a program cannot run or is not found.
REFUSED_STATUS = 77
CANNOT_EXECUTE_STATUS = 126
NOT_FOUND_STATUS = 127
REFUSAL_PREFIX = "sshadapter-dispatch: refused"

# The daemon's drift check. A command that starts with "#" is never one the daemon's
# quoting writes (shlex.quote quotes "#"), so no operation can collide with it; a host
# without the dispatcher reads it as a shell comment and answers nothing.
DIGEST_COMMAND = "#sshadapter-policy-digest"

# Bounds, each with its reason.
# Linux's MAX_ARG_STRLEN: sshd cannot hand a longer SSH_ORIGINAL_COMMAND to the shell at
# all, and it is at least the daemon's own argv.MAX_COMMAND_BYTES (64 KiB).
MAX_COMMAND_BYTES = 128 * 1024
MAX_POLICY_BYTES = 4 * 1024 * 1024  # a policy is a few KB per operation
# Whoever can write the policy decides what this account runs, and its digest is no signature:
# like sshd's StrictModes, the file and every directory above it must be owned by root and
# writable by nobody else (no group or other write bit).
TRUSTED_OWNER = 0
UNSAFE_MODE_BITS = 0o022
# Reading a directory needs only search permission (O_PATH); O_NONBLOCK: a FIFO put in the
# policy's place does not hang the call before it is found not to be a regular file.
_DIRECTORY_FLAGS = (
    getattr(posix, "O_PATH", posix.O_RDONLY)
    | posix.O_DIRECTORY
    | posix.O_NOFOLLOW
    | posix.O_CLOEXEC
)
_FILE_FLAGS = (
    posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK | posix.O_NOCTTY | posix.O_CLOEXEC
)
# CPU for reading the policy and judging one command: a real call needs ~1 ms; a thief's
# input that makes a pattern backtrack is cut here and refused (`too_costly`).
MAX_DECISION_CPU_SECONDS = 0.5
MAX_INTEGER_DIGITS = 20  # the daemon's integers are 64-bit: at most 20 digits

FIXED_PATH = "/usr/local/bin:/usr/bin:/bin"
# The program's whole environment: PATH above, and these from the account database (not
# from the session, where AcceptEnv may let a client set variables).
ENVIRONMENT = ("PATH", "HOME", "USER", "LOGNAME")
DEFAULT_LOG_SOCKET = "/dev/log"
# A datagram to a syslog whose queue is full blocks; a stuck syslog must not hang the call.
LOG_SEND_TIMEOUT_SECONDS = 1.0
LOG_FACILITY_AUTHPRIV = 10  # syslog.h LOG_AUTHPRIV: who may do what on this host
LOG_WARNING, LOG_INFO = 4, 6
TAG = "sshadapter-dispatch"

# Why a command was refused: the stderr line and the log say one of these.
REASONS = (
    "no_command",  # an interactive login (ssh host), or an empty command
    "terminal",  # a PTY was allocated: the daemon never asks for one
    "too_long",  # over MAX_COMMAND_BYTES
    "not_utf8",
    "not_canonical",  # not exactly how the daemon quotes an argv
    "no_match",  # no operation has this shape
    "bad_argument",  # an operation has this shape, but an argument fails its schema
    "ambiguous",  # more than one operation accepts it
    "too_costly",  # judging it took over MAX_DECISION_CPU_SECONDS
    "policy_unreadable",  # the policy file is missing, unreadable, not a regular file or too large
    "policy_unsafe",  # someone but root could change the policy: owner, mode, or a symlink
    "policy_invalid",  # the policy is not a policy this dispatcher understands, or edited
    "bad_invocation",  # the forced command itself is wrong
)

# shlex.quote leaves a word of these unquoted (its [\w@%+=:,./-], ASCII).
_SAFE_BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")
# Patterns as text, compiled on first use only (re's cache): a call that needs none pays none
# (not even the import of re).
_DIGITS = frozenset("0123456789")
_ADDRESS = frozenset("0123456789ABCDEFabcdef:.")  # what an IPv4 or IPv6 address is written with
_JSON_SPACE = " \t\n\r"  # RFC 8259 whitespace, what json.loads skips around the value
_DATE_TIME = (
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_PARAM_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz")
_PARAM_REST = _PARAM_FIRST | frozenset("0123456789_")
_SCHEMA_KEYWORDS = {
    "string": {"type", "pattern", "enum", "const", "minLength", "maxLength", "format"},
    "integer": {
        "type",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    },
    "boolean": {"type", "enum", "const"},
}
_FORMATS = ("date-time",)


class Refused(Exception):
    """Nothing runs: ``reason`` is one of REASONS."""

    def __init__(self, reason: str, operation: str = "", path: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.operation = operation
        self.path = path  # for the host's log only: the file or directory at fault


class _TooCostly(Exception):
    """The CPU budget ran out (raised from the SIGPROF handler)."""


# The policy ----------------------------------------------------------------------------


def canonical_json(value: "Any") -> bytes:
    """The bytes a digest is taken over; the daemon's policy generator uses the same.

    Exactly ``json.dumps(value, sort_keys=True, separators=(",", ":"),
    ensure_ascii=True)``, through the C encoder json.dumps itself uses, without
    importing json (tests/dispatch/test_dispatch.py holds the two equal)."""
    if _make_encoder is None:  # pragma: no cover - a Python without _json
        text: str = _json_module().dumps(value, sort_keys=True, separators=(",", ":"))
        return text.encode()
    encode = _make_encoder(
        {}, _not_json, _quote_json, None, ":", ",", True, False, False
    )  # markers, default, str encoder, indent, separators, sort_keys, skipkeys, allow_nan
    return "".join(encode(value, 0)).encode()


def _not_json(value: "Any") -> "Any":
    raise TypeError(f"not JSON: {type(value).__name__}")


def _no_constant(name: str) -> "Any":
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: the generator never writes them


class _Scanning:
    """What _json.make_scanner reads from json.JSONDecoder: strict, duplicates refused."""

    strict = True
    object_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constant)
    memo: "dict[str, str]" = {}  # noqa: RUF012 - read by the pure-Python scanner only

    def __init__(self) -> None:
        self.object_pairs_hook = _no_duplicates


def loads(text: str) -> "Any":
    """json.loads(text) with duplicate keys, NaN and Infinity refused (ValueError or
    Refused), through the C scanner json.loads itself uses, without importing json."""
    if _make_scanner is None:  # pragma: no cover - a Python without _json
        return _json_module().loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant
        )
    start, end = 0, len(text)
    while start < end and text[start] in _JSON_SPACE:
        start += 1
    while end > start and text[end - 1] in _JSON_SPACE:
        end -= 1
    try:
        value, stop = _make_scanner(_Scanning())(text, start)
    except StopIteration:
        raise ValueError("no JSON value") from None
    if stop != end:
        raise ValueError("extra data after the JSON value")
    return value


def _json_module() -> "ModuleType":
    import json  # only off the path of an allowed call, or without _json

    return json


def digest(value: "Any") -> str:
    return "sha256:" + sha256_hex(canonical_json(value))


def _no_duplicates(pairs: "list[tuple[str, Any]]") -> "dict[str, Any]":
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise Refused("policy_invalid")
        result[key] = value
    return result


def read_policy(path: str, owner: int = TRUSTED_OWNER) -> "dict[str, Any]":
    """The policy at ``path``, checked whole: any doubt refuses every command."""
    raw = read_policy_bytes(path, owner)
    try:
        policy = loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Refused("policy_invalid") from None
    check_policy(policy)
    return policy  # type: ignore[no-any-return]


def read_policy_bytes(path: str, owner: int = TRUSTED_OWNER) -> bytes:
    """The file's bytes, if only root (or ``owner``) could have written them.

    Walked from ``/`` one component at a time, each opened relative to the
    last without following a symbolic link, and checked on the open
    descriptor (no name is looked up twice): every directory and the file
    owned by root or ``owner`` and without a group or other write bit, the
    file a regular one of at most MAX_POLICY_BYTES, read through that
    descriptor.
    """
    names = path.split("/")[1:] if path.startswith("/") else []
    if not names or any(name in ("", ".", "..") for name in names):
        raise Refused("policy_unsafe", path=path)  # relative, or not one plain path
    owners = {TRUSTED_OWNER, owner}
    fd = posix.open("/", _DIRECTORY_FLAGS)
    try:
        _check_owner(fd, owners, "/")
        for depth, name in enumerate(names):
            here = "/" + "/".join(names[: depth + 1])
            last = depth == len(names) - 1
            try:
                opened = posix.open(name, _FILE_FLAGS if last else _DIRECTORY_FLAGS, dir_fd=fd)
            except OSError:
                raise _open_refusal(name, fd, here) from None
            posix.close(fd)
            fd = opened
            info = _check_owner(fd, owners, here)
        if not _stat.S_ISREG(info.st_mode) or info.st_size > MAX_POLICY_BYTES:
            raise Refused("policy_unreadable", path=path)
        chunks, size = [], 0
        while size <= MAX_POLICY_BYTES:  # it may grow while read: the bound holds anyway
            chunk = posix.read(fd, MAX_POLICY_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        raise Refused("policy_unreadable", path=path) from None
    finally:
        posix.close(fd)
    if size > MAX_POLICY_BYTES:
        raise Refused("policy_unreadable", path=path)
    return b"".join(chunks)


def _check_owner(fd: int, owners: "set[int]", here: str) -> "posix.stat_result":
    info = posix.fstat(fd)
    if info.st_uid not in owners or info.st_mode & UNSAFE_MODE_BITS:
        raise Refused("policy_unsafe", path=here)
    return info


def _open_refusal(name: str, directory: int, here: str) -> "Refused":
    """Why ``name`` did not open: a symbolic link is unsafe, anything else unreadable."""
    try:
        link = _stat.S_ISLNK(posix.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        link = False
    return Refused("policy_unsafe" if link else "policy_unreadable", path=here)


def check_policy(policy: "Any") -> None:
    """Refuse a policy with any key, type or digest this dispatcher does not expect."""
    if not isinstance(policy, dict) or set(policy) != {"format", "host", "operations", "digest"}:
        raise Refused("policy_invalid")
    if policy["format"] != POLICY_FORMAT or not isinstance(policy["host"], str):
        raise Refused("policy_invalid")
    if not isinstance(policy["operations"], dict):
        raise Refused("policy_invalid")
    body = {key: value for key, value in policy.items() if key != "digest"}
    if policy["digest"] != digest(body):  # edited by hand, or cut short
        raise Refused("policy_invalid")
    for operation in policy["operations"].values():
        _check_operation(operation)


def _param_name(name: str) -> bool:
    """[a-z][a-z0-9_]{0,62}, as the command-file format says (contract/commandfile.py)."""
    return 0 < len(name) <= 63 and name[0] in _PARAM_FIRST and set(name) <= _PARAM_REST


def _check_operation(operation: "Any") -> None:
    if not isinstance(operation, dict) or set(operation) != {"argv", "params"}:
        raise Refused("policy_invalid")
    argv, params = operation["argv"], operation["params"]
    if not isinstance(argv, list) or not argv or not isinstance(params, dict):
        raise Refused("policy_invalid")
    if not isinstance(argv[0], str) or not argv[0]:  # the program is always literal
        raise Refused("policy_invalid")
    used = set()
    for element in argv:
        if isinstance(element, str):
            continue
        if not isinstance(element, dict) or not set(element) <= {"param", "prefix", "suffix"}:
            raise Refused("policy_invalid")
        if not all(isinstance(element.get(k, ""), str) for k in ("prefix", "suffix")):
            raise Refused("policy_invalid")
        if element.get("param") not in params:
            raise Refused("policy_invalid")
        used.add(element["param"])
    if used != set(params):
        raise Refused("policy_invalid")
    for name, schema in params.items():
        if not _param_name(name) or not isinstance(schema, dict):
            raise Refused("policy_invalid")
        kind = schema.get("type")
        if kind not in _SCHEMA_KEYWORDS or not set(schema) <= _SCHEMA_KEYWORDS[kind]:
            raise Refused("policy_invalid")  # a keyword this dispatcher would not enforce
        if "format" in schema and schema["format"] not in _FORMATS:
            raise Refused("policy_invalid")
        if "pattern" in schema and not isinstance(schema["pattern"], str):
            raise Refused("policy_invalid")  # compiled when used: a bad one refuses then
        for key in ("minLength", "maxLength"):
            if key in schema and (type(schema[key]) is not int or schema[key] < 0):
                raise Refused("policy_invalid")
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if key in schema and type(schema[key]) is not int:  # the generator makes them exact
                raise Refused("policy_invalid")
        if schema.get("multipleOf", 1) <= 0:
            raise Refused("policy_invalid")
        if "enum" in schema and not isinstance(schema["enum"], list):
            raise Refused("policy_invalid")


# The command ---------------------------------------------------------------------------


def quote(text: str) -> str:
    """Exactly ``shlex.quote`` (the daemon's quoting, sshadapter/contract/argv.py)."""
    if not text:
        return "''"
    if set(text) <= _SAFE_BARE:
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def split_command(command: str) -> "list[str]":
    """The argv of a command written the daemon's way, or Refused("not_canonical").

    The daemon sends ``" ".join(shlex.quote(e) for e in argv)``. This splits
    that form (``'...'`` quoting, ``'"'"'`` for a quote inside, single spaces)
    and then quotes the result again: only a command equal to its own
    re-quoting passes, so the argv is the one the daemon meant, and no other
    spelling (double quotes, backslashes, extra spaces, ``$``) gets through.
    """
    argv: list[str] = []
    i, end = 0, len(command)
    while True:
        if command.startswith("'", i):
            pieces = []
            j = i + 1
            while True:
                k = command.find("'", j)
                if k < 0:
                    raise Refused("not_canonical")
                pieces.append(command[j:k])
                if command.startswith("'\"'\"'", k):
                    j = k + 5
                    continue
                break
            argv.append("'".join(pieces))
            i = k + 1
        else:
            k = command.find(" ", i)
            k = end if k < 0 else k
            argv.append(command[i:k])
            i = k
        if i == end:
            break
        if command[i] != " ":
            raise Refused("not_canonical")
        i += 1
    if " ".join(quote(element) for element in argv) != command:
        raise Refused("not_canonical")
    return argv


def decide(raw: "bytes | None", policy: "Mapping[str, Any]") -> "tuple[str, list[str]]":
    """The operation and argv to run for the client's command, or Refused: runs nothing."""
    if not raw:
        raise Refused("no_command")
    if len(raw) > MAX_COMMAND_BYTES:
        raise Refused("too_long")
    try:
        command = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not_utf8") from None
    argv = split_command(command)
    shaped, accepted = [], []
    for name, operation in policy["operations"].items():
        values = _fill(operation["argv"], argv)
        if values is None:
            continue
        shaped.append(name)
        if all(_valid(operation["params"][key], text) for key, text in values.items()):
            accepted.append(name)
    if len(accepted) > 1:
        raise Refused("ambiguous", ",".join(sorted(accepted)))
    if accepted:
        return accepted[0], argv
    if shaped:
        raise Refused("bad_argument", ",".join(sorted(shaped)))
    raise Refused("no_match")


def _fill(template: "list[Any]", argv: "list[str]") -> "dict[str, str] | None":
    """Each placeholder's text when ``argv`` has the template's shape, else None."""
    if len(template) != len(argv):
        return None
    values: dict[str, str] = {}
    for element, got in zip(template, argv):
        if isinstance(element, str):
            if got != element:
                return None
            continue
        prefix, suffix = element.get("prefix", ""), element.get("suffix", "")
        if len(got) < len(prefix) + len(suffix):
            return None
        if not (got.startswith(prefix) and got.endswith(suffix)):
            return None
        text = got[len(prefix) : len(got) - len(suffix)]
        if values.setdefault(element["param"], text) != text:  # one value per parameter
            return None
    return values


# The parameter schemas: the keywords a parameter may use (sshadapter/contract/params.py
# PARAM_KEYWORDS), with JSON Schema's meaning. A value arrives as the text the daemon
# rendered (sshadapter/contract/argv.py render): a string as itself, an integer in decimal, a
# boolean as true/false. Text that the daemon would not have rendered is refused.


def _canonical_integer(text: str) -> bool:
    """0|-?[1-9][0-9]*: the daemon's rendering of an integer, never 05, -0, +5 or 1e3."""
    digits = text[1:] if text.startswith("-") else text
    if not digits or not set(digits) <= _DIGITS:
        return False
    return digits[0] != "0" or digits == text == "0"


def _re() -> "ModuleType":
    import re  # only for a parameter with a pattern or a date-time format

    return re


def _valid(schema: "dict[str, Any]", text: str) -> bool:
    kind = schema["type"]
    value: Any
    if kind == "string":
        value = text
    elif kind == "integer":
        if len(text) > MAX_INTEGER_DIGITS + 1 or not _canonical_integer(text):
            return False
        value = int(text)
    elif text in ("true", "false"):
        value = text == "true"
    else:
        return False
    if "const" in schema and not _json_equal(value, schema["const"]):
        return False
    if "enum" in schema and not any(_json_equal(value, option) for option in schema["enum"]):
        return False
    if kind == "string":
        return _valid_string(schema, value)
    if kind == "integer":
        return _valid_integer(schema, value)
    return True


def _valid_string(schema: "dict[str, Any]", value: str) -> bool:
    if len(value) < schema.get("minLength", 0):
        return False
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return False
    if "pattern" in schema:
        try:
            if _re().search(schema["pattern"], value) is None:
                return False
        except _re().error:
            raise Refused("policy_invalid") from None
    return schema.get("format") != "date-time" or is_date_time(value)


def _valid_integer(schema: "dict[str, Any]", value: int) -> bool:
    checks: tuple[tuple[str, Callable[[int, int], bool]], ...] = (
        ("minimum", lambda v, b: v >= b),
        ("maximum", lambda v, b: v <= b),
        ("exclusiveMinimum", lambda v, b: v > b),
        ("exclusiveMaximum", lambda v, b: v < b),
        ("multipleOf", lambda v, b: v % b == 0),
    )
    return all(key not in schema or test(value, schema[key]) for key, test in checks)


def _json_equal(a: "Any", b: "Any") -> bool:
    """JSON equality: true is not 1, and 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def is_date_time(text: str) -> bool:
    """RFC 3339 date-time, as the daemon's ``format: date-time`` (contract/rfc3339.py)."""
    match = _re().fullmatch(_DATE_TIME, text)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not 1 <= month <= 12 or not 1 <= day <= _DAYS[month - 1] + (month == 2 and leap):
        return False
    if hour > 23 or minute > 59 or second > 60:
        return False
    offset = 0
    if match.group(7):
        off_hour, off_minute = int(match.group(8)), int(match.group(9))
        if off_hour > 23 or off_minute > 59:
            return False
        offset = (off_hour * 60 + off_minute) * (-1 if match.group(7) == "-" else 1)
    return second != 60 or (hour * 60 + minute - offset) % 1440 == 23 * 60 + 59


# Running it ----------------------------------------------------------------------------


def digest_answer(policy: "Mapping[str, Any]") -> bytes:
    """What DIGEST_COMMAND prints: the whole policy's digest and each operation's."""
    answer = {
        "dispatcher": VERSION,
        "format": policy["format"],
        "host": policy["host"],
        "digest": policy["digest"],
        "operations": {name: digest(op) for name, op in policy["operations"].items()},
    }
    return canonical_json(answer) + b"\n"


def log(message: str, priority: int, socket_path: str) -> None:
    """One syslog datagram (RFC 3164, like glibc's syslog(3)); lost when nobody listens,
    or when the syslog's queue stays full for LOG_SEND_TIMEOUT_SECONDS."""
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime())
    line = f"<{LOG_FACILITY_AUTHPRIV * 8 + priority}>{stamp} {TAG}[{posix.getpid()}]: {message}"
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        try:
            sock.settimeout(LOG_SEND_TIMEOUT_SECONDS)
            sock.sendto(line.encode("ascii", "replace"), socket_path)
        finally:
            sock.close()
    except OSError:
        pass  # no syslog here: the refusal itself still happens and is on stderr


def _client() -> str:
    """The client address sshd reports, if it looks like one (it is logged)."""
    address = posix.environ.get(b"SSH_CONNECTION", b"").decode("ascii", "replace").split(" ")[0]
    return address if 0 < len(address) <= 45 and set(address) <= _ADDRESS else "-"


def _environment() -> "dict[bytes, bytes]":
    try:
        account = pwd.getpwuid(posix.getuid())
        home, name = account.pw_dir, account.pw_name
    except KeyError:  # not in the account database: what sshd set, which came from it
        home = _fsdecode(posix.environ.get(b"HOME", b"/"))
        name = _fsdecode(posix.environ.get(b"USER", b""))
    values = {"PATH": FIXED_PATH, "HOME": home, "USER": name, "LOGNAME": name}
    return {_fsencode(key): _fsencode(values[key]) for key in ENVIRONMENT}


def _fsencode(text: str) -> bytes:
    """os.fsencode."""
    return text.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def _fsdecode(data: bytes) -> str:
    """os.fsdecode."""
    return data.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def _resolve(program: str) -> "str | None":
    if "/" in program:
        return program
    for directory in FIXED_PATH.split(":"):
        candidate = directory + "/" + program
        try:
            regular = _stat.S_ISREG(posix.stat(candidate).st_mode)
        except (OSError, ValueError):
            continue
        if regular and posix.access(candidate, posix.X_OK):
            return candidate
    return None


def _refuse(
    reason: str, raw: "bytes | None", log_socket: str, operation: str = "", path: str = ""
) -> int:
    """Log, then say so on stderr (a client that hung up must not cost the log line).

    The log names the policy file or directory at fault; the client is never told it."""
    command_sha = sha256_hex(raw or b"")
    about = f" operation={operation}" if operation else ""
    about += f" path={canonical_json(path).decode()}" if path else ""
    log(
        f"refused reason={reason}{about} command_sha256={command_sha} "
        f"command_bytes={len(raw or b'')} client={_client()}",
        LOG_WARNING,
        log_socket,
    )
    try:
        sys.stderr.write(f"{REFUSAL_PREFIX} ({reason}) sha256:{command_sha}\n")
        sys.stderr.flush()
    except OSError:
        pass  # nobody is reading any more
    return REFUSED_STATUS


def _on_cpu_budget(signum: int, frame: "Any") -> None:
    raise _TooCostly


def _options(args: "list[str]") -> "tuple[dict[str, str], list[str]]":
    """The forced command's ``--name VALUE`` options (each at most once) and the rest.

    Only sshd's ``command=`` sets them: never the environment, which a client
    may reach through ``AcceptEnv``."""
    options: dict[str, str] = {}
    while len(args) >= 2 and args[0] in _OPTIONS and args[0] not in options:
        options[args[0]], args = args[1], args[2:]
    return options, args


# --log-socket PATH: the log goes there instead of /dev/log (the tests' syslog).
# --policy-owner UID: the policy and its directories may also be owned by UID (tests and
# development, where the files cannot be root's); only root writes the forced command.
_OPTIONS = ("--log-socket", "--policy-owner")


def main(argv: "list[str] | None" = None) -> int:
    options, args = _options(sys.argv[1:] if argv is None else argv)
    log_socket = options.get("--log-socket", DEFAULT_LOG_SOCKET)
    raw = posix.environ.get(b"SSH_ORIGINAL_COMMAND")
    _signal.signal(_signal.SIGPROF, _on_cpu_budget)
    try:
        _signal.setitimer(_signal.ITIMER_PROF, MAX_DECISION_CPU_SECONDS)
        try:
            operation, command, policy = _judge(options, args, raw)
        finally:
            _signal.setitimer(_signal.ITIMER_PROF, 0)
    except Refused as exc:
        return _refuse(exc.reason, raw, log_socket, exc.operation, exc.path)
    except _TooCostly:
        return _refuse("too_costly", raw, log_socket)
    if not command:
        sys.stdout.buffer.write(digest_answer(policy))
        return 0
    return run(operation, command, raw or b"", log_socket)


def _judge(
    options: "Mapping[str, str]", args: "list[str]", raw: "bytes | None"
) -> "tuple[str, list[str], dict[str, Any]]":
    """(operation, argv, policy) to run; an empty argv answers DIGEST_COMMAND. Or Refused."""
    owner = options.get("--policy-owner", str(TRUSTED_OWNER))
    if len(args) != 1 or not owner.isdigit() or not owner.isascii():
        raise Refused("bad_invocation")
    if any(posix.isatty(fd) for fd in (0, 1, 2)):
        raise Refused("terminal")
    policy = read_policy(args[0], int(owner))
    if raw == DIGEST_COMMAND.encode():
        return "", [], policy
    operation, command = decide(raw, policy)
    return operation, command, policy


def run(operation: str, command: "list[str]", raw: bytes, log_socket: str) -> int:
    """execv the argv: no shell, a fixed environment, stdin on /dev/null. Returns only on error."""
    path = _resolve(command[0])
    if path is None:
        sys.stderr.write(f"{TAG}: {command[0]}: not found\n")
        return NOT_FOUND_STATUS
    log(
        f"allowed operation={operation} command_sha256={sha256_hex(raw)} client={_client()}",
        LOG_INFO,
        log_socket,
    )
    null = posix.open("/dev/null", posix.O_RDONLY)
    posix.dup2(null, 0)
    posix.close(null)
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec.
    for name in ("SIGPIPE", "SIGXFSZ", "SIGPROF"):
        _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # The point of the dispatcher: the argv itself, no shell.
        posix.execve(path, [e.encode("utf-8") for e in command], _environment())
    except OSError as exc:
        sys.stderr.write(f"{TAG}: {command[0]}: {exc.strerror}\n")
        return NOT_FOUND_STATUS if isinstance(exc, FileNotFoundError) else CANNOT_EXECUTE_STATUS


# The compiled file (sshadapter/dispatch/launcher.py, docs/dispatcher.md "Start-up") ----


def write_compiled(target: str, data: bytes, compiled: "Callable[..., Any]", source: str) -> int:
    """``sshadapter-dispatch --compile``: write ``data`` to ``target`` atomically, 0644, and
    say whether calls will use it (``compiled``, the launcher's own check, with the owners
    the forced command allows by default and the one who compiled it)."""
    script = target[: -len(".compiled")]
    if not target.startswith("/"):  # a call finds it by the forced command's absolute path
        sys.stderr.write(f"{TAG}: {script}: run --compile by the file's absolute path\n")
        return CANNOT_EXECUTE_STATUS
    temporary = f"{target}.{posix.getpid()}.tmp"
    flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC
    try:
        fd = posix.open(temporary, flags, 0o644)
        try:
            posix.fchmod(fd, 0o644)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view) :]
            posix.fsync(fd)
        finally:
            posix.close(fd)
        posix.rename(temporary, target)
    except OSError as exc:
        sys.stderr.write(f"{TAG}: {target}: {exc.strerror}\n")
        return CANNOT_EXECUTE_STATUS
    if compiled(script, source, {TRUSTED_OWNER, posix.geteuid()}) is None:
        sys.stderr.write(
            f"{TAG}: {target}: written, but calls will not use it: it and every directory "
            "above it must be root's and writable by nobody else, as the policy\n"
        )
        return CANNOT_EXECUTE_STATUS
    sys.stderr.write(f"{TAG}: {target}: compiled for {sys.implementation.cache_tag}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
