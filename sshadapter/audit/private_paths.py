"""Paths only the daemon may read: the audit file and the quarantine directory.

A path another account created beforehand is not the daemon's, even if its
mode looks right: that account can read what lands there (records name callers,
hosts and commands; quarantined bytes may hold secrets) or swap files under it.
So both must be owned by the daemon's uid with no group or other access, and
the daemon refuses to start otherwise, with one line naming the path, the owner
it found and the fix (docs/audit.md "Files").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from sshadapter.errors import ConfigError
from sshadapter.safe_write import describe_owner

DIR_MODE: Final = 0o700  # directories the daemon creates for its private files


def check_private(path: Path, info: os.stat_result, *, key: str, kind: str) -> None:
    """Raise ConfigError unless ``info`` is owned by us and closed to group and others."""
    me = os.geteuid()
    if info.st_uid != me:
        raise ConfigError(
            str(path),
            key,
            f"{kind} is owned by {describe_owner(info.st_uid)}, not by the daemon's account "
            f"{describe_owner(me)}: remove it, or `chown {me} {path}` if its contents are trusted",
        )
    if info.st_mode & 0o077:
        wanted = "700" if stat.S_ISDIR(info.st_mode) else "600"
        raise ConfigError(
            str(path),
            key,
            f"{kind} mode {stat.S_IMODE(info.st_mode):04o} gives group or other access: "
            f"`chmod {wanted} {path}`",
        )


def make_private_dirs(directory: Path, *, key: str) -> None:
    """Create ``directory`` (and missing parents) 0700; refuse one that is a symlink."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(str(directory), key, f"cannot inspect: {exc.strerror}") from exc
    else:
        if stat.S_ISLNK(info.st_mode):
            raise ConfigError(str(directory), key, "directory is a symlink: give the real path")
        if not stat.S_ISDIR(info.st_mode):
            raise ConfigError(str(directory), key, "exists and is not a directory")
        return
    old_umask = os.umask(0o077)
    try:
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(str(directory), key, f"cannot create: {exc.strerror}") from exc
    finally:
        os.umask(old_umask)
