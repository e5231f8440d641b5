"""The socket client of `sshadapter call` and `list`: what it says when the daemon does not
answer as it should (one line for the CLI, never a traceback)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sshadapter.client import ClientError, parse_assignments, request


def serve_once(path: Path, answer: Callable[[socket.socket], object]) -> threading.Thread:
    """A one-connection Unix server on ``path`` that reads a line and runs ``answer``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def run() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                answer(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def sock_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "s.sock"


def test_no_daemon_is_cannot_talk(sock_path: Path) -> None:
    """Nothing listens: a ClientError naming the socket path."""
    with pytest.raises(ClientError, match=f"cannot talk to {sock_path}"):
        request(sock_path, {"op": "list"}, timeout=5)


def test_a_closed_connection_without_an_answer(sock_path: Path) -> None:
    """The daemon closes without a line: said so, not a JSON error."""
    thread = serve_once(sock_path, lambda conn: None)
    with pytest.raises(ClientError, match="closed the connection without an answer"):
        request(sock_path, {"op": "list"}, timeout=5)
    thread.join(5)


def test_an_answer_that_is_not_json(sock_path: Path) -> None:
    """A line that is not strict JSON: not a JSON response."""
    thread = serve_once(sock_path, lambda conn: conn.sendall(b'{"a": 1, "a": 2}\n'))
    with pytest.raises(ClientError, match="not a JSON response"):
        request(sock_path, {"op": "list"}, timeout=5)
    thread.join(5)


def test_a_daemon_that_never_answers_times_out(sock_path: Path) -> None:
    """A silent daemon: the client's timeout ends the wait with a ClientError."""
    done = threading.Event()
    thread = serve_once(sock_path, lambda conn: done.wait(10))
    with pytest.raises(ClientError, match="cannot talk to"):
        request(sock_path, {"op": "list"}, timeout=0.5)
    done.set()
    thread.join(5)


@pytest.mark.parametrize(
    ("items", "args"),
    [
        (["path=/"], {"path": "/"}),
        (["count:=3", "flag:=false"], {"count": 3, "flag": False}),
        (["a=b=c"], {"a": "b=c"}),
        (["a=x:=y"], {"a": "x:=y"}),
    ],
)
def test_assignments(items: list[str], args: dict[str, object]) -> None:
    """key=value is text, key:=json a JSON value; the first separator decides."""
    assert parse_assignments(items) == args


@pytest.mark.parametrize("items", [["nothing"], ["=x"], ["n:=nope"], [":=1"]])
def test_bad_assignments(items: list[str]) -> None:
    """No separator, an empty key, JSON that does not parse: a ValueError the CLI prints."""
    with pytest.raises(ValueError):
        parse_assignments(items)
