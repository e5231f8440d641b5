"""The audit trail: append-only JSON lines, durable before anything depends on them.

Reference: docs/audit.md. One ``intent`` record is durable before a command
runs (if it cannot be, the command does not run), and one ``result`` record
before the response is sent.

Durability without a per-call fsync bottleneck: with ``fsync = "always"`` an
append returns once an fsync that covers its bytes has completed, and every
append waiting at that moment shares the same fsync (group commit). A record
that is alone is synced on the loop itself while the disk is fast
(``INLINE_FSYNC_MAX_SECONDS``), saving the hand-off to a thread. ``batch``
fsyncs in the background at most ``BATCH_INTERVAL_SECONDS`` after a write;
``never`` leaves it to the kernel.

Rotation never costs a call: the file a reopen leaves is handed to the flusher,
which syncs the records still waiting in it and only then closes it, and a
descriptor is closed only once no thread is using it (``_AuditFile``). A
record counts as durable only once its own file was synced, never because a
newer file was.

Every record is a whole line or nothing. A write cut short (a full disk) is
truncated back to the last complete record before the append fails, so the
next record starts at a record boundary; if even that fails, the next write
first ends the fragment with a newline, and ``audit verify`` reports it as a
fault line rather than a record that was never written.

The file belongs to the daemon alone: created 0600, and an existing file owned
by another account or open to the group or others is refused, at start and at
every reopen. Before each record the path is compared with the open file
(device and inode): a file deleted or moved away without a SIGHUP is replaced
by a new one, so no record lands in a file nobody can read.

Tamper evidence: every record carries ``prev``, the sha256 of the previous
record's line, so an edited, deleted or reordered record breaks the chain
(``sshadapter audit verify``). The chain continues across log rotation (the
daemon remembers the last hash) and across restarts (it reads the last record whole,
whatever its length, or that of the newest rotated file: ``audit_tail``).

Private keys and passphrases never reach a record: records are built from
explicit fields, never from config objects or exception reprs of the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import stat
import threading
import time
import zlib
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from sshadapter.audit.private_paths import check_private, make_private_dirs
from sshadapter.audit.tail import last_record, last_rotated_record
from sshadapter.contract.rfc3339 import format_rfc3339
from sshadapter.errors import AuditError, ConfigError
from sshadapter.shown import shown

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "batch", "never"]
FILE_MODE: Final = 0o600  # the daemon's alone: records name callers, hosts and commands
GENESIS: Final = "0" * 64  # `prev` of the very first record
BATCH_INTERVAL_SECONDS: Final = 1.0  # with fsync = "batch", at most this much is at risk
# A record that is the only one waiting is synced on the loop itself (a thread hand-off
# costs 0.1-0.25 ms, as much as the fsync), but only while fsyncs are this fast: on a
# slow disk the loop must not stall, so every sync then goes to a thread.
INLINE_FSYNC_MAX_SECONDS: Final = 0.001
_FSYNC_EWMA_WEIGHT: Final = 0.2  # how fast the running estimate of an fsync follows the disk
# The longest record written, so the longest line `audit verify` reads as a record. The
# largest is a fan-out's result: a row per host (500 bytes with one successful attempt),
# each attempt up to ~1 KiB with a 500-character detail and quarantine names, so
# MAX_FANOUT_HOSTS (10,000) x MAX_RETRY_ATTEMPTS (5) is about 50 MiB. A longer record (a
# path quoting the output) is refused, the call failing closed, rather than written where
# no reader takes it.
MAX_RECORD_BYTES: Final = 128 * 1024 * 1024


class _AuditFile:
    """One open audit file: its descriptor is closed only once nothing may still use it.

    The flusher syncs in a thread while the loop may rotate the file away; closing the
    descriptor under that thread would fail its fsync (EBADF) or, once the number is
    reused, sync some other file. So every sync holds a reference, and ``release``
    closes the descriptor when the last reference goes (in whichever thread that is).
    """

    def __init__(self, fd: int) -> None:
        info = os.fstat(fd)
        self.fd = fd
        self.identity = (info.st_dev, info.st_ino)
        self.last = 0  # number of the last record written to this file (0: none)
        self._lock = threading.Lock()
        self._users = 0  # syncs in progress
        self._released = False  # the owner is done with it: close once unused
        self._closed = False

    def sync(self) -> None:
        """fsync the file; safe from any thread, at any time, even after ``release``."""
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "audit file closed before its records were synced")
            self._users += 1
        try:
            os.fsync(self.fd)
        finally:
            with self._lock:
                self._users -= 1
                self._close_if_done()

    def release(self) -> None:
        """Close the descriptor now, or when the sync still running ends. Idempotent."""
        with self._lock:
            self._released = True
            self._close_if_done()

    def _close_if_done(self) -> None:
        if self._released and not self._users and not self._closed:
            self._closed = True
            try:
                os.close(self.fd)
            except OSError as exc:
                log.error("audit file not closed: %s", exc.strerror)


class AuditLog:
    """An append-only JSON-lines file shared by every call of one daemon."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: FsyncPolicy = "always",
        inline_fsync_max_seconds: float = INLINE_FSYNC_MAX_SECONDS,
    ) -> None:
        self.path = path
        self.fsync = fsync
        self.inline_fsync_max_seconds = inline_fsync_max_seconds
        """How fast this disk's fsync must be for a lone record to be synced on the loop."""
        self._file: _AuditFile | None = None  # the file records are appended to
        # Files a reopen left with records not yet synced, oldest first: the flusher
        # syncs each, then releases it.
        self._retired: deque[_AuditFile] = deque()
        self._end = 0  # offset just after the last complete record
        self._torn = False  # a failed write left bytes after _end that could not be cut
        self._prev = GENESIS
        self._written = 0  # records written since start
        self._settled = 0  # records whose sync is over: durable, or their appends failed
        self._waiters: deque[tuple[int, asyncio.Future[None], str]] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self.syncs = 0
        """fsync calls made: with group commit, fewer than records under concurrency."""
        self._fsync_seconds = 0.0  # running estimate of one fsync on this disk

    # lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Open for appending and pick the chain up where the file left it.

        Raises ConfigError naming the path and the fix when the file or its
        directory cannot be used (a symlink, another owner, group or other access).
        """
        self._file = self._open_new(resume=True)

    def reopen(self) -> None:
        """After logrotate moved the file away (SIGHUP): continue the chain in a new file.

        The old file is synced (its records may still be waiting) and closed by the
        flusher. If the new path cannot be used, the old file stays open and the error
        is raised.
        """
        new = self._open_new()
        old, self._file = self._file, new
        if old is not None:
            self._retire(old)

    def close(self) -> None:
        """Sync (unless ``never``) and close every file; appends still waiting settle here."""
        files = [*self._retired, *([self._file] if self._file is not None else [])]
        self._retired.clear()
        self._file = None
        failure: OSError | None = None
        for file in files:
            if self.fsync != "never" and file.last > self._settled:
                try:
                    file.sync()
                except OSError as exc:
                    log.error("audit log not synced at close: %s", exc.strerror)
                    failure = failure or exc
            file.release()
        self._settle(self._written, failure)

    def _open_new(self, *, resume: bool = False) -> _AuditFile:
        """Open the path, end a torn last line; the chain goes on from its last record.

        A file without a record continues from the last record written (a reopen after
        rotation) or, at start (``resume``), from that of the newest rotated file.
        """
        fd = self._open_checked()
        try:
            last, torn = last_record(fd)
            if torn:  # a crash mid-write (power loss): end the torn line so the next one is whole
                os.write(fd, b"\n")
            file = _AuditFile(fd)
        except OSError as exc:
            os.close(fd)
            raise ConfigError(str(self.path), "audit.path", f"cannot read: {exc.strerror}") from exc
        if last is None and resume:
            last = self._last_rotated()
        if last is not None:
            self._prev = last
        self._end = os.fstat(fd).st_size
        self._torn = False
        return file

    def _last_rotated(self) -> str | None:
        """The digest of the last record of the newest rotated file; None (the chain starts
        again, which `audit verify` reports) when there is none or it cannot be read."""
        try:
            return last_rotated_record(self.path)
        except (OSError, EOFError, zlib.error) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            log.error(
                "audit file %s: the chain starts again, its rotated files cannot be read: %s",
                shown(self.path, None),
                shown(reason),
            )
            return None

    def _retire(self, old: _AuditFile) -> None:
        """Hand a file a reopen left to the flusher: synced first if records wait in it."""
        if self.fsync == "never" or old.last <= self._settled:
            old.release()  # nothing to sync; a sync still running keeps it open until done
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop, so no append is waiting on it: sync it here
            with contextlib.suppress(OSError):
                old.sync()
            old.release()
            return
        self._retired.append(old)
        self._start_flusher(delay=0.0 if self.fsync == "always" else BATCH_INTERVAL_SECONDS)

    def _open_checked(self) -> int:
        make_private_dirs(self.path.parent, key="audit.path")
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(self.path, flags, FILE_MODE)
        except OSError as exc:
            reason = "is a symlink" if exc.errno == errno.ELOOP else f"cannot open: {exc.strerror}"
            raise ConfigError(str(self.path), "audit.path", reason) from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(str(self.path), "audit.path", "is not a regular file")
            check_private(self.path, info, key="audit.path", kind="file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    # writing -----------------------------------------------------------------------

    def write(self, record: Mapping[str, Any]) -> int:
        """Append one record now (no await: order and chain stay exact); return its number.

        Raises AuditError, reason ``<type>_not_written``, when the record is not a
        whole line of the file; the file is then back at a record boundary.
        """
        reason = _not_written(record)
        if self._file is None:
            raise AuditError(reason, "audit log is not open")
        self._follow_path()
        file = self._file
        try:
            body = orjson.dumps({**record, "prev": self._prev})
        except (TypeError, orjson.JSONEncodeError) as exc:  # a bug: a field that is not JSON
            raise AuditError(reason, f"record not serializable: {exc}") from exc
        if len(body) > MAX_RECORD_BYTES:  # no reader would take it as a record: fail closed
            raise AuditError(reason, f"record of {len(body)} bytes over {MAX_RECORD_BYTES}")
        line = body + b"\n"
        if self._torn and not self._restore_boundary():
            line = b"\n" + line  # end the fragment: it becomes a fault line of its own
        try:
            written = os.write(file.fd, line)
        except OSError as exc:
            self._restore_boundary()
            raise AuditError(reason, f"{exc.strerror} writing {self.path}") from exc
        if written != len(line):
            self._restore_boundary()
            raise AuditError(reason, f"short write to {self.path}: {written} of {len(line)} bytes")
        self._end += written
        self._torn = False
        self._prev = hashlib.sha256(body).hexdigest()
        self._written += 1
        file.last = self._written
        return self._written

    def _restore_boundary(self) -> bool:
        """Cut whatever a failed write left after the last complete record."""
        assert self._file is not None
        try:
            if os.fstat(self._file.fd).st_size != self._end:
                os.ftruncate(self._file.fd, self._end)
        except OSError as exc:
            log.error("audit log %s: cannot cut a partial record: %s", self.path, exc.strerror)
            self._torn = True
            return False
        self._torn = False
        return True

    def _follow_path(self) -> None:
        """Reopen when the path no longer names the open file (deleted or moved away)."""
        try:
            info = os.stat(self.path, follow_symlinks=False)
            same = self._file is not None and (info.st_dev, info.st_ino) == self._file.identity
        except FileNotFoundError:
            same = False
        except OSError:
            return  # cannot tell: keep writing where we are
        if same:
            return
        try:
            self.reopen()
        except (ConfigError, OSError) as exc:
            log.error("audit file %s was replaced or removed, not reopened: %s", self.path, exc)
            return
        log.warning("audit file %s no longer named the open file: reopened it", self.path)

    async def append(self, record: Mapping[str, Any], *, alone: bool = False) -> None:
        """Write one record and return once it is as durable as the fsync policy says.

        ``alone``: the caller knows no other append is on its way (one call in flight).
        Then, with nothing else waiting and a fast disk, the record is synced right here:
        no flusher task and no waiter, two loop turns fewer before the caller goes on.
        """
        number = self.write(record)
        reason = _not_written(record)
        if self.fsync == "never":
            return
        if self.fsync == "batch":
            self._start_flusher(delay=BATCH_INTERVAL_SECONDS)
            return
        if alone and self._sync_here(number, reason):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((number, waiter, reason))
        self._start_flusher(delay=0.0)
        await waiter

    def _sync_here(self, number: int, reason: str) -> bool:
        """Sync record ``number`` on the loop now, if it is the only one not yet durable and
        fsyncs are fast; False (nothing done) otherwise. Raises AuditError if the sync fails."""
        file = self._file
        idle = self._flusher is None or self._flusher.done()
        if file is None or not idle or self._waiters or self._retired:
            return False
        if number - self._settled != 1 or self._fsync_seconds >= self.inline_fsync_max_seconds:
            return False
        failure = self._sync_now(file)
        self._settle(number, failure)
        if failure is not None:
            raise AuditError(reason, f"{failure.strerror} syncing {self.path}") from failure
        return True

    def _sync_now(self, file: _AuditFile) -> OSError | None:
        """fsync ``file`` on the loop, counted and timed; its error, if it fails."""
        started = time.monotonic()
        try:
            file.sync()
        except OSError as exc:
            return exc
        self._synced(time.monotonic() - started)
        return None

    def _synced(self, seconds: float) -> None:
        """One more fsync done, in ``seconds``: the running estimate follows the disk."""
        self._fsync_seconds += _FSYNC_EWMA_WEIGHT * (seconds - self._fsync_seconds)
        self.syncs += 1

    def _start_flusher(self, *, delay: float) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(delay))

    async def _flush(self, delay: float) -> None:
        """Group commit: one fsync covers every record written to its file before it started.

        Retired files first, oldest first: a record is settled by a sync of its own file.
        """
        if delay:
            await asyncio.sleep(delay)
        while self._settled < self._written or self._retired:
            file = self._retired[0] if self._retired else self._file
            if file is None:  # closed: close() settled what it could
                return
            # Records (settled, target] are all in this file: older files were settled
            # first, and a retired file takes no more records.
            target = file.last
            if target > self._settled:
                failure = await self._sync(file, target)
                self._settle(target, failure)
            if self._retired and self._retired[0] is file and file.last <= self._settled:
                self._retired.popleft()
                file.release()

    async def _sync(self, file: _AuditFile, target: int) -> OSError | None:
        """fsync ``file``: on the loop for a lone record on a fast disk, else in a thread."""
        # The flusher runs a loop turn after the appends that woke it, so a burst
        # has written all its records by now: one record alone is synced inline.
        alone = target - self._settled == 1 and len(self._waiters) <= 1
        if alone and self._fsync_seconds < self.inline_fsync_max_seconds:
            return self._sync_now(file)
        started = time.monotonic()
        try:
            await asyncio.to_thread(file.sync)
        except OSError as exc:
            return exc
        self._synced(time.monotonic() - started)
        return None

    def _settle(self, target: int, failure: OSError | None) -> None:
        """Answer every append of a record up to ``target``: durable, or failed by ``failure``."""
        self._settled = max(self._settled, target)
        while self._waiters and self._waiters[0][0] <= target:
            _, waiter, reason = self._waiters.popleft()
            if waiter.done():
                continue
            if failure is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(AuditError(reason, f"{failure.strerror} syncing {self.path}"))


def _not_written(record: Mapping[str, Any]) -> str:
    """The reason an append of ``record`` fails with: the command did or did not run (an
    approval record is written before its command may run)."""
    ran = record.get("type") not in ("intent", "approval")
    return "result_not_written" if ran else "intent_not_written"


def now_text(moment: datetime | None = None) -> str:
    return format_rfc3339(moment or datetime.now(UTC))
