"""What every section of the configuration is made of: the strict, frozen base, who may
(``Allow``: uids and unix groups) and the name a target takes.

The daemon's sections (sshadapter/config.py) and the catalog's
(sshadapter/config_catalog.py) are built from these.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

# A target is a host alias or a group name: one namespace, the agent's `target` argument.
TARGET_NAME: Final = r"^[a-z][a-z0-9_-]{0,62}$"


class Section(BaseModel):
    """A table of the configuration: unknown keys refused, frozen once read."""

    # No inf or nan (TOML has both): a timeout that never ends is no timeout.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Allow(Section):
    """Who may call: deny by default, a uid or a group name is enough."""

    uids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    groups: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")], ...] = ()
