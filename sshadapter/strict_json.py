"""Strict JSON: RFC 8259 plus the rules of docs/strict-json.md, each a named reason.

Two parsers that must agree:

- ``rfc8259._reference_parse``: a pure-Python recursive-descent parser written
  from the RFC 8259 grammar. It is the specification: it decides every input,
  with the exact reason, byte offset and path.
- ``strict_loads``: the fast path, C code only, whatever the input. msgspec
  parses (orjson a small input without long digit runs, else msgspec, which
  keeps integers of any size exact); one ``orjson.dumps`` of the
  value refuses integers outside the range and, wrapped in lists, nesting
  beyond ``max_depth``; duplicate names are found by counting colons. The
  reference parser runs only to explain a rejected input of at most
  ``EXPLAIN_MAX_BYTES``: no input can buy pure-Python parsing time with its size.

The C parsers' exceptions are translated into ``StrictJSONError`` in exactly one
place (``strict_loads``), ``raise ... from exc``. See docs/strict-json.md.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
from collections.abc import Callable
from typing import Any, Final

import orjson

from sshadapter.rfc8259 import (
    _BOM,
    _NON_FINITE,
    _OUT_OF_RANGE,
    _check_limits,
    _reference_parse,
)
from sshadapter.rfc8259 import DEFAULT_MAX_DEPTH as DEFAULT_MAX_DEPTH
from sshadapter.rfc8259 import MAX_DEPTH_LIMIT as MAX_DEPTH_LIMIT
from sshadapter.rfc8259 import REASONS as REASONS
from sshadapter.rfc8259 import StrictJSONError as StrictJSONError

# A rejected input up to this size is explained by the reference parser: the
# first fault from the left, its byte offset and its JSON path. The reference
# costs up to ~1 us a byte in pure Python (~1 ms here); a larger rejected input
# is explained from the C parsers' own errors instead (same reasons; the offset
# is theirs, or -1), so a hostile host cannot buy judging time by size.
EXPLAIN_MAX_BYTES: Final[int] = 1024

_WHITESPACE: Final = b" \t\n\r"
# An input up to this size with no run of 19 or more digits is parsed by orjson
# (its integers have at most 18 digits, so all are exact); any other by msgspec,
# which keeps integers of any size exact, and whose value peaks at about a
# quarter of orjson's memory (bench_offline). 64 KiB: the largest output judged
# on the event loop (offload.OFFLOAD_ABOVE_BYTES), and every request and MCP message.
ORJSON_MAX_BYTES: Final[int] = 64 * 1024
# Over ORJSON_MAX_BYTES the value is written in pieces of about 1 MiB: a 16 MiB
# output then peaks near its value's own memory, not value + 2-4x (orjson's
# output buffer). The pieces are found on the value's first 4 levels, through
# containers of at most 16 members: a few hundred orjson calls at most.
DUMP_SLICE_BYTES: Final[int] = 1024 * 1024
SPINE_LEVELS: Final[int] = 4
SPINE_FANOUT: Final[int] = 16
SPINE_VISITS: Final[int] = 512  # containers taken apart at most: a bound on the Python work
# Up to this size the brackets are counted to skip the depth wrapping of a document
# that cannot be too deep; over it two counts of the input cost more than the wrapping
# (a cached chain of lists, _chain), so the value is always wrapped.
BRACKET_COUNT_MAX_BYTES: Final[int] = 8 * 1024
_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGIT_RUN: Final = b"0" * 19


def _dumps_max_depth() -> int:
    """The deepest nesting orjson.dumps writes (254 in orjson 3.x), found by trying.

    The depth check relies on it; measuring it at import means an orjson release
    that moves the limit cannot silently weaken the check.
    """
    low, high = 1, 4096  # dumps(depth low) succeeds; dumps(depth high) fails
    while high - low > 1:
        middle = (low + high) // 2
        nest: list[Any] = []
        for _ in range(middle - 1):
            nest = [nest]
        try:
            orjson.dumps(nest)
        except orjson.JSONEncodeError:
            high = middle
        else:
            low = middle
    if low <= MAX_DEPTH_LIMIT:
        raise RuntimeError(f"orjson.dumps nests only {low} levels; the depth check needs more")
    return low


_DUMPS_MAX_DEPTH: Final[int] = _dumps_max_depth()


def strict_loads(data: bytes, *, max_bytes: int, max_depth: int) -> Any:
    """Parse one strict JSON text, or raise StrictJSONError with the reason.

    Every step is C code over the input or the value, so the cost is a small
    constant times the C parse whatever the input holds (bench_offline).
    """
    _check_limits(max_bytes, max_depth)
    if not isinstance(data, bytes):
        raise TypeError(f"strict_loads takes bytes, not {type(data).__name__}")
    if len(data) > max_bytes:  # before anything else
        raise StrictJSONError("too_large", max_bytes, f"{len(data)} bytes > {max_bytes}")
    if data.startswith(_BOM):
        raise StrictJSONError("bom", 0, "UTF-8 byte order mark")
    try:
        value = _parse(data)
    except _Refused as refused:
        # The one translation point: the reference parser (or the C parsers' errors) name it.
        raise _rejection(data, max_depth, refused.cause) from refused.cause
    # Range and depth in one orjson.dumps: it refuses integers outside
    # [-2**63, 2**64-1] (msgspec kept them exact) and nesting beyond
    # _DUMPS_MAX_DEPTH. Wrapped in (_DUMPS_MAX_DEPTH - max_depth) lists, the value
    # is refused exactly when its own depth exceeds max_depth. A document with at
    # most max_depth brackets (strings included) cannot be too deep: no wrapping.
    # (Counting costs more than the wrapping over BRACKET_COUNT_MAX_BYTES: always wrap there.)
    shallow = (
        len(data) <= BRACKET_COUNT_MAX_BYTES and data.count(b"[") + data.count(b"{") <= max_depth
    )
    wraps = 0 if shallow else _DUMPS_MAX_DEPTH - max_depth
    try:
        colons = _written_colons(value, wraps, len(data))
    except orjson.JSONEncodeError as exc:
        if "Integer" in str(exc):
            raise _found(data, max_depth, "number_out_of_range", _OUT_OF_RANGE) from exc
        raise _found(data, max_depth, "too_deep", "nesting deeper than max_depth") from exc
    # Duplicates: every member has one structural colon; string colons are raw
    # or the escape \u003a. orjson writes every colon of the kept value raw and
    # keeps only the last of duplicate members, each of which takes at least its
    # own colon with it. So the counts are equal exactly when nothing was dropped.
    if colons != data.count(b":") + _escaped_colons(data):
        raise _found(data, max_depth, "duplicate_name", "duplicate member name")
    return value


def _written_colons(value: Any, wraps: int, size: int) -> int:
    """The colons orjson.dumps writes for ``value`` inside ``wraps`` lists; its errors raised.

    A large value is written in pieces (_spine_colons) so that orjson's output
    buffer, up to 4x what it writes, never holds more than a piece beside the value.
    """
    if size <= ORJSON_MAX_BYTES:
        return _dumped_colons(value, wraps)
    return _spine_colons(value, wraps, SPINE_LEVELS, size, [SPINE_VISITS])


def _dumped_colons(value: Any, wraps: int) -> int:
    """The colons of ``orjson.dumps`` of ``value`` inside ``wraps`` lists; its errors raised.

    The lists are a chain built once per thread and wraps count (``_chain``):
    building ~240 of them per call cost more than the dumps of a 1 KB value.
    """
    if not wraps:
        return orjson.dumps(value).count(b":")
    outer, hole = _chain(wraps)
    hole.append(value)
    try:
        return orjson.dumps(outer).count(b":")
    finally:
        hole.clear()  # the chain never keeps a value alive


# Chains of nested lists cached per thread (a chain holds one value at a time, so a
# chain is never shared between threads), for at most this many wraps counts: a few
# max_depth values, plus the spine's levels, in practice.
MAX_CACHED_CHAINS: Final[int] = 64
_chains = threading.local()


def _chain(wraps: int) -> tuple[list[Any], list[Any]]:
    """``wraps`` nested lists: the outermost, and the empty innermost to put a value in.

    Cached for this thread; a fresh chain if the cached one is in use (a re-entrant
    call) or the cache is full.
    """
    cache: dict[int, tuple[list[Any], list[Any]]] | None = getattr(_chains, "cache", None)
    if cache is None:
        cache = _chains.cache = {}
    found = cache.get(wraps)
    if found is not None and not found[1]:
        return found
    hole: list[Any] = []
    outer = hole
    for _ in range(wraps - 1):
        outer = [outer]
    if found is None and len(cache) < MAX_CACHED_CHAINS:
        cache[wraps] = (outer, hole)
    return outer, hole


def _spine_colons(node: Any, wraps: int, levels: int, size: int, visits: list[int]) -> int:
    """_written_colons of ``node``, piece by piece: the same colons, integers and depth.

    A small container on the first SPINE_LEVELS branching levels (a container of
    one member takes no level: a chain of lists above the rows is followed down)
    is taken member by member, each one level deeper, so one more wrap; a large
    one in slices of about DUMP_SLICE_BYTES (a slice has the depth of its
    container, so the same wraps); anything else, and everything once
    SPINE_VISITS containers were taken apart, is written whole. A member's
    colons are its structural one, its name's and its value's.
    """
    if not node or not isinstance(node, list | dict):
        return _dumped_colons(node, wraps)
    if levels and len(node) <= SPINE_FANOUT and visits[0] > 0:
        visits[0] -= 1
        below = levels - (len(node) > 1)
        if isinstance(node, list):
            return sum(_spine_colons(item, wraps + 1, below, size, visits) for item in node)
        names: int = len(node) + sum(str(name).count(":") for name in node)
        values = node.values()
        return names + sum(_spine_colons(v, wraps + 1, below, size, visits) for v in values)
    step = max(1, len(node) * DUMP_SLICE_BYTES // size)  # items in about DUMP_SLICE_BYTES
    if isinstance(node, list):
        return sum(_dumped_colons(node[i : i + step], wraps) for i in range(0, len(node), step))
    items = iter(node.items())
    pieces = (dict(itertools.islice(items, step)) for _ in range(0, len(node), step))
    return sum(_dumped_colons(piece, wraps) for piece in pieces)


class _Refused(Exception):
    """A C parser refused the input; ``cause`` is its exception."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _parse(data: bytes) -> Any:
    """The value of ``data``, every integer exact, or _Refused (see ORJSON_MAX_BYTES)."""
    if len(data) <= ORJSON_MAX_BYTES and _LONG_DIGIT_RUN not in data.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise _Refused(exc) from exc
    return _msgspec_parse()(data)


@functools.cache
def _msgspec_parse() -> Callable[[bytes], Any]:
    """msgspec's decoder, imported on first use: ~25 ms that `sshadapter mcp` does not pay."""
    import msgspec

    decode = msgspec.json.Decoder().decode  # untyped: dict, list, str, int, float, bool, None

    def parse(data: bytes) -> Any:
        try:
            return decode(data)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _Refused(exc) from exc

    return parse


def _escaped_colons(data: bytes) -> int:
    """How many \\u003a escapes (either case) the strings of an accepted input hold.

    Removing each escaped backslash first leaves every remaining backslash the
    start of an escape, so ``\\\\u003a`` (a backslash, then "u003a") is not counted.
    """
    if b"\\u003" not in data:  # nearly every input: one memchr-speed search
        return 0
    count, start = 0, 0
    while start < len(data):  # in pieces of about DUMP_SLICE_BYTES: no copy of the whole input
        end = _piece_end(data, start + DUMP_SLICE_BYTES)
        plain = data[start:end].replace(b"\\\\", b"")
        count += plain.count(b"\\u003a") + plain.count(b"\\u003A")
        start = end
    return count


def _piece_end(data: bytes, end: int) -> int:
    """A cut at or after ``end`` with no backslash in the 6 bytes before it, so that no
    escape and no run of backslashes is split; after 64 tries (backslashes all
    along) the rest of the input is one piece."""
    for _ in range(64):
        if end >= len(data):
            break
        last = data.rfind(b"\\", end - 6, end)
        if last == -1:
            return end
        end = last + 7
    return len(data)


def _found(data: bytes, max_depth: int, reason: str, detail: str) -> StrictJSONError:
    """A rule broken in a parsed input: the reference locates it if the input is small."""
    if len(data) <= EXPLAIN_MAX_BYTES:
        err = _reference_error(data, max_depth)
        if err is not None:
            return err
        # The fast checks and the specification disagree: fail closed, say so.
        return StrictJSONError(reason, -1, f"{detail} (fast checks only)")
    return StrictJSONError(reason, -1, f"{detail} (not located: over {EXPLAIN_MAX_BYTES} bytes)")


def _rejection(data: bytes, max_depth: int, exc: Exception) -> StrictJSONError:
    """Why a C parser refused ``data``: the reference's verdict, or for a large input orjson's."""
    if len(data) <= EXPLAIN_MAX_BYTES:
        err = _reference_error(data, max_depth)
        if err is not None:
            return err
        return StrictJSONError("syntax", -1, f"rejected by the C parser only: {str(exc)[:200]}")
    # The whole-input checks first, in the reference's order.
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as utf8:
        return StrictJSONError("not_utf8", utf8.start, f"invalid UTF-8: {utf8.reason}")
    if not data.strip(_WHITESPACE):
        return StrictJSONError("empty", len(data), "no JSON value")
    if isinstance(exc, RecursionError):  # nested beyond msgspec's stack, far beyond MAX_DEPTH_LIMIT
        return StrictJSONError("too_deep", -1, "nesting deeper than max_depth")
    if isinstance(exc, orjson.JSONDecodeError):
        return _from_orjson(data, exc)
    named = _from_msgspec(data, str(exc))
    if named is not None:  # without a second parse: orjson's would peak at ~12x the size
        return named
    try:  # orjson names the rest (the end of the data, a lone surrogate) and where it is
        orjson.loads(data)
    except orjson.JSONDecodeError as refused:
        return _from_orjson(data, refused)
    return StrictJSONError("syntax", -1, f"rejected by msgspec only: {str(exc)[:200]}")


# orjson's messages (3.x), each to the reason it shows; anything else is syntax.
_ORJSON_MESSAGES: Final = (
    ("depth limit", "too_deep"),
    ("surrogate", "lone_surrogate"),
    ("infinity", "non_finite_number"),
    ("after document", "trailing_data"),
)
_NUMBER_TAILS: Final = frozenset(bytes((d, c)) for d in b"0123456789" for c in b"0123456789+-.eE")


_MSGSPEC_AT: Final = re.compile(r"JSON is malformed: (.*) \(byte ([0-9]+)\)$")


def _from_msgspec(data: bytes, message: str) -> StrictJSONError | None:
    """A large rejected input's reason from msgspec's message, or None where it cannot tell."""
    if message.startswith("Integer value out of range"):
        return StrictJSONError("number_out_of_range", -1, _OUT_OF_RANGE)
    if message.startswith("Number out of range"):
        return StrictJSONError("non_finite_number", -1, "number overflows a double")
    found = _MSGSPEC_AT.match(message)
    if found is None:  # "Input data was truncated": the end, or a lone high surrogate
        if not message.startswith("Input data was truncated"):
            return None  # orjson tells the rest apart
        if not _has_high_surrogate(data):
            return StrictJSONError("syntax", len(data), "unexpected end of data")
        # msgspec reads the 6 bytes after a high surrogate escape for its pair: past the
        # end it says "truncated". The escape is then in the last few bytes, and named
        # from them: a second parse of the whole input (orjson's) would peak at ~12x it.
        lone = _lone_high_surrogate_at_end(data)
        if lone is not None:
            return StrictJSONError("lone_surrogate", lone, "no low surrogate after \\u escape")
        return StrictJSONError("syntax", len(data), "unexpected end of data")
    what, offset = found.group(1), min(int(found.group(2)), len(data))
    reason = "syntax"
    if what in ("invalid utf-16 surrogate pair", "unexpected end of escaped utf-16 surrogate pair"):
        reason = "lone_surrogate"
    elif what == "invalid character" and data.startswith((b"NaN", b"Infinity"), offset):
        reason = "non_finite_number"  # msgspec points at the N or I, after any "-"
    elif what == "trailing characters":  # msgspec points just past the first one
        reason = "syntax" if data[offset - 2 : offset] in _NUMBER_TAILS else "trailing_data"
    detail = f"{what[:200]} (over {EXPLAIN_MAX_BYTES} bytes)"
    return StrictJSONError(reason, offset, detail)


_HIGH_SURROGATES: Final = tuple(
    b"\\u" + d + h for d in (b"d", b"D") for h in (b"8", b"9", b"a", b"b", b"A", b"B")
)


# After a high surrogate escape msgspec reads its pair: "\\uDC00" is 6 bytes.
_PAIR_BYTES: Final = 6


def _lone_high_surrogate_at_end(data: bytes) -> int | None:
    """The offset of a high surrogate escape in the last bytes of ``data`` that has no
    ``\\u`` escape after it (the reference's lone_surrogate there), or None: none there,
    or a second escape cut short (the reference's syntax error).

    Only the tail is read: an escape whose pair would start within _PAIR_BYTES of the end.
    """
    start = max(0, len(data) - 2 * _PAIR_BYTES - 1)
    best = max(data.rfind(escape, start) for escape in _HIGH_SURROGATES)
    if best < 0 or len(data) - (best + _PAIR_BYTES) >= _PAIR_BYTES:
        return None
    if data.startswith(b"\\u", best + _PAIR_BYTES):
        return None  # a \\u escape follows, with fewer than four hex digits: syntax
    head = data[max(0, best - 64) : best]  # an escaped backslash before it makes it text
    if (len(head) - len(head.rstrip(b"\\"))) % 2:
        return None
    return best


def _has_high_surrogate(data: bytes) -> bool:
    """Whether any \\uD800-\\uDBFF escape may be in ``data`` (a few memchr-speed searches)."""
    return b"\\u" in data and any(escape in data for escape in _HIGH_SURROGATES)


def _from_orjson(data: bytes, exc: orjson.JSONDecodeError) -> StrictJSONError:
    """A large rejected input's reason from orjson's error, at its byte offset."""
    offset = exc.pos if data.isascii() else len(data.decode("utf-8")[: exc.pos].encode("utf-8"))
    reason = next((r for text, r in _ORJSON_MESSAGES if text in exc.msg), "syntax")
    if reason == "syntax" and data.startswith(_NON_FINITE, offset):
        reason = "non_finite_number"
    # "0-", "1.5+": orjson ends the number and finds content after it; the grammar
    # (and the reference) reads one malformed number.
    if reason == "trailing_data" and data[offset - 1 : offset + 1] in _NUMBER_TAILS:
        reason = "syntax"
    # The data ends right after a high surrogate escape: orjson says end of data, the
    # reference (which reads the pair first) a lone surrogate.
    if reason == "syntax" and "end of data" in exc.msg:
        lone = _lone_high_surrogate_at_end(data)
        if lone is not None:
            reason, offset = "lone_surrogate", lone
    return StrictJSONError(reason, offset, f"{exc.msg[:200]} (over {EXPLAIN_MAX_BYTES} bytes)")


def _reference_error(data: bytes, max_depth: int) -> StrictJSONError | None:
    """The reference parser's verdict as an error, or None if it accepts."""
    try:
        _reference_parse(data, max_depth)
    except StrictJSONError as err:
        return err
    return None
