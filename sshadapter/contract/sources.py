"""The bytes a registry is built from: the command files, the schemas, the dispatch hosts
and the enabled catalog, read once, with a digest that changes whenever any of them does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from sshadapter.catalog import NO_CATALOG, CatalogSource
from sshadapter.contract.commandfile import read_command_bytes
from sshadapter.contract.schemas import read_schema_files
from sshadapter.errors import ConfigError


@dataclass(frozen=True)
class RegistrySource:
    """The bytes a registry is built from, read once: the same bytes build the same registry
    anywhere (the evaluation workers build theirs from it)."""

    commands_dir: Path
    schemas_dir: Path
    commands: Mapping[str, bytes]
    """`<tool>.toml` -> bytes."""
    schemas: Mapping[str, bytes]
    """`<name>.json` -> bytes."""
    dispatch_hosts: frozenset[str] = frozenset()
    """Host aliases behind sshadapter-dispatch (`dispatch = true`): their operations must
    be ones the dispatcher can enforce: ``dispatch.policy.host_policies`` builds their
    policies from the registry (docs/dispatcher.md)."""
    dispatch_groups: frozenset[str] = frozenset()
    """Groups with at least one dispatch host among their members."""
    catalog: CatalogSource = NO_CATALOG
    """The catalog families the configuration enables (sshadapter/catalog/), read once."""

    @classmethod
    def read(
        cls,
        commands_dir: Path,
        schemas_dir: Path,
        dispatch_hosts: Collection[str] = (),
        dispatch_groups: Collection[str] = (),
        catalog: CatalogSource = NO_CATALOG,
    ) -> RegistrySource:
        if not commands_dir.is_dir():
            raise ConfigError(str(commands_dir), "", "commands directory does not exist")
        commands = {p.name: read_command_bytes(p) for p in sorted(commands_dir.glob("*.toml"))}
        schemas = read_schema_files(schemas_dir)
        return cls(
            commands_dir,
            schemas_dir,
            commands,
            schemas,
            frozenset(dispatch_hosts),
            frozenset(dispatch_groups),
            catalog,
        )

    @property
    def digest(self) -> str:
        """sha256 over every file name and content: changes whenever any file does."""
        h = hashlib.sha256()
        for kind, files in (("commands", self.commands), ("schemas", self.schemas)):
            for name, raw in sorted(files.items()):
                h.update(f"{kind}/{name}\0{len(raw)}\0".encode())
                h.update(raw)
        for alias in sorted(self.dispatch_hosts):
            h.update(f"dispatch/{alias}\0".encode())
        for group in sorted(self.dispatch_groups):
            h.update(f"dispatch-group/{group}\0".encode())
        self.catalog.update(h)
        return h.hexdigest()
