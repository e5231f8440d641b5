"""The dispatch policy of a host: its operations as the host's dispatcher enforces them.

Reference: docs/dispatcher.md. ``sshadapter policy TARGET`` prints it (for a group,
one document every member installs); the
host's ``sshadapter-dispatch`` (sshadapter/dispatch/dispatcher.py, never imported here)
reads it. For each operation of the host alias: the argv template (a literal
element is a string, a placeholder element ``{"param", "prefix", "suffix"}``)
and each parameter's schema, rewritten so the dispatcher's stdlib checks mean
exactly what the daemon's jsonschema-rs checks mean; and the sha256 of the
whole. Nothing else: no output schema, no other host's operation, no secret.

An operation on a dispatch host must be one the dispatcher can enforce with
the daemon's meaning, or its directory does not load (ConfigError naming the
file and key): a literal program, at most one placeholder per element,
parameter patterns in the subset of sshadapter/dispatch/patterns.py, integer
bounds the dispatcher compares exactly, no exit status equal to the
dispatcher's refusal status, and no two operations of one host that could
both accept the same command.

This module also holds what the daemon and the dispatcher agree on (the
reserved digest command, the policy format; the refusal status and line are
part of the exit-status contract, contract/exitstatus.py);
tests/dispatch/test_dispatch.py checks the dispatcher's copies against these.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import TYPE_CHECKING, Any, Final

from sshadapter.contract.exitstatus import REFUSED_STATUS
from sshadapter.contract.schemas import DRAFT_2020_12, SchemaSet
from sshadapter.dispatch.patterns import translate
from sshadapter.errors import ConfigError

if TYPE_CHECKING:
    from sshadapter.config import Config
    from sshadapter.contract.registry import Operation, Registry
    from sshadapter.inventory.fleet import Inventory

POLICY_FORMAT: Final = "sshadapter-dispatch-policy/1"
DIGEST_COMMAND: Final = "#sshadapter-policy-digest"  # shlex.quote never leaves "#" bare
DISPATCHER_FILE: Final = "dispatcher.py"  # in this package; written out as sshadapter-dispatch
LAUNCHER_FILE: Final = "launcher.py"  # the written file's start: runs the dispatcher compiled
_SOURCE_SLOT: Final = 'SOURCE = ""\n'  # where the launcher holds the dispatcher's source
# jsonschema-rs compares an integer with a float bound through a double: beyond 2**53 the two
# validators could disagree, so the policy's bounds stop there (the dispatcher is stricter).
MAX_EXACT_INTEGER: Final = 2**53
_PROGRAM: Final = re.compile(r"/.*|[A-Za-z0-9_+][A-Za-z0-9_.+-]*", re.S)


def canonical_json(value: Any) -> bytes:
    """The bytes digests are taken over, here and on the host (dispatcher.canonical_json)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def dispatcher_source() -> bytes:
    """The host's dispatcher file, as `sshadapter dispatcher --write` writes it: the
    launcher, with the dispatcher's source as its ``SOURCE`` (docs/dispatcher.md "Start-up")."""
    import ast
    from importlib.resources import files

    package = files("sshadapter.dispatch")
    launcher = package.joinpath(LAUNCHER_FILE).read_text(encoding="utf-8")
    source = package.joinpath(DISPATCHER_FILE).read_text(encoding="utf-8")
    # A triple-quoted literal that still reads as the source: backslashes doubled, and a
    # quote escaped wherever another follows it, so no three in a row close the literal.
    literal = '"""' + re.sub(r'"(?=")', r'\\"', source.replace("\\", "\\\\")) + '"""'
    if ast.literal_eval(literal) != source or launcher.count(_SOURCE_SLOT) != 1:
        raise RuntimeError("the dispatcher's source does not fit the launcher")  # a build defect
    return launcher.replace(_SOURCE_SLOT, f"SOURCE = {literal}\n").encode("utf-8")


def dispatch_hosts(config: Config) -> frozenset[str]:
    """The host aliases marked ``dispatch = true``."""
    return frozenset(alias for alias, host in config.hosts.items() if host.dispatch)


def dispatch_groups(config: Config, inventory: Inventory) -> frozenset[str]:
    """The groups with at least one dispatch host among their members."""
    hosts = dispatch_hosts(config)
    return frozenset(
        name for name, members in inventory.groups.items() if not hosts.isdisjoint(members)
    )


def host_policies(
    registry: Registry, inventory: Inventory | None = None
) -> dict[str, dict[str, Any]]:
    """The policy of each dispatch host of ``registry``, or ConfigError naming the first
    operation a host's dispatcher could not enforce: all or nothing.

    Built by whoever needs them (the daemon's loader, ``sshadapter policy`` and ``check``,
    the demo), never by the registry itself: an evaluation worker has no use for them.
    Each operation's entry is built once, and each distinct set of operations checked
    for overlaps once: 1,000 hosts of one group share one set (and one ``operations``
    mapping, which nobody may change).
    """
    aliases = sorted(registry.source.dispatch_hosts)
    refuse_root_without_dispatcher(registry, inventory)
    placed = operations_by_host(registry.operations.values(), aliases, inventory)
    built: dict[str, dict[str, Any]] = {}
    sets: dict[tuple[str, ...], tuple[dict[str, Any], bytes]] = {}
    documents = {}
    for alias in aliases:
        mine = placed[alias]
        key = tuple(op.name for op in mine)
        if (shared := sets.get(key)) is None:
            entries = _entries(f"dispatch host {alias!r}", mine, registry.schemas, built)
            shared = sets[key] = (entries, canonical_json(entries))
        documents[alias] = _document(alias, *shared)
    return documents


def refuse_root_without_dispatcher(registry: Registry, inventory: Inventory | None) -> None:
    """A ``run_as`` operation may run only on dispatch hosts, every one of its targets'
    members: on a host without the dispatcher, the account's sudo rule alone would stand
    between a stolen key and root, and sudo matches arguments as one joined string."""
    dispatch = registry.source.dispatch_hosts
    for op in registry.operations.values():
        if op.root is None:
            continue
        hosts = {op.spec.host} if op.spec.host else set()
        for target in op.spec.targets if inventory is not None else ():
            hosts.update(inventory.members(target))  # type: ignore[union-attr]
        outside = sorted(hosts - dispatch)
        if outside:
            shown = ", ".join(outside[:5]) + (" ..." if len(outside) > 5 else "")
            raise ConfigError(
                str(op.file),
                "run_as",
                f"may run on {len(outside)} host(s) without the dispatcher ({shown}): "
                "a root operation runs only where `dispatch = true`",
            )


def group_policy(group: str, registry: Registry, inventory: Inventory) -> dict[str, Any]:
    """The one policy document every member of ``group`` installs (``"host"`` is the group),
    or ConfigError when two members run different operations: one file cannot serve both.

    Its operations, and so each operation's digest, are exactly those of each member's
    own policy: the daemon finds a member that installed it current (daemon/drift.py).
    """
    members = inventory.members(group)
    placed = operations_by_host(registry.operations.values(), members, inventory)
    first = members[0]
    want = {op.name for op in placed[first]}
    for alias in members[1:]:
        got = {op.name for op in placed[alias]}
        if got != want:
            raise ConfigError(
                inventory.origins.get(group, "<config>"),
                f"groups.{group}",
                f"members {first!r} and {alias!r} run different operations "
                f"({first} only: {', '.join(sorted(want - got)) or '-'}; "
                f"{alias} only: {', '.join(sorted(got - want)) or '-'}), so no one policy "
                f"fits both: split the group, or install per host (sshadapter policy ALIAS)",
            )
    entries = _entries(f"the hosts of group {group!r}", placed[first], registry.schemas, {})
    return _document(group, entries, canonical_json(entries))


def operations_by_host(
    operations: Iterable[Operation], aliases: Iterable[str], inventory: Inventory | None
) -> dict[str, list[Operation]]:
    """Each of ``aliases`` -> the operations that may run on it, by name: each operation's
    targets are resolved once (not once per host)."""
    placed: dict[str, list[Operation]] = {alias: [] for alias in aliases}
    for op in sorted(operations, key=lambda op: op.name):
        hosts = {op.spec.host} if op.spec.host else set()
        if inventory is not None:
            for target in op.spec.targets:
                hosts.update(inventory.members(target))
        for alias in hosts:
            if alias in placed:
                placed[alias].append(op)
    return placed


def host_policy(
    alias: str,
    operations: Iterable[Operation],
    schemas: SchemaSet,
    inventory: Inventory | None = None,
) -> dict[str, Any]:
    """The policy document of ``alias``: its operations, checked, and the digest of the whole."""
    mine = operations_by_host(operations, (alias,), inventory)[alias]
    entries = _entries(f"dispatch host {alias!r}", mine, schemas, {})
    return _document(alias, entries, canonical_json(entries))


def _entries(
    where: str,
    mine: list[Operation],
    schemas: SchemaSet,
    built: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The ``operations`` of a policy (``mine`` sorted by name), checked for overlaps;
    ``built`` keeps each operation's entry for the next set that has it."""
    for op in mine:
        if op.name not in built:
            built[op.name] = operation_policy(op)
    entries = {op.name: built[op.name] for op in mine}
    for first, second in combinations(mine, 2):
        _refuse_overlap(where, first, second, entries, schemas)
    return entries


def _document(name: str, entries: dict[str, Any], entries_json: bytes) -> dict[str, Any]:
    """A policy document: ``name`` (a host alias or a group) and the digest of the whole.

    The digest is ``digest(body)``, its canonical JSON spliced from ``entries_json``
    (``canonical_json(entries)``, serialized once per set of operations, not once per
    host: sorted keys put format, host, operations in this order).
    """
    head = canonical_json({"format": POLICY_FORMAT, "host": name})[:-1]
    whole = head + b',"operations":' + entries_json + b"}"
    return {
        "format": POLICY_FORMAT,
        "host": name,
        "operations": entries,
        "digest": "sha256:" + hashlib.sha256(whole).hexdigest(),
    }


def operation_digests(policy: Mapping[str, Any]) -> dict[str, str]:
    """Each operation's digest, as the host's dispatcher reports them."""
    return {name: digest(entry) for name, entry in policy["operations"].items()}


def operation_policy(op: Operation) -> dict[str, Any]:
    """One operation's entry, or ConfigError when the dispatcher could not enforce it."""
    file = str(op.file)
    for status, meaning in op.spec.output.exit_codes.items():
        if int(status) == REFUSED_STATUS:
            raise ConfigError(
                file,
                f"output.exit_codes.{status}",
                f"{REFUSED_STATUS} is the dispatcher's refusal status on a dispatch host "
                f"({', '.join(op.spec.targets) or op.spec.host}); it cannot also mean {meaning!r}",
            )
    argv: list[Any] = []
    for index, element in enumerate(op.argv.elements):
        key = f"argv[{index}]"
        params = [text for is_param, text in element.parts if is_param]
        if index == 0 and (params or not _PROGRAM.fullmatch(element.literal or "")):
            raise ConfigError(
                file, key, "on a dispatch host the program is a literal name or absolute path"
            )
        if len(params) > 1:
            raise ConfigError(
                file, key, "on a dispatch host an argv element holds at most one placeholder"
            )
        argv.append(element.literal if not params else _placeholder(element.parts))
    return {
        "argv": argv,
        "params": {
            name: _param_policy(file, f"params.{name}", schema)
            for name, schema in sorted(op.spec.params.items())
        },
    }


def _placeholder(parts: tuple[tuple[bool, str], ...]) -> dict[str, str]:
    names = [i for i, (is_param, _) in enumerate(parts) if is_param]
    at = names[0]
    prefix = "".join(text for _, text in parts[:at])
    suffix = "".join(text for _, text in parts[at + 1 :])
    element = {"param": parts[at][1]}
    if prefix:
        element["prefix"] = prefix
    if suffix:
        element["suffix"] = suffix
    return element


def _param_policy(file: str, key: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter schema with only the keywords its type uses, in the dispatcher's terms."""
    kind = schema["type"]
    out: dict[str, Any] = {"type": kind}
    for keyword in ("enum", "const"):
        if keyword in schema:
            out[keyword] = schema[keyword]
    if kind == "string":
        if "pattern" in schema:
            try:
                out["pattern"] = translate(schema["pattern"])
            except ValueError as exc:
                raise ConfigError(file, f"{key}.pattern", str(exc)) from exc
        for keyword in ("minLength", "maxLength"):
            if keyword in schema:
                out[keyword] = _count(file, f"{key}.{keyword}", schema[keyword])
        if "format" in schema:
            if schema["format"] != "date-time":
                raise ConfigError(
                    file,
                    f"{key}.format",
                    "the dispatcher checks only format date-time; say the rest in `pattern`",
                )
            out["format"] = "date-time"
    elif kind == "integer":
        out.update(_integer_bounds(file, key, schema))
    return out


def _count(file: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ConfigError(file, key, "must be a whole number")
    return int(value)


def _integer_bounds(file: str, key: str, schema: Mapping[str, Any]) -> dict[str, int]:
    """minimum/exclusiveMinimum/maximum/exclusiveMaximum as exact integer minimum and maximum."""
    low, high = -MAX_EXACT_INTEGER, MAX_EXACT_INTEGER
    for keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"):
        value = schema.get(keyword)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (number and math.isfinite(value)):
            raise ConfigError(file, f"{key}.{keyword}", "must be a finite number")
    if "minimum" in schema:
        low = max(low, math.ceil(schema["minimum"]))
    if "exclusiveMinimum" in schema:
        low = max(low, math.floor(schema["exclusiveMinimum"]) + 1)
    if "maximum" in schema:
        high = min(high, math.floor(schema["maximum"]))
    if "exclusiveMaximum" in schema:
        high = min(high, math.ceil(schema["exclusiveMaximum"]) - 1)
    if low > high:
        raise ConfigError(
            file, key, "no integer within +-2**53 fits these bounds on a dispatch host"
        )
    bounds = {"minimum": low, "maximum": high}
    if "multipleOf" in schema:
        step = schema["multipleOf"]
        if step <= 0 or step != int(step):
            raise ConfigError(
                file, f"{key}.multipleOf", "on a dispatch host a positive whole number"
            )
        bounds["multipleOf"] = int(step)
    return bounds


def _refuse_overlap(
    where: str,
    first: Operation,
    second: Operation,
    entries: Mapping[str, Mapping[str, Any]],
    schemas: SchemaSet,
) -> None:
    """ConfigError when one command could match both operations (the dispatcher refuses it)."""
    one, two = entries[first.name]["argv"], entries[second.name]["argv"]
    if len(one) != len(two):
        return
    for a, b in zip(one, two, strict=True):
        if not _may_meet(a, first, b, second, schemas):
            return
    raise ConfigError(
        str(second.file),
        "argv",
        f"{first.name} and {second.name} could both match one command on {where}, "
        "which the dispatcher refuses as ambiguous: make a literal element differ",
    )


def _may_meet(a: Any, op_a: Operation, b: Any, op_b: Operation, schemas: SchemaSet) -> bool:
    """Whether one argv element could fit both template elements (conservative: yes if unsure)."""
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if isinstance(a, str):
        return _literal_fits(a, b, op_b, schemas)
    if isinstance(b, str):
        return _literal_fits(b, a, op_a, schemas)
    one: tuple[str, str] = (a.get("prefix", ""), a.get("suffix", ""))
    two: tuple[str, str] = (b.get("prefix", ""), b.get("suffix", ""))
    return (one[0].startswith(two[0]) or two[0].startswith(one[0])) and (
        one[1].endswith(two[1]) or two[1].endswith(one[1])
    )


def _literal_fits(text: str, element: Mapping[str, str], op: Operation, schemas: SchemaSet) -> bool:
    prefix, suffix = element.get("prefix", ""), element.get("suffix", "")
    if len(text) < len(prefix) + len(suffix) or not text.startswith(prefix):
        return False
    if not text.endswith(suffix):
        return False
    value: Any = text[len(prefix) : len(text) - len(suffix)]
    schema = op.spec.params[element["param"]]
    if schema["type"] == "integer":
        if not re.fullmatch(r"0|-?[1-9][0-9]{0,19}", value):
            return False
        value = int(value)
    elif schema["type"] == "boolean":
        if value not in ("true", "false"):
            return False
        value = value == "true"
    validator = schemas.compile({"$schema": DRAFT_2020_12, **schema}, file=str(op.file))
    return bool(validator.is_valid(value))
