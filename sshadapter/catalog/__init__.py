"""The shipped catalog: command files an operator switches on by family, never copies.

Reference: docs/operations.md "Switching the catalog on" and docs/catalog.md.
``sshadapter/catalog/<family>/`` holds each family's command files and fixtures,
``sshadapter/catalog/schemas/`` their schemas (package data, shipped in the wheel).
``[catalog] families`` in the config names the families that load; ``read_catalog``
reads their files with what the config replaces in each (``[catalog.<family>]``:
targets, allow; the closed sets an operator lists: units for the actions, certificate
paths for cert_expiry), and the registry loads them beside the operator's own
commands/, one loading path for both.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from sshadapter.bounded_read import read_bounded
from sshadapter.errors import ConfigError
from sshadapter.sections import MUTATING_FAMILY, CatalogFamily, CatalogSection

CATALOG_DIR: Final = Path(__file__).resolve().parent
SCHEMAS_DIR: Final = CATALOG_DIR / "schemas"
# A command file is one operation written by hand (commandfile.MAX_COMMAND_FILE_BYTES).
MAX_CATALOG_FILE_BYTES: Final = 256 * 1024
MAX_CATALOG_SCHEMA_BYTES: Final = 1024 * 1024  # as schemas.MAX_SCHEMA_BYTES

# Parameters whose closed set the operator lists in the config: (family, parameter) ->
# the key of [catalog.<family>] whose list becomes the parameter's enum. Nothing an agent
# sends can name a unit or a file the operator did not list.
LISTED_PARAMETERS: Final = {
    (MUTATING_FAMILY, "unit"): "units",
    ("maintenance", "path"): "certificate_paths",
}


@dataclass(frozen=True)
class CatalogFile:
    """One enabled catalog command file and what the config replaces in it."""

    family: str
    name: str
    """``<tool>.toml``."""
    raw: bytes
    overrides: Mapping[str, Any]
    """Top-level keys replaced (``targets``, ``allow``) and ``params.<name>.enum``: plain
    JSON values, so the source pickles for the evaluation workers."""

    @property
    def path(self) -> Path:
        return CATALOG_DIR / self.family / self.name


@dataclass(frozen=True)
class CatalogSource:
    """The enabled part of the catalog, read once (part of ``RegistrySource``)."""

    config_file: str = "<config>"
    """The configuration that enabled it: errors about its keys name it."""
    files: tuple[CatalogFile, ...] = ()
    schemas: Mapping[str, bytes] = field(default_factory=dict)
    """`<name>.json` -> bytes, of sshadapter/catalog/schemas/ (empty: no family enabled)."""

    def update(self, digest: Any) -> None:
        """Feed every file, schema and override into ``digest`` (a hashlib object)."""
        for entry in self.files:
            digest.update(f"catalog/{entry.family}/{entry.name}\0{len(entry.raw)}\0".encode())
            digest.update(entry.raw)
            digest.update(orjson.dumps(entry.overrides, option=orjson.OPT_SORT_KEYS))
        for name, raw in sorted(self.schemas.items()):
            digest.update(f"catalog-schemas/{name}\0{len(raw)}\0".encode())
            digest.update(raw)


NO_CATALOG: Final = CatalogSource()
"""No family enabled: what a registry without a configuration loads."""


def read_catalog(section: CatalogSection, config_file: str) -> CatalogSource:
    """The enabled families' files with their overrides, or ConfigError (from the caller's
    registry) naming the config key: an excluded name no family has, an empty closed set."""
    enabled = section.enabled
    if not enabled:
        return CatalogSource(config_file)
    files = []
    for family in enabled:
        settings = section.family(family)
        found = sorted((CATALOG_DIR / family).glob("*.toml"))
        for name in settings.exclude:
            if not any(path.stem == name for path in found):
                raise ConfigError(
                    config_file, f"catalog.{family}.exclude", f"{family} has no operation {name!r}"
                )
        if family == MUTATING_FAMILY and settings.targets is None:
            raise ConfigError(
                config_file,
                f"catalog.{family}.targets",
                "required: the hosts or groups an action may change, named by you "
                "(an action never runs on every host by default)",
            )
        for path in found:
            if path.stem in settings.exclude:
                continue
            overrides: dict[str, Any] = {}
            if settings.targets is not None:
                overrides["targets"] = list(settings.targets)
            if settings.allow is not None:
                overrides["allow"] = settings.allow.model_dump(mode="json")
            raw = read_bounded(path, MAX_CATALOG_FILE_BYTES)
            params = _listed(family, path, raw, settings, config_file)
            if params:
                overrides["params"] = params
            files.append(CatalogFile(family, path.name, raw, overrides))
    schemas = {
        path.name: read_bounded(path, MAX_CATALOG_SCHEMA_BYTES)
        for path in sorted(SCHEMAS_DIR.glob("*.json"))
    }
    return CatalogSource(config_file, tuple(files), schemas)


def _listed(
    family: str, path: Path, raw: bytes, settings: CatalogFamily, config_file: str
) -> dict[str, dict[str, Any]]:
    """``params.<name>.enum`` from the operator's list, for each listed parameter the file
    declares; ConfigError when that list is empty (the operation could run on nothing)."""
    try:
        declared = tomllib.loads(raw.decode("utf-8")).get("params", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}  # the registry names what is wrong with the file itself
    params = {}
    for (where, param), key in LISTED_PARAMETERS.items():
        if where != family or not isinstance(declared, dict) or param not in declared:
            continue
        listed = getattr(settings, key)
        if not listed:
            raise ConfigError(
                config_file,
                f"catalog.{family}.{key}",
                f"empty: {path.stem} takes its {param!r} from this list; list at least one, "
                f'or leave it out (exclude = ["{path.stem}"])',
            )
        params[param] = {"enum": list(listed)}
    return params


def listed_parameters(path: Path) -> tuple[str, ...]:
    """The parameters of the catalog command file at ``path`` whose values the config lists;
    none for a file outside the catalog (an operator's own)."""
    if path.parent.parent != CATALOG_DIR:
        return ()
    return tuple(param for family, param in LISTED_PARAMETERS if family == path.parent.name)


def catalog_operation_files() -> list[Path]:
    """Every command file the catalog ships, all families, in order (docs and tests)."""
    return sorted(CATALOG_DIR.glob("*/*.toml"))
