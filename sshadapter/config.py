"""The daemon's configuration: one TOML file, environment overrides, unknown keys refused.

Reference: docs/operations.md "Configuration" and config.example.toml.
``SSHADAPTER_<SECTION>__<KEY>`` environment variables override the file
(``SSHADAPTER_SERVER__MAX_CONCURRENT_CALLS=8``).
Relative paths in ``[paths]`` are resolved against the directory of the config
file, so the same file works from a checkout and from ``/etc/sshadapter/``.
There is deliberately no option to turn host key checking off.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from sshadapter.bounded_read import read_bounded
from sshadapter.errors import ConfigError

DEFAULT_CONFIG_PATH: Final = Path("/etc/sshadapter/config.toml")
ENV_PREFIX: Final = "SSHADAPTER_"
ENV_NESTING: Final = "__"
# A few sections and hosts written by hand: a larger file is a mistake, not a config.
MAX_CONFIG_BYTES: Final = 1024 * 1024
# The kernel's sockaddr_un holds 108 bytes with the terminating NUL: a longer socket_path
# cannot be bound (the daemon would fail at start, after `check` accepted it).
MAX_SOCKET_PATH_BYTES: Final = 107
# `[metrics] listen`: a loopback host and a TCP port, the only forms the listener takes.
METRICS_LISTEN: Final = re.compile(r"(127\.0\.0\.1|localhost|\[::1\]):([0-9]{1,5})")
MAX_PORT: Final = 65535

# Bounds, each with the reason for its default.
DEFAULT_MAX_REQUEST_BYTES: Final = 64 * 1024  # a request is a tool name and a few arguments
DEFAULT_MAX_CONNECTIONS: Final = 256  # agents on one machine; each costs one file descriptor
DEFAULT_MAX_CONCURRENT_CALLS: Final = 32  # ~2 cores share client crypto and sshd; more only queues
DEFAULT_MAX_QUEUE: Final = 64  # beyond this a caller waits too long: answer OVERLOADED at once
DEFAULT_IDLE_TIMEOUT_SECONDS: Final = 60.0  # an idle agent connection is closed after this
DEFAULT_READ_TIMEOUT_SECONDS: Final = 10.0  # a client that stalls mid-line is dropped
# A client that does not take its answer is dropped after this: its buffered response is
# released. Generous: at 1 MB/s a client reads the largest answer (16 MiB) in 17 s.
DEFAULT_WRITE_TIMEOUT_SECONDS: Final = 30.0
# Processes that judge outputs over 64 KiB off the event loop (0: judge them in the loop).
# One keeps the loop and its small calls responsive on two cores; each costs ~60 MB of
# memory. (Workers keep the daemon's CPU priority: see offload.py.)
DEFAULT_EVALUATION_WORKERS: Final = 1
DEFAULT_DRAIN_TIMEOUT_SECONDS: Final = 30.0  # SIGTERM waits this long for in-flight calls
DEFAULT_QUARANTINE_MAX_BYTES: Final = 256 * 1024 * 1024  # rejected outputs kept, oldest removed
DEFAULT_CONNECT_TIMEOUT_SECONDS: Final = 10.0  # TCP + SSH handshake to one host
DEFAULT_HOST_MAX_CONNECTIONS: Final = 6  # 6 x 6 channels >= 32 calls; opened one at a time
DEFAULT_MAX_CHANNELS_PER_CONNECTION: Final = 6  # below sshd's MaxSessions 10, which frees late
DEFAULT_KEEPALIVE_SECONDS: Final = 30.0  # notice a dead connection before a call does
# SSH connections open at once, all hosts together. Each costs one descriptor and ~0.25 MiB
# (measured: 105 MiB RSS with 128 connections, 75 MiB with 16): 512 stay near 200 MB and,
# with max_connections agent sockets, under systemd's default soft limit of 1024 files.
DEFAULT_MAX_CONNECTIONS_TOTAL: Final = 512
# A connection with no call for this long is closed: it holds an sshd process on its host;
# reopening it costs one handshake (~15 ms on a LAN).
DEFAULT_IDLE_CLOSE_SECONDS: Final = 300.0
# SSH handshakes in flight, all hosts together: key exchange is CPU on both ends, so on two
# cores more at once only queue, and 1,000 at once would each hit its connect timeout.
DEFAULT_CONNECT_CONCURRENCY: Final = 32


class _Section(BaseModel):
    # No inf or nan (TOML has both): a timeout that never ends is no timeout.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Allow(_Section):
    """Who may call: deny by default, a uid or a group name is enough."""

    uids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    groups: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")], ...] = ()


class ServerSection(_Section):
    socket_path: Path = Path("/run/sshadapter/sshadapter.sock")

    @field_validator("socket_path")
    @classmethod
    def _bindable(cls, value: Path) -> Path:
        if len(os.fsencode(value)) > MAX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"longer than {MAX_SOCKET_PATH_BYTES} bytes: a Unix socket cannot be bound there"
            )
        return value

    socket_mode: Annotated[str, Field(pattern=r"^0?[0-7]{3}$")] = "0660"
    socket_group: str = ""
    allow: Allow = Allow()
    max_request_bytes: Annotated[int, Field(ge=256, le=16 * 1024 * 1024)] = (
        DEFAULT_MAX_REQUEST_BYTES
    )
    max_connections: Annotated[int, Field(ge=1)] = DEFAULT_MAX_CONNECTIONS
    max_concurrent_calls: Annotated[int, Field(ge=1)] = DEFAULT_MAX_CONCURRENT_CALLS
    max_queue: Annotated[int, Field(ge=0)] = DEFAULT_MAX_QUEUE
    idle_timeout_seconds: Annotated[float, Field(gt=0)] = DEFAULT_IDLE_TIMEOUT_SECONDS
    read_timeout_seconds: Annotated[float, Field(gt=0)] = DEFAULT_READ_TIMEOUT_SECONDS
    write_timeout_seconds: Annotated[float, Field(gt=0)] = DEFAULT_WRITE_TIMEOUT_SECONDS
    drain_timeout_seconds: Annotated[float, Field(gt=0)] = DEFAULT_DRAIN_TIMEOUT_SECONDS
    evaluation_workers: Annotated[int, Field(ge=0, le=64)] = DEFAULT_EVALUATION_WORKERS


class PathsSection(_Section):
    commands: Path = Path("commands")
    schemas: Path = Path("schemas")


class AuditSection(_Section):
    path: Path = Path("/var/log/sshadapter/audit.jsonl")
    fsync: Literal["always", "batch", "never"] = "always"
    quarantine_dir: Path = Path("/var/lib/sshadapter/quarantine")
    quarantine_max_bytes: Annotated[int, Field(ge=0)] = DEFAULT_QUARANTINE_MAX_BYTES


class MetricsSection(_Section):
    listen: str = ""  # "127.0.0.1:9464"; empty: no metrics listener

    @field_validator("listen")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        if not value:
            return value
        found = METRICS_LISTEN.fullmatch(value)
        if found is None:
            raise ValueError(
                "metrics listen only on loopback, with a port "
                "(127.0.0.1:PORT, [::1]:PORT or localhost:PORT)"
            )
        if not 1 <= int(found[2]) <= MAX_PORT:
            raise ValueError(f"port {found[2]} is not a TCP port 1-{MAX_PORT}")
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) of the listener, None for none; checked by the validator."""
        found = METRICS_LISTEN.fullmatch(self.listen)
        return None if found is None else (found[1].strip("[]"), int(found[2]))


class HostSection(_Section):
    address: Annotated[str, Field(min_length=1, max_length=253)]
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
    client_keys: tuple[Path, ...] = ()
    credential: str = ""  # a systemd credential name, read from $CREDENTIALS_DIRECTORY
    known_hosts: Path
    connect_timeout_seconds: Annotated[float, Field(gt=0)] = DEFAULT_CONNECT_TIMEOUT_SECONDS
    max_connections: Annotated[int, Field(ge=1, le=64)] = DEFAULT_HOST_MAX_CONNECTIONS
    max_channels_per_connection: Annotated[int, Field(ge=1, le=9)] = (
        DEFAULT_MAX_CHANNELS_PER_CONNECTION
    )
    keepalive_seconds: Annotated[float, Field(gt=0)] = DEFAULT_KEEPALIVE_SECONDS
    # The host runs sshadapter-dispatch as the key's forced command (docs/dispatcher.md).
    dispatch: bool = False


class PoolSection(_Section):
    """The SSH connections of all hosts together (docs/operations.md "SSH")."""

    max_connections_total: Annotated[int, Field(ge=1)] = DEFAULT_MAX_CONNECTIONS_TOTAL
    idle_close_seconds: Annotated[float, Field(gt=0)] = DEFAULT_IDLE_CLOSE_SECONDS
    connect_concurrency: Annotated[int, Field(ge=1)] = DEFAULT_CONNECT_CONCURRENCY
    # Connected at start (through connect_concurrency); every other host on first use.
    warm: tuple[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], ...] = ()


class ConfigFile(_Section):
    """What the TOML file may say: checked strictly (its values have real types)."""

    server: ServerSection = ServerSection()
    paths: PathsSection = PathsSection()
    audit: AuditSection = AuditSection()
    metrics: MetricsSection = MetricsSection()
    pool: PoolSection = PoolSection()
    hosts: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], HostSection] = {}


class Config(BaseSettings, ConfigFile):
    """The whole configuration, environment overrides applied; frozen once loaded.

    Environment values are text, so they are read the lax way (``"8"`` is 8); the
    file itself has passed ``ConfigFile`` strictly before.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTING, extra="forbid", frozen=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first: it overrides the file, which arrives as init arguments.
        return (env_settings, init_settings)


def load_config(path: Path | None) -> tuple[Config, Path]:
    """Load ``path`` (or the defaults when None) and return it with its base directory.

    The one validation ``check``, ``serve`` and every other command use. Raises
    ConfigError naming the file (or the environment variable), the key and the reason.
    """
    data: dict[str, Any] = {}
    base = Path.cwd()
    name = str(path) if path else "<defaults>"
    if path is not None:
        raw = read_bounded(path, MAX_CONFIG_BYTES)
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(name, "", f"not UTF-8 (byte {exc.start})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(name, "", f"not valid TOML: {exc}") from exc
        base = path.resolve().parent
    try:
        ConfigFile.model_validate_json(orjson.dumps(data), strict=True)
    except ValidationError as exc:
        raise _validation_error(name, exc) from exc
    try:  # the file is valid: what fails now came from the environment
        config = Config(**data)
    except ValidationError as exc:
        loc = [str(p) for p in exc.errors()[0]["loc"]]
        raise _validation_error(_variable_of(loc) or "the environment", exc) from exc
    except SettingsError as exc:  # a table's variable that is not JSON
        raise _unparsed_variable(exc) from exc
    paths = PathsSection(commands=base / config.paths.commands, schemas=base / config.paths.schemas)
    return config.model_copy(update={"paths": paths}), base


def _validation_error(name: str, exc: ValidationError) -> ConfigError:
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    return ConfigError(name, key, _pydantic_reason(first))


def _pydantic_reason(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "required key is missing"
    return str(error["msg"]).removeprefix("Value error, ")


def _variables() -> dict[str, str]:
    """Our environment variables by upper-case name (pydantic-settings ignores case)."""
    return {k.upper(): k for k in os.environ if k.upper().startswith(ENV_PREFIX)}


def _variable_of(loc: Sequence[str]) -> str:
    """The variable that set ``loc`` or a table around it, as ``$NAME``; empty if none did."""
    names = _variables()
    for end in range(len(loc), 0, -1):
        wanted = ENV_PREFIX + ENV_NESTING.join(loc[:end]).upper()
        if wanted in names:
            return f"${names[wanted]}"
    return ""


def _unparsed_variable(exc: SettingsError) -> ConfigError:
    """The variable whose value pydantic-settings could not read as JSON, and why.

    A table or a list (``SSHADAPTER_SERVER__ALLOW``, ``..._ALLOW__UIDS``) is given as
    JSON; pydantic-settings names only the top-level field, so the variables under it
    are tried here the same way.
    """
    found = re.search(r'field "([^"]+)"', str(exc))
    field = found[1].upper() if found else ""
    for upper, name in sorted(_variables().items()):
        parts = upper.removeprefix(ENV_PREFIX).lower().split(ENV_NESTING)
        if parts[0] != field.lower() or not _wants_json(parts):
            continue
        try:
            json.loads(os.environ[name])
        except ValueError as error:
            key = ".".join(parts)
            return ConfigError(f"${name}", key, f"not JSON, which a table or list needs: {error}")
    return ConfigError("the environment", field.lower(), f"cannot be read: {exc}")


def _wants_json(parts: Sequence[str]) -> bool:
    """Whether the key at ``parts`` is a table or a list: its environment value is JSON."""
    kind: Any = Config
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
