"""What a runner is: run one command, give back capped bytes, the exit status and timing."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

FANOUT_HOST: ContextVar[bool] = ContextVar("fanout_host", default=False)
"""True in a task that runs one host of a fan-out, or warms one host at start (and in the
tasks it starts): a runner then logs a failure to reach the host at debug level only,
because the fan-out (or the warming) logs one line with the counts of all its hosts (a
fan-out host's reason is in the audit). 1,000 unreachable hosts log one line, not 1,000.
A connect one call starts and others wait for is logged as its starter's: a single call
that waited for a fan-out's connect still has its own failure line (verdicts
``log_failure``)."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """The untrusted evidence of one attempt, exactly as it came back."""

    stdout: bytes
    """At most the operation's max_bytes + 1: one byte over the cap proves it was exceeded."""
    stderr: bytes
    """At most max_stderr_bytes + 1, same rule."""
    exit_status: int | None
    """None when the remote side gave none (killed by a signal, channel closed)."""
    duration_seconds: float = 0.0


class Runner(Protocol):
    """Runs commands on hosts by alias; the daemon's only way to reach a remote side."""

    async def run(
        self, host: str, command: str, *, timeout: float, max_stdout: int, max_stderr: int
    ) -> RunResult:
        """Run ``command`` on ``host``; raise UpstreamError when there is no result at all."""
        ...

    async def warm(self, host: str, *, evict: bool = False) -> None:
        """Get ready to run on ``host`` (open a connection; ``evict``: close another host's
        idle one at a cap, as a call would); raise UpstreamError if it cannot."""
        ...

    async def close(self) -> None:
        """Stop: release every connection; later runs raise UpstreamError("pool_closed")."""
        ...
