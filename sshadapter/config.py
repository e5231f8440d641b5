"""The daemon's configuration: one TOML file, environment overrides, unknown keys refused.

Reference: docs/operations.md "Configuration" and config.example.toml.
``SSHADAPTER_<SECTION>__<KEY>`` environment variables override the file
(``SSHADAPTER_SERVER__MAX_CONCURRENT_CALLS=8``).
Relative paths in ``[paths]`` are resolved against the directory of the config
file, so the same file works from a checkout and from ``/etc/sshadapter/``.
There is deliberately no option to turn host key checking off.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sshadapter.errors import ConfigError

DEFAULT_CONFIG_PATH: Final = Path("/etc/sshadapter/config.toml")

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


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Allow(_Section):
    """Who may call: deny by default, a uid or a group name is enough."""

    uids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    groups: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")], ...] = ()


class ServerSection(_Section):
    socket_path: Path = Path("/run/sshadapter/sshadapter.sock")
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
        if value and value.rsplit(":", 1)[0].strip("[]") not in {"127.0.0.1", "::1", "localhost"}:
            raise ValueError("metrics listen only on loopback (127.0.0.1:PORT or [::1]:PORT)")
        return value


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


class ConfigFile(_Section):
    """What the TOML file may say: checked strictly (its values have real types)."""

    server: ServerSection = ServerSection()
    paths: PathsSection = PathsSection()
    audit: AuditSection = AuditSection()
    metrics: MetricsSection = MetricsSection()
    hosts: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], HostSection] = {}


class Config(BaseSettings, ConfigFile):
    """The whole configuration, environment overrides applied; frozen once loaded.

    Environment values are text, so they are read the lax way (``"8"`` is 8); the
    file itself has passed ``ConfigFile`` strictly before.
    """

    model_config = SettingsConfigDict(
        env_prefix="SSHADAPTER_", env_nested_delimiter="__", extra="forbid", frozen=True
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

    Raises ConfigError naming the file, the key and the reason.
    """
    data: dict[str, Any] = {}
    base = Path.cwd()
    name = str(path) if path else "<defaults>"
    if path is not None:
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(name, "", f"cannot read: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(name, "", f"not valid TOML: {exc}") from exc
        base = path.resolve().parent
    try:
        ConfigFile.model_validate_json(orjson.dumps(data), strict=True)
        config = Config(**data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ConfigError(name, key, _pydantic_reason(first)) from exc
    paths = PathsSection(commands=base / config.paths.commands, schemas=base / config.paths.schemas)
    return config.model_copy(update={"paths": paths}), base


def _pydantic_reason(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "required key is missing"
    return str(error["msg"])
