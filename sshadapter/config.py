"""The daemon's configuration: one TOML file, environment overrides, unknown keys refused.

Reference: docs/operations.md "Configuration" and config.example.toml.
``SSHADAPTER_<SECTION>__<KEY>`` environment variables override the file
(``SSHADAPTER_SERVER__MAX_CONCURRENT_CALLS=8``).
Relative paths in ``[paths]`` are resolved against the directory of the config
file, so the same file works from a checkout and from ``/etc/sshadapter/``.
There is deliberately no option to turn host key checking off.

Beside it: sections.py (the tables that read no environment: the base every section
shares, ``Allow`` and the ``[catalog]`` section, importable by the contract without
pydantic-settings) and config_read.py (the raw file and the wording of every mistake).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from sshadapter.config_read import (
    ENV_NESTING,
    ENV_PREFIX,
    read_toml,
    unparsed_variable,
    validation_error,
    variable_of,
    with_host_defaults,
)
from sshadapter.errors import ConfigError

# Allow and TARGET_NAME are the configuration's words: read from here like its sections.
from sshadapter.sections import TARGET_NAME as TARGET_NAME
from sshadapter.sections import Allow as Allow
from sshadapter.sections import CatalogSection, Section

DEFAULT_CONFIG_PATH: Final = Path("/etc/sshadapter/config.toml")
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
# Hosts of all fan-outs in flight at once: a ceiling, not the bound. The bound is the rate
# at which hosts start, steered by the event loop's lag (sshadapter/pacing.py): hosts in
# flight then grow with the round trip (at 100 ms, ~1,000 hosts/s x ~0.3 s each). The old
# count of 16 made a 512-host fan-out at 100 ms RTT 3.5x raw asyncssh (tests/bench/README.md
# "bench_fleet.py"). Half of [pool] max_connections_total: a host connected for a fan-out
# but not yet running is an idle connection, and at the cap another host's connect closes
# the least recently used idle one; with half the connections left to hosts already done,
# that is never one about to run (at 512 and 1,024, a 1,000-host fan-out lost hosts so).
DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT: Final = 256
DEFAULT_DRAIN_TIMEOUT_SECONDS: Final = 30.0  # SIGTERM waits this long for in-flight calls
DEFAULT_QUARANTINE_MAX_BYTES: Final = 256 * 1024 * 1024  # rejected outputs kept, oldest removed
DEFAULT_CONNECT_TIMEOUT_SECONDS: Final = 10.0  # TCP + SSH handshake to one host
DEFAULT_HOST_MAX_CONNECTIONS: Final = 6  # 6 x 6 channels >= 32 calls; opened one at a time
DEFAULT_MAX_CHANNELS_PER_CONNECTION: Final = 6  # below sshd's MaxSessions 10, which frees late
DEFAULT_KEEPALIVE_SECONDS: Final = 30.0  # notice a dead connection before a call does
# An inventory file holds hosts and groups written or imported for review: ~150 bytes a
# host, so tens of thousands of hosts; a larger file is a mistake, not an inventory.
MAX_INVENTORY_FILE_BYTES: Final = 8 * 1024 * 1024
MAX_INVENTORY_FILES: Final = 1000  # files in the inventory directory; more is a mistake
LABEL_WORD: Final = r"^[a-z][a-z0-9_-]{0,62}$"  # label keys and values: words, never patterns
VIA_NAME: Final = r"^([a-z][a-z0-9_-]{0,62})?$"  # a host alias, or "" for a direct connection
MAX_LABELS: Final = 32  # per host: labels select groups at load, they are not a database
# SSH connections open at once, all hosts together. Each costs one descriptor and ~0.25 MiB
# (measured: 105 MiB RSS with 128 connections, 75 MiB with 16): 512 stay near 200 MB and,
# with max_connections agent sockets, under systemd's default soft limit of 1024 files.
DEFAULT_MAX_CONNECTIONS_TOTAL: Final = 512
# A connection with no call for this long is closed: it holds an sshd process on its host;
# reopening it costs one handshake (~15 ms on a LAN).
DEFAULT_IDLE_CLOSE_SECONDS: Final = 300.0
# SSH handshakes in flight, all hosts together: a ceiling (max_connections_total's 512), not
# the bound. The bound is the rate at which handshakes start, steered by the loop's lag
# (sshadapter/pacing.py), so a handshake never queues long enough to hit its timeout; the
# old count of 32 made a cold 512-host fan-out at 100 ms RTT 4.8x raw asyncssh.
DEFAULT_CONNECT_CONCURRENCY: Final = 512
# Calls waiting for a person's approval at once (docs/protocol.md "Approval"): a person
# reviews a handful; more is an agent looping on a refused change, and each waiting call
# holds its agent connection. Past it: OVERLOADED (approvals_full) without asking anyone.
DEFAULT_MAX_PENDING_APPROVALS: Final = 16
MAX_PENDING_APPROVALS: Final = 1024


class ServerSection(Section):
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
    max_fanout_hosts_in_flight: Annotated[int, Field(ge=1, le=4096)] = (
        DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT
    )


class PathsSection(Section):
    commands: Path = Path("commands")
    schemas: Path = Path("schemas")
    inventory: str = ""
    """A directory of ``*.toml`` inventory files (hosts and groups); empty: none."""


class AuditSection(Section):
    path: Path = Path("/var/log/sshadapter/audit.jsonl")
    fsync: Literal["always", "batch", "never"] = "always"
    quarantine_dir: Path = Path("/var/lib/sshadapter/quarantine")
    quarantine_max_bytes: Annotated[int, Field(ge=0)] = DEFAULT_QUARANTINE_MAX_BYTES


class MetricsSection(Section):
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


class LoggingSection(Section):
    """The daemon's log lines on stderr (docs/operations.md "Logs"); read at start."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


class HostSection(Section):
    @model_validator(mode="after")
    def _one_certified_key(self) -> HostSection:
        if self.certificate and self.credential_certificate:
            raise ValueError("certificate and credential_certificate: give one")
        if (self.certificate or self.credential_certificate) and (
            len(self.client_keys) + bool(self.credential) != 1
        ):
            raise ValueError(
                "a certificate certifies one key: give one client_keys file or a credential"
            )
        return self

    address: Annotated[str, Field(min_length=1, max_length=253)]
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
    client_keys: tuple[Path, ...] = ()
    credential: str = ""  # a systemd credential name, read from $CREDENTIALS_DIRECTORY
    # An OpenSSH user certificate for the one key (docs/operations.md "User certificates"):
    # a file, or a systemd credential; then only the certificate is offered.
    certificate: str = ""  # a file; empty: none (TOML has no null for [host_defaults])
    credential_certificate: str = ""
    known_hosts: Path
    connect_timeout_seconds: Annotated[float, Field(gt=0)] = DEFAULT_CONNECT_TIMEOUT_SECONDS
    max_connections: Annotated[int, Field(ge=1, le=64)] = DEFAULT_HOST_MAX_CONNECTIONS
    max_channels_per_connection: Annotated[int, Field(ge=1, le=9)] = (
        DEFAULT_MAX_CHANNELS_PER_CONNECTION
    )
    keepalive_seconds: Annotated[float, Field(gt=0)] = DEFAULT_KEEPALIVE_SECONDS
    # The host runs sshadapter-dispatch as the key's forced command (docs/dispatcher.md).
    dispatch: bool = False
    # Reached through this configured host (a jump host: docs/operations.md "Bastions");
    # "" connects directly. Chains are checked at load (sshadapter/inventory.py).
    via: Annotated[str, Field(pattern=VIA_NAME)] = ""
    labels: Annotated[
        dict[
            Annotated[str, Field(pattern=LABEL_WORD)],
            Annotated[str, Field(pattern=LABEL_WORD)],
        ],
        Field(max_length=MAX_LABELS),
    ] = {}


def _optional(field: Any) -> Any:
    """The field's type and constraints, None allowed (for [host_defaults])."""
    kind = field.annotation
    if field.metadata:
        kind = Annotated[(kind, *field.metadata)]
    return kind | None


# `[host_defaults]`: every HostSection key, none required; a host inherits each key it does
# not set (labels: merged, the host's own win).
HostDefaults: Final[type[Section]] = create_model(  # type: ignore[call-overload]
    "HostDefaults",
    __base__=Section,
    **{
        name: (_optional(field), None)
        for name, field in HostSection.model_fields.items()
        if name != "address"  # one address for many hosts is a copy slip, not a default
    },
)


class GroupSection(Section):
    """A named, closed set of hosts, resolved at load (sshadapter/inventory.py)."""

    match: dict[
        Annotated[str, Field(pattern=LABEL_WORD)], Annotated[str, Field(pattern=LABEL_WORD)]
    ] = {}
    """Every host whose labels include all of these (equality, AND)."""
    members: tuple[Annotated[str, Field(pattern=TARGET_NAME)], ...] = ()
    """Host aliases or other groups, added."""
    exclude: tuple[Annotated[str, Field(pattern=TARGET_NAME)], ...] = ()
    """Host aliases or other groups, taken away last."""


class Grant(Section):
    """Who (uids, unix groups) may run which tools on which targets: deny by default."""

    uids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    groups: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")], ...] = ()
    tools: tuple[Annotated[str, Field(pattern=r"^([a-z][a-z0-9_]{1,62}|\*)$")], ...] = Field(
        min_length=1
    )
    targets: tuple[Annotated[str, Field(pattern=TARGET_NAME)], ...] = Field(min_length=1)


class ApprovalsSection(Section):
    """Who may approve or deny calls that wait for a person (docs/protocol.md "Approval")."""

    uids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    groups: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")], ...] = ()
    max_pending: Annotated[int, Field(ge=1, le=MAX_PENDING_APPROVALS)] = (
        DEFAULT_MAX_PENDING_APPROVALS
    )


class PoolSection(Section):
    """The SSH connections of all hosts together (docs/operations.md "SSH")."""

    max_connections_total: Annotated[int, Field(ge=1)] = DEFAULT_MAX_CONNECTIONS_TOTAL
    idle_close_seconds: Annotated[float, Field(gt=0)] = DEFAULT_IDLE_CLOSE_SECONDS
    connect_concurrency: Annotated[int, Field(ge=1)] = DEFAULT_CONNECT_CONCURRENCY
    # Connected at start (through connect_concurrency); every other host on first use.
    warm: tuple[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], ...] = ()


class ConfigFile(Section):
    """What the TOML file may say: checked strictly (its values have real types)."""

    server: ServerSection = ServerSection()
    paths: PathsSection = PathsSection()
    audit: AuditSection = AuditSection()
    metrics: MetricsSection = MetricsSection()
    logging: LoggingSection = LoggingSection()
    pool: PoolSection = PoolSection()
    approvals: ApprovalsSection = ApprovalsSection()
    catalog: CatalogSection = CatalogSection()
    host_defaults: HostDefaults = HostDefaults()  # type: ignore[valid-type]
    hosts: dict[Annotated[str, Field(pattern=TARGET_NAME)], HostSection] = {}
    groups: dict[Annotated[str, Field(pattern=TARGET_NAME)], GroupSection] = {}
    grants: tuple[Grant, ...] = ()


class Config(BaseSettings, ConfigFile):
    """The whole configuration, environment overrides applied; frozen once loaded.

    Environment values are text, so they are read the lax way (``"8"`` is 8); the
    file itself has passed ``ConfigFile`` strictly before.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTING, extra="forbid", frozen=True
    )

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def origins(self) -> Mapping[str, str]:
        """The file that defined each host alias and group name (errors name it)."""
        return self._origins

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
    """Load ``path`` (or the defaults when None), then its inventory directory, and return
    the whole configuration with its base directory.

    The one validation ``check``, ``serve`` and every other command use. Raises
    ConfigError naming the file (or the environment variable), the key and the reason.
    Hosts and groups of the inventory files join the file's own (a duplicate name is an
    error naming both files); ``Config.origins`` says which file defined each.
    """
    data: dict[str, Any] = {}
    base = Path.cwd()
    name = str(path) if path else "<defaults>"
    if path is not None:
        data = read_toml(path, MAX_CONFIG_BYTES)
        base = path.resolve().parent
    data = with_host_defaults(data, {})
    try:
        ConfigFile.model_validate_json(orjson.dumps(data), strict=True)
    except ValidationError as exc:
        raise validation_error(name, exc) from exc
    try:  # the file is valid: what fails now came from the environment
        config = Config(**data)
    except ValidationError as exc:
        loc = [str(p) for p in exc.errors()[0]["loc"]]
        raise validation_error(variable_of(loc) or "the environment", exc) from exc
    except SettingsError as exc:  # a table's variable that is not JSON
        raise unparsed_variable(exc, Config) from exc
    inventory = base / config.paths.inventory if config.paths.inventory else None
    paths = PathsSection(
        commands=base / config.paths.commands,
        schemas=base / config.paths.schemas,
        inventory=str(inventory or ""),
    )
    origins = {target: name for target in (*config.hosts, *config.groups)}
    hosts, groups = dict(config.hosts), dict(config.groups)
    if inventory is not None:
        defaults = data.get("host_defaults", {})
        for file in _inventory_files(inventory, name):
            part = _read_inventory_file(file, defaults)
            for kind, found in (("hosts", part.hosts), ("groups", part.groups)):
                for target in found:
                    if target in origins:
                        raise ConfigError(
                            str(file),
                            f"{kind}.{target}",
                            f"{target!r} is already defined in {origins[target]}",
                        )
                    origins[target] = str(file)
            hosts.update(part.hosts)
            groups.update(part.groups)
    loaded = config.model_copy(update={"paths": paths, "hosts": hosts, "groups": groups})
    loaded._origins = origins
    return loaded, base


class InventoryFile(Section):
    """What one file of the inventory directory may say."""

    host_defaults: HostDefaults = HostDefaults()  # type: ignore[valid-type]
    hosts: dict[Annotated[str, Field(pattern=TARGET_NAME)], HostSection] = {}
    groups: dict[Annotated[str, Field(pattern=TARGET_NAME)], GroupSection] = {}


def _inventory_files(directory: Path, config_name: str) -> list[Path]:
    """The ``*.toml`` files of the inventory directory, sorted, or ConfigError."""
    if not directory.is_dir():
        raise ConfigError(config_name, "paths.inventory", f"{directory} is not a directory")
    files = sorted(directory.glob("*.toml"))
    if len(files) > MAX_INVENTORY_FILES:
        raise ConfigError(
            str(directory), "", f"{len(files)} files: more than {MAX_INVENTORY_FILES}"
        )
    return files


def _read_inventory_file(path: Path, defaults: Any) -> InventoryFile:
    data = with_host_defaults(read_toml(path, MAX_INVENTORY_FILE_BYTES), defaults)
    try:
        return InventoryFile.model_validate_json(orjson.dumps(data), strict=True)
    except ValidationError as exc:
        raise validation_error(str(path), exc) from exc
