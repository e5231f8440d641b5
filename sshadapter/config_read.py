"""The configuration's raw side: a TOML file read with a size cap, ``[host_defaults]``
written into the hosts before validation, and every mistake worded as a ConfigError
naming the file (or the environment variable), the key and the reason.

pydantic's, pydantic-settings' and tomllib's errors are translated here and nowhere
else; sshadapter/config.py holds the models they are checked against.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_settings import SettingsError

from sshadapter.bounded_read import read_bounded
from sshadapter.errors import ConfigError
from sshadapter.sections import CATALOG_FAMILIES

ENV_PREFIX: Final = "SSHADAPTER_"
ENV_NESTING: Final = "__"


def read_toml(path: Path, max_bytes: int) -> dict[str, Any]:
    raw = read_bounded(path, max_bytes)
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "", f"not UTF-8 (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "", f"not valid TOML: {exc}") from exc


def with_host_defaults(data: dict[str, Any], outer: Any) -> dict[str, Any]:
    """``data`` with ``[host_defaults]`` (over ``outer``, the config file's) written into each
    of its hosts: a key a host sets wins; labels are merged, the host's own winning.

    Anything not a table is left for validation to name.
    """
    mine = data.get("host_defaults", {})
    hosts = data.get("hosts")
    if not isinstance(mine, dict) or not isinstance(outer, dict) or not isinstance(hosts, dict):
        return data
    defaults = {**outer, **mine}
    if isinstance(outer.get("labels"), dict) and isinstance(mine.get("labels"), dict):
        defaults["labels"] = {**outer["labels"], **mine["labels"]}
    if not defaults:
        return data
    merged = {}
    for alias, host in hosts.items():
        if not isinstance(host, dict):
            merged[alias] = host
            continue
        entry = {**defaults, **host}
        if isinstance(defaults.get("labels"), dict) and isinstance(host.get("labels"), dict):
            entry["labels"] = {**defaults["labels"], **host["labels"]}
        merged[alias] = entry
    return {**data, "hosts": merged}


def validation_error(name: str, exc: ValidationError) -> ConfigError:
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    return ConfigError(name, key, _pydantic_reason(first))


def _pydantic_reason(error: Any) -> str:
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden" and len(loc) == 2 and loc[0] == "catalog":
        return f"no family {loc[1]!r}; the families are {', '.join(CATALOG_FAMILIES)}"
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "required key is missing"
    return str(error["msg"]).removeprefix("Value error, ")


def _variables() -> dict[str, str]:
    """Our environment variables by upper-case name (pydantic-settings ignores case)."""
    return {k.upper(): k for k in os.environ if k.upper().startswith(ENV_PREFIX)}


def variable_of(loc: Sequence[str]) -> str:
    """The variable that set ``loc`` or a table around it, as ``$NAME``; empty if none did."""
    names = _variables()
    for end in range(len(loc), 0, -1):
        wanted = ENV_PREFIX + ENV_NESTING.join(loc[:end]).upper()
        if wanted in names:
            return f"${names[wanted]}"
    return ""


def unparsed_variable(exc: SettingsError, settings: type[BaseModel]) -> ConfigError:
    """The variable whose value pydantic-settings could not read as JSON into ``settings``,
    and why.

    A table or a list (``SSHADAPTER_SERVER__ALLOW``, ``..._ALLOW__UIDS``) is given as
    JSON; pydantic-settings names only the top-level field, so the variables under it
    are tried here the same way.
    """
    found = re.search(r'field "([^"]+)"', str(exc))
    field = found[1].upper() if found else ""
    for upper, name in sorted(_variables().items()):
        parts = upper.removeprefix(ENV_PREFIX).lower().split(ENV_NESTING)
        if parts[0] != field.lower() or not _wants_json(settings, parts):
            continue
        try:
            json.loads(os.environ[name])
        except ValueError as error:
            key = ".".join(parts)
            return ConfigError(f"${name}", key, f"not JSON, which a table or list needs: {error}")
    return ConfigError("the environment", field.lower(), f"cannot be read: {exc}")


def _wants_json(settings: type[BaseModel], parts: Sequence[str]) -> bool:
    """Whether the key at ``parts`` of ``settings`` is a table or a list: its environment
    value is JSON."""
    kind: Any = settings
    for part in parts:
        kind = _unwrapped(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(part)
            if field is None:
                return False
            kind = field.annotation
        elif get_origin(kind) is dict:
            kind = get_args(kind)[1]
        else:
            return False
    kind = _unwrapped(kind)
    is_model = isinstance(kind, type) and issubclass(kind, BaseModel)
    return is_model or get_origin(kind) in (dict, tuple, list)


def _unwrapped(kind: Any) -> Any:
    """``kind`` without ``Annotated`` and without ``None`` in a union."""
    while get_origin(kind) in (Annotated, Union, types.UnionType):
        kind = next(a for a in get_args(kind) if a is not type(None))
    return kind
