"""A latency-injecting TCP proxy for the fleet benchmarks: real networks have round trips.

Run as its own process (``LatencyProxy`` starts it), so its CPU is not the daemon's: for
each (listen address, listen port, target address, target port) it accepts, connects to
the target, and forwards every chunk RTT/2 later in each direction. Each direction is a
FIFO of (due time, bytes) sent in order, so a stream keeps its order and a chunk never
waits longer than its own delay plus the sender's turn.

On start it measures its own fidelity: a ping-pong of one byte through an extra listener
to an echo server in the same process (the p50 round trip measured against the one
asked), and prints one JSON line ``{"ready": true, "asked_ms": .., "p50_ms": ..}``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

READ_CHUNK: Final = 65536  # one read's bytes: an SSH packet or several
PING_ROUNDS: Final = 50  # round trips for the fidelity p50
PING_ADDRESS: Final = "127.0.0.1"

Pair = tuple[str, int, str, int]  # listen address, listen port, target address, target port


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """One direction: each chunk queued with its due time, sent in order when due."""
    loop = asyncio.get_running_loop()
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    more = asyncio.Event()
    done = False

    async def send() -> None:
        while queue or not done:
            if not queue:
                more.clear()
                await more.wait()
                continue
            due, data = queue.popleft()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.ensure_future(send())
    try:
        while data := await reader.read(READ_CHUNK):
            queue.append((loop.time() + delay, data))
            more.set()
    except OSError:
        pass
    finally:
        done = True
        more.set()
    with contextlib.suppress(OSError, ConnectionError):
        await sender


async def _serve(pair: Pair, delay: float) -> asyncio.Server:
    _, _, target_host, target_port = pair

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _pump(reader, up_writer, delay),
            _pump(up_reader, writer, delay),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            w.close()

    return await asyncio.start_server(one, pair[0], pair[1], backlog=1024)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(READ_CHUNK):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _fidelity(delay: float) -> float:
    """The p50 round trip of one byte through a proxied listener, in ms."""
    echo = await asyncio.start_server(_echo, PING_ADDRESS, 0)
    echo_port = echo.sockets[0].getsockname()[1]
    proxy = await _serve((PING_ADDRESS, 0, PING_ADDRESS, echo_port), delay)
    port = proxy.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(PING_ADDRESS, port)
    trips = []
    for _ in range(PING_ROUNDS):
        started = time.perf_counter()
        writer.write(b"x")
        await reader.readexactly(1)
        trips.append((time.perf_counter() - started) * 1000)
    writer.close()
    proxy.close()
    echo.close()
    return statistics.median(trips)


async def _main(rtt_ms: float, pairs: Sequence[Pair]) -> None:
    delay = rtt_ms / 2000
    servers = [await _serve(pair, delay) for pair in pairs]
    p50 = await _fidelity(delay)
    print(json.dumps({"ready": True, "asked_ms": rtt_ms, "p50_ms": round(p50, 2)}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


class LatencyProxy:
    """The proxy process for ``pairs`` at ``rtt_ms``: its fidelity, and its CPU seconds."""

    def __init__(self, rtt_ms: float, pairs: Sequence[Pair], work: Path) -> None:
        spec = work / f"proxy-{rtt_ms:g}.json"
        spec.write_text(json.dumps({"rtt_ms": rtt_ms, "pairs": list(pairs)}))
        self.rtt_ms = rtt_ms
        self.log = work / f"proxy-{rtt_ms:g}.log"  # connections cut at stop say so there
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(spec)],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                stderr=log,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # the ready line, after the ping-pong
        if not line:
            raise RuntimeError(f"the latency proxy exited: {self.process.wait()}")
        self.p50_ms = float(json.loads(line)["p50_ms"])

    def cpu(self) -> float:
        """utime + stime of the proxy process so far, in seconds."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def fidelity(self) -> str:
        return f"latency proxy: asked {self.rtt_ms:g} ms, ping-pong p50 {self.p50_ms:.1f} ms"

    def stop(self) -> float:
        """Stop the process; its CPU seconds."""
        cpu = self.cpu()
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        return cpu


if __name__ == "__main__":
    setup = json.loads(Path(sys.argv[1]).read_text())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(float(setup["rtt_ms"]), [tuple(p) for p in setup["pairs"]]))
