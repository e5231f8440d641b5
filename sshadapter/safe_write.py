"""Writing a file for the operator: never through a link, never into another account's directory.

The CLI writes files an operator then reviews, installs or runs, often as root: fixture
cases (``record``), the examples (``examples --write``), an inventory (``inventory import
--write``), the host's dispatcher (``dispatcher --write``). In a directory another account
can write to, that account can plant a symlink under the name about to be written (and
have root overwrite a file of its choosing, or copy one out), or edit the file between
its writing and its installation. So every file is written through a ``TargetDirectory``:

- the directory is created by the writer or checked: not a symlink, owned by the writing
  account or root, and writable by nobody else (no group or other write bit, the rule
  the dispatcher applies to its policy); it is opened once with ``O_NOFOLLOW`` and every
  name in it is made relative to that descriptor, so it cannot be swapped afterwards;
- a new file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: a name that exists, a
  symlink included, is refused, never followed or truncated;
- a file a reader may open at any moment (an inventory, the dispatcher) is written whole
  under a temporary name made the same way, then renamed onto its name (a symlink there
  is replaced, not followed) or, when it must be new, linked to it (refused if it
  exists): no reader sees half a file;
- each file gets the mode its writer chose (``fchmod``: the umask never widens or
  narrows it).

Any failure is a ConfigError naming the path, the option that named it and the reason,
one line; nothing is written over.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import stat
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from sshadapter.errors import ConfigError

DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_MODE: Final = 0o755  # directories of files meant for review: anyone may read, we write
UNSAFE_MODE_BITS: Final = 0o022  # group or other write: another account could plant a link
TEMPORARY_ATTEMPTS: Final = 8  # random temporary names tried before giving up (a collision is rare)


class TargetDirectory:
    """A directory opened for writing, created by the writer or checked to be safe to write into.

    Use as a context manager: the descriptor is closed on leaving.
    """

    def __init__(self, path: Path, fd: int, key: str) -> None:
        self.path = path
        self._fd = fd
        self._key = key

    @classmethod
    def open(cls, path: Path, *, key: str, create: bool = False) -> Self:
        """``path`` opened without following a link, or ConfigError; made (with its
        parents) when missing and ``create``."""
        created = False
        if create:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(path, DIR_MODE)
                created = True
            except FileExistsError:
                pass  # something is there already: judged below like any given directory
            except OSError as exc:
                raise ConfigError(str(path), key, f"cannot create: {exc.strerror}") from exc
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise ConfigError(str(path), key, "is a symlink: give the real directory")
            fd = os.open(path, DIR_FLAGS)
        except NotADirectoryError as exc:
            raise ConfigError(str(path), key, "is not a directory") from exc
        except OSError as exc:
            raise ConfigError(str(path), key, f"cannot open: {exc.strerror}") from exc
        try:
            if created:
                os.fchmod(fd, DIR_MODE)  # the umask may have left group write on it
            _check_safe(path, os.fstat(fd), key)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, key)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        os.close(self._fd)

    def names(self) -> list[str]:
        """What the directory holds now."""
        return os.listdir(self._fd)

    def subdirectory(self, name: str) -> TargetDirectory:
        """A new directory ``name`` here (an existing one, a link included, is refused)."""
        path = self.path / name
        try:
            os.mkdir(name, DIR_MODE, dir_fd=self._fd)
            fd = os.open(name, DIR_FLAGS, dir_fd=self._fd)
        except FileExistsError as exc:
            raise ConfigError(str(path), self._key, "exists: nothing was written over") from exc
        except OSError as exc:
            raise ConfigError(str(path), self._key, f"cannot create: {exc.strerror}") from exc
        try:
            os.fchmod(fd, DIR_MODE)
        except BaseException:
            os.close(fd)
            raise
        return TargetDirectory(path, fd, self._key)

    def create(self, name: str, data: bytes, mode: int) -> Path:
        """A new file ``name`` holding ``data`` with ``mode``; one that exists (a link
        included) is refused and left as it was."""
        path = self.path / name
        try:
            fd = os.open(name, NEW_FILE_FLAGS, mode & 0o600, dir_fd=self._fd)
        except FileExistsError as exc:
            raise ConfigError(str(path), self._key, "exists: nothing was written over") from exc
        except OSError as exc:
            raise ConfigError(str(path), self._key, f"cannot write: {exc.strerror}") from exc
        try:
            self._fill(fd, data, mode, sync=False)
        except OSError as exc:
            os.unlink(name, dir_fd=self._fd)
            raise ConfigError(str(path), self._key, f"cannot write: {exc.strerror}") from exc
        return path

    def publish(self, name: str, data: bytes, mode: int, *, overwrite: bool) -> Path:
        """``name`` holding ``data`` with ``mode``, all at once: written under a temporary
        name, then renamed onto it with ``overwrite`` (whatever was there, a link included,
        is replaced, never followed), else linked to it (refused if the name exists)."""
        path = self.path / name
        temporary, fd = self._temporary(name, mode)
        try:
            self._fill(fd, data, mode, sync=True)
            if overwrite:
                os.rename(temporary, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            else:
                os.link(temporary, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
                os.unlink(temporary, dir_fd=self._fd)
        except FileExistsError as exc:
            os.unlink(temporary, dir_fd=self._fd)
            raise ConfigError(str(path), self._key, "exists: nothing was written over") from exc
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=self._fd)
            raise ConfigError(str(path), self._key, f"cannot write: {exc.strerror}") from exc
        os.fsync(self._fd)  # the new name survives a crash
        return path

    def _temporary(self, name: str, mode: int) -> tuple[str, int]:
        """The name and descriptor of a new empty file beside ``name``; the name does not end
        like ``name`` (a loader globbing ``*.toml`` never reads a half-written file)."""
        for _ in range(TEMPORARY_ATTEMPTS):
            temporary = f".{name}.{secrets.token_hex(6)}.tmp"
            try:
                return temporary, os.open(temporary, NEW_FILE_FLAGS, mode & 0o600, dir_fd=self._fd)
            except FileExistsError:
                continue
            except OSError as exc:
                path = str(self.path / name)
                raise ConfigError(path, self._key, f"cannot write: {exc.strerror}") from exc
        raise ConfigError(str(self.path / name), self._key, "cannot make a temporary name")

    @staticmethod
    def _fill(fd: int, data: bytes, mode: int, *, sync: bool) -> None:
        """Write ``data`` to the new file ``fd`` and give it ``mode``; closes ``fd``.

        Created owner-only, widened to ``mode`` once full (the umask plays no part).
        ``sync`` before a rename: the name never points at a file still empty on disk."""
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            if sync:
                os.fsync(out.fileno())


def check_directory(path: Path, *, key: str) -> None:
    """ConfigError unless files may be written into ``path`` (before any work is done)."""
    with TargetDirectory.open(path, key=key):
        pass


def _check_safe(path: Path, info: os.stat_result, key: str) -> None:
    """ConfigError unless the directory is the writer's (or root's) and nobody else's to write."""
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        trusted = describe_owner(me) if me == 0 else f"{describe_owner(me)} or root"
        raise ConfigError(
            str(path),
            key,
            f"directory is owned by {describe_owner(info.st_uid)}, not by {trusted} (its "
            "owner could plant a link under the name written): write into a directory of "
            "your own",
        )
    if info.st_mode & UNSAFE_MODE_BITS:
        raise ConfigError(
            str(path),
            key,
            f"directory mode {stat.S_IMODE(info.st_mode):04o} lets other accounts write to it "
            f"(they could plant a link under the name written): `chmod go-w {path}` or "
            "write into a directory of your own",
        )


def describe_owner(uid: int) -> str:
    """An account as an operator knows it: its name and uid, or the uid alone."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
