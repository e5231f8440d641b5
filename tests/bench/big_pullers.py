"""Helper process of bench_load.py: agents pulling one tool back to back through the daemon.

Run by bench_load.py, not by hand: ``python big_pullers.py PARENT_PID SOCKET TOOL AGENTS``.
Each agent is a thread with its own blocking connection to the daemon's socket,
sending the same call again as soon as the previous response line is complete.
The responses are read whole and checked for ``"outcome":"success"`` in their
first or last bytes, not parsed: the raw pulls of the comparison parse nothing either,
and a parse here would only add CPU load that the daemon is not responsible for.

A separate process so that reading 8.4 MB responses never delays the small
calls that bench_load.py times in its own event loop. Prints ``started`` once
every agent has had one response, and on SIGTERM lets each agent finish the
call it is in, then prints one JSON line of counts and exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Final

RECV_BYTES: Final = 1024 * 1024
SUCCESS: Final = b'"outcome":"success"'
EDGE_BYTES: Final = 256  # the envelope's outcome member is before or after its data
JOIN_TIMEOUT_SECONDS: Final = 120.0


def pull(path: str, line: bytes, stop: threading.Event, stats: dict[str, list[float]]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        while not stop.is_set():
            t0 = time.perf_counter()
            sock.sendall(line)
            buffer = bytearray()
            while not buffer.endswith(b"\n"):
                chunk = sock.recv(RECV_BYTES)
                if not chunk:
                    stats["closed"].append(time.perf_counter() - t0)
                    return
                buffer += chunk
            ends = buffer[:EDGE_BYTES] + buffer[-EDGE_BYTES:]
            key = "ok" if SUCCESS in ends else "failed"
            stats[key].append(time.perf_counter() - t0)


def main() -> None:
    parent, path, tool, agents = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit(1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    line = json.dumps({"op": "call", "tool": tool, "args": {}}).encode() + b"\n"
    stats: list[dict[str, list[float]]] = [
        {"ok": [], "failed": [], "closed": []} for _ in range(agents)
    ]
    threads = [
        threading.Thread(target=pull, args=(path, line, stop, s), daemon=True) for s in stats
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    announced = False
    while not stop.wait(0.02):
        if not announced and all(s["ok"] or s["failed"] or s["closed"] for s in stats):
            print("started", flush=True)
            announced = True
        if not any(t.is_alive() for t in threads):
            break
    wall = time.perf_counter() - started
    for thread in threads:
        thread.join(JOIN_TIMEOUT_SECONDS)
    ok = [x for s in stats for x in s["ok"]]
    print(
        json.dumps(
            {
                "ok": len(ok),
                "failed": sum(len(s["failed"]) for s in stats),
                "closed": sum(len(s["closed"]) for s in stats),
                "seconds": [round(x, 4) for x in ok],
                "wall": wall,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
