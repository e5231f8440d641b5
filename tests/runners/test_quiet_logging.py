"""runners/ssh/quiet_logging.py: asyncssh's disabled log calls format nothing; enabled ones
log as before."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import asyncssh
import pytest
from asyncssh import logging as ssh_logging
from asyncssh import packet as ssh_packet

from sshadapter.runners.ssh.quiet_logging import skip_disabled_log_calls


class Counted:
    """A log argument that counts how often it is turned into text."""

    def __init__(self) -> None:
        self.formatted = 0

    def __str__(self) -> str:
        self.formatted += 1
        return "counted"


class Names(dict[int, str]):
    """asyncssh's packet names, counting each lookup."""

    looked_up = 0

    def __getitem__(self, key: int) -> str:
        type(self).looked_up += 1
        return super().__getitem__(key)


class Packets(ssh_packet.SSHPacketLogger):
    _handler_names = Names({90: "MSG_CHANNEL_OPEN"})

    @property
    def logger(self) -> ssh_logging.SSHLogger:
        return ssh_logging.logger


@pytest.fixture
def wrapped() -> Iterator[None]:
    """The wrappers installed (the runner installs them once per process: they stay)."""
    skip_disabled_log_calls()
    yield
    asyncssh.set_debug_level(1)


def test_a_second_install_changes_nothing(wrapped: None) -> None:
    """Installed once: a second call reports False and leaves the wrappers as they are."""
    log = ssh_logging.SSHLogger.log
    assert skip_disabled_log_calls() is False
    assert ssh_logging.SSHLogger.log is log


def test_a_disabled_level_formats_no_argument(
    wrapped: None, caplog: pytest.LogCaptureFixture
) -> None:
    """At WARNING an INFO call never turns its arguments into text; at INFO it logs them."""
    argument = Counted()
    with caplog.at_level(logging.WARNING, logger="asyncssh"):
        ssh_logging.logger.info("value %s", [argument])
    assert argument.formatted == 0
    assert not caplog.records
    with caplog.at_level(logging.INFO, logger="asyncssh"):
        ssh_logging.logger.info("value %s", [argument])
    assert [r.getMessage() for r in caplog.records] == ["value counted"]


def test_packets_are_named_only_when_packet_logging_is_on(
    wrapped: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Below debug level 3, or with DEBUG off, a packet is not even named; at 3 it is logged."""
    Names.looked_up = 0
    with caplog.at_level(logging.DEBUG, logger="asyncssh"):
        Packets().log_sent_packet(90, 7, b"\x5a")  # debug level 1
    asyncssh.set_debug_level(3)
    with caplog.at_level(logging.INFO, logger="asyncssh"):
        Packets().log_sent_packet(90, 7, b"\x5a")  # DEBUG off
    assert Names.looked_up == 0
    assert not caplog.records
    with caplog.at_level(logging.DEBUG, logger="asyncssh"):
        Packets().log_sent_packet(90, 7, b"\x5a")
    assert Names.looked_up == 1
    assert "Sent MSG_CHANNEL_OPEN (90), 1 byte" in caplog.records[0].getMessage()
