"""The configuration's tables that read no environment: who may call, and the catalog's.

Reference: docs/operations.md "Configuration" and "Switching the catalog on". A command
file's ``allow`` (the contract) and the catalog's ``[catalog]`` tables are validated
with these pydantic models alone; config.py builds the whole file from them and adds the
environment overrides (pydantic-settings), which the pure engine never loads: an
evaluation worker and ``sshadapter check`` judge bytes, they read no variables.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

# A target is a host alias or a group name: one namespace, the agent's `target` argument.
TARGET_NAME: Final = r"^[a-z][a-z0-9_-]{0,62}$"


class Section(BaseModel):
    """A table of the configuration: frozen, closed, every number finite."""

    # No inf or nan (TOML has both): a timeout that never ends is no timeout.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Allow(Section):
    """Who may call: deny by default, a uid or a group name is enough."""

    uids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    groups: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")], ...] = ()


# The catalog's families: the directories of sshadapter/catalog/ (docs/catalog.md).
CATALOG_FAMILIES: Final = (
    "system",
    "compute",
    "storage",
    "services",
    "processes",
    "network",
    "logs",
    "maintenance",
    "actions",
)
# `families = ["all"]`: every family but the mutating one, which is named or not enabled.
CATALOG_ALL: Final = "all"
MUTATING_FAMILY: Final = "actions"
CATALOG_TOOL_NAME: Final = r"^[a-z][a-z0-9_]{1,62}$"
# systemd.unit(5) names: the characters systemd allows in a name (no backslash escapes: an
# operator lists plain names), a type suffix, at most 255 characters.
UNIT_NAME: Final = (
    r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,240}\.(service|socket|timer|target|path|mount|slice)$"
)
# An absolute path of plain characters (a certificate an operator lists): no space, no
# quote, nothing a sudoers or policy line would have to escape.
CERTIFICATE_PATH: Final = r"^/[A-Za-z0-9._/+@-]{1,254}$"
MAX_CATALOG_LIST: Final = 256  # units or certificates an operator lists by hand


class CatalogFamily(Section):
    """`[catalog.<family>]`: where a family's operations run and who may call them."""

    targets: tuple[Annotated[str, Field(pattern=TARGET_NAME)], ...] | None = Field(
        default=None, min_length=1, max_length=MAX_CATALOG_LIST
    )
    """Replaces every command file's `targets`; None: the files' own (["all"])."""
    allow: Allow | None = None
    """Replaces every command file's `allow`; None: the files' own ([server] allow)."""
    exclude: tuple[Annotated[str, Field(pattern=CATALOG_TOOL_NAME)], ...] = ()
    """Operations of the family left out."""


class MaintenanceFamily(CatalogFamily):
    certificate_paths: tuple[Annotated[str, Field(pattern=CERTIFICATE_PATH)], ...] = Field(
        default=(), max_length=MAX_CATALOG_LIST
    )
    """The certificates cert_expiry may read: its `path` parameter's enum."""


class ActionsFamily(CatalogFamily):
    units: tuple[Annotated[str, Field(pattern=UNIT_NAME)], ...] = Field(
        default=(), max_length=MAX_CATALOG_LIST
    )
    """The units the actions may restart, reload or reset: their `unit` parameter's enum."""


class CatalogSection(Section):
    """Which families of the shipped catalog load, and their overrides (docs/catalog.md)."""

    families: tuple[str, ...] = ()
    system: CatalogFamily = CatalogFamily()
    compute: CatalogFamily = CatalogFamily()
    storage: CatalogFamily = CatalogFamily()
    services: CatalogFamily = CatalogFamily()
    processes: CatalogFamily = CatalogFamily()
    network: CatalogFamily = CatalogFamily()
    logs: CatalogFamily = CatalogFamily()
    maintenance: MaintenanceFamily = MaintenanceFamily()
    actions: ActionsFamily = ActionsFamily()

    @field_validator("families")
    @classmethod
    def _named_families(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name != CATALOG_ALL and name not in CATALOG_FAMILIES:
                raise ValueError(
                    f"no family {name!r}; the families are {', '.join(CATALOG_FAMILIES)}, "
                    f"or {CATALOG_ALL!r} (every one but {MUTATING_FAMILY!r})"
                )
        if len(set(value)) != len(value):
            raise ValueError("a family is listed twice")
        return value

    @property
    def enabled(self) -> tuple[str, ...]:
        """The enabled families, in catalog order."""
        named = set(self.families)
        return tuple(
            name
            for name in CATALOG_FAMILIES
            if name in named or (CATALOG_ALL in named and name != MUTATING_FAMILY)
        )

    def family(self, name: str) -> CatalogFamily:
        found: CatalogFamily = getattr(self, name)
        return found
