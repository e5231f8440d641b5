"""Code run inside a benchmark's daemon process, before ``sshadapter serve``.

``SERVE`` is what the benchmarks start (``python -c SERVE SETUP_JSON``): it ties the
daemon's life to the benchmark's (PR_SET_PDEATHSIG: a killed benchmark leaves no
daemon behind), installs ``LOOP_RECORDER`` (inert until signalled), runs the
experimental fixes asked for (``PATCHES``), then calls the package's own
``sshadapter serve --config``. The package is never edited.

``LOOP_RECORDER`` measures how long the event loop is blocked. It wraps the
stdlib's ``asyncio.events.Handle._run``, through which the loop runs every
callback and every task step (``BaseEventLoop._run_once``), so it sees the
daemon's loop whatever the package's internals look like. It costs nothing until
``LOOP_START_SIGNAL``; from then on every callback is timed (CLOCK_MONOTONIC wall
time and the thread's CPU time) and those over ``LOOP_MIN_NS`` are kept;
``LOOP_DUMP_SIGNAL`` restores the original method and writes the records as JSON
to the ``loop_log`` path, atomically (written aside, then renamed). Real-time
signals: nothing else in the daemon uses them.

``PATCHES``: experimental fixes, applied in that daemon only, to measure what a
suggested change would save (``bench_ssh.py --variant``, ``profile_ssh.py
--patch``). They touch package internals by nature, so they break when the code
moves on: when the package adopts or refutes one, the entry goes.
"""

from __future__ import annotations

import signal
from typing import Final

LOOP_START_SIGNAL: Final = signal.SIGRTMIN + 3
LOOP_DUMP_SIGNAL: Final = signal.SIGRTMIN + 4
LOOP_MIN_NS: Final = 100_000  # shorter callbacks cannot matter against a 5 ms target
LOOP_MAX_RECORDS: Final = 500_000  # a bound on the recorder's own memory

LOOP_RECORDER: Final = f"""
import asyncio.events, json, os, signal, time

def _install_loop_recorder(path):
    handle_class = asyncio.events.Handle
    original = handle_class._run
    records = []
    monotonic, thread_time = time.monotonic_ns, time.thread_time_ns

    def label(callback):
        task = getattr(callback, "__self__", None)
        coro = getattr(task, "get_coro", None)
        if coro is not None:
            coro = coro()
            return "task " + getattr(coro, "__qualname__", type(coro).__name__)
        return getattr(callback, "__qualname__", type(callback).__name__)

    def timed_run(self):
        callback = self._callback
        t0, c0 = monotonic(), thread_time()
        original(self)
        wall = monotonic() - t0
        if wall >= {LOOP_MIN_NS} and len(records) < {LOOP_MAX_RECORDS}:
            records.append((t0, wall, thread_time() - c0, label(callback)))

    def start(*_):
        records.clear()
        handle_class._run = timed_run

    def dump(*_):
        handle_class._run = original
        aside = path + ".part"
        with open(aside, "w") as out:
            json.dump(records, out)
        os.replace(aside, path)
        records.clear()

    signal.signal({int(LOOP_START_SIGNAL)}, start)
    signal.signal({int(LOOP_DUMP_SIGNAL)}, dump)
"""

SERVE: Final = f"""
import ctypes, json, os, signal, sys
setup = json.loads(sys.argv[1])
PR_SET_PDEATHSIG = 1
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
if os.getppid() != setup["parent"]:  # the benchmark died before prctl
    sys.exit(1)
{LOOP_RECORDER}
_install_loop_recorder(setup["loop_log"])
exec(setup["patches"])
from sshadapter.cli import main
sys.exit(main(["serve", "--config", setup["config"]]))
"""

# Each entry: a suggested fix, executed in the daemon process before serve.
PATCHES: Final = {
    # runners.ssh without spare channels: every call opens its own channel, as before
    # issue 13 (measures what the spares save). Measurement only.
    "no-spares": r"""
from sshadapter.runners.ssh import exec_gate as _s

_s.SPARES = False
""",
    # runners.ssh without coalesced writes: one send() per SSH packet, as asyncssh does
    # alone (measures what runners/ssh/coalesce.py saves). Measurement only.
    "no-coalesce": r"""
from sshadapter.runners.ssh import dial as _d

_d.coalesce_writes = lambda conn: False
""",
    # runners.ssh with a spare's EOF sent only once its exec request is answered, as before
    # issue 22 (measures what sending it right behind the exec saves). Measurement only.
    "late-eof": r"""
from asyncssh import packet as _p
from sshadapter.runners.ssh import exec_gate as _g

def _hold_exec(chan, command):
    original = chan._make_request

    async def gated(request, *args):
        if request == b"exec":
            args = (_p.String(await command),)
        return await original(request, *args)

    chan._make_request = gated

_g.hold_exec = _hold_exec
""",
    # runners.ssh with a call finishing only once its channel is closed, as before issue 22
    # (measures what answering before the close handshake saves). Measurement only.
    "close-first": r"""
from sshadapter.runners.ssh import session as _sess

_sess.Session._finish_if_exited = lambda self: None
""",
}
