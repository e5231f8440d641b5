"""OpenSSH certificates against a real sshd, signed at test time with ``ssh-keygen -s``.

Host certificates: accepted only when their principals name the host's ``address``
(asyncssh 2.24 alone accepts one without principals for any host); ``@revoked`` keys
are refused. User certificates: the key plus its certificate authenticates through
``TrustedUserCAKeys`` and ``AuthorizedPrincipalsFile`` (whose ``command=`` runs, so
the certificate never bypasses a forced command); an expired one is never offered,
is named by ``sshadapter check --hosts``, and one the host refuses is a clear failure.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sshd import Sshd, generate_key, require_sshd, running_sshd
from test_ssh_runner import run_one, upstream_error, with_runner

from sshadapter.cli import main as cli_main
from sshadapter.config import HostSection, load_config
from sshadapter.daemon.metrics import Metrics
from sshadapter.errors import ConfigError

PRINCIPAL: Final = "sshadapter-ci"  # the user certificates' principal, in the principals file
FORCED: Final = "forced-by-principals-file"  # what the principals file's command= prints
HOST_VALIDITY: Final = "-5m:+1d"  # a clock a little behind still accepts the certificates
EXPIRY_SLACK_SECONDS: Final = 30.0  # between signing, scraping and a loaded CI box


@dataclass(frozen=True)
class CertHost:
    """A real sshd whose host key is certified, trusting a user CA, and the CAs' files."""

    sshd: Sshd
    host_ca: Path
    user_ca: Path

    def known_hosts(self, *, revoked: bool = False) -> Path:
        """One ``@cert-authority`` line for the host (and ``@revoked`` for its key)."""
        lines = [f"@cert-authority [127.0.0.1]:{self.sshd.port} {pub(self.host_ca)}"]
        if revoked:
            lines.append(f"@revoked * {pub(self.sshd.host_key)}")
        path = self.sshd.workdir / ("known_hosts_revoked" if revoked else "known_hosts_ca")
        path.write_text("".join(f"{line}\n" for line in lines))
        return path

    def user_certificate(self, name: str, *, validity: str, principal: str = PRINCIPAL) -> Path:
        """The client key's certificate, signed now by the user CA."""
        key = self.sshd.workdir / name
        key.write_bytes(self.sshd.client_key.read_bytes())
        key.chmod(0o600)
        Path(f"{key}.pub").write_text(pub(self.sshd.client_key) + "\n")
        sign(self.user_ca, Path(f"{key}.pub"), principal, validity)
        return Path(f"{key}-cert.pub")

    def section(self, **overrides: Any) -> HostSection:
        return self.sshd.host_section(**{"known_hosts": self.known_hosts(), **overrides})


def pub(key: Path) -> str:
    return Path(f"{key}.pub").read_text().strip()


def sign(ca: Path, public_key: Path, principals: str, validity: str, *, host: bool = False) -> None:
    """``ssh-keygen -s``; empty ``principals``: no ``-n`` at all (valid for any name)."""
    command = ["ssh-keygen", "-q", "-s", str(ca), "-I", "sshadapter-test", "-V", validity]
    command += ["-h"] if host else []
    command += ["-n", principals] if principals else []
    subprocess.run([*command, str(public_key)], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def cert_host(host_principals: str) -> Iterator[CertHost]:
    """An sshd presenting a host certificate for ``host_principals`` (empty: none)."""
    require_sshd()
    cas: dict[str, Path] = {}

    def configure(workdir: Path) -> str:
        for name in ("host_ca", "user_ca"):
            cas[name] = workdir / name
            generate_key(cas[name], f"sshadapter-test-{name}")
        sign(
            cas["host_ca"],
            Path(f"{workdir}/host_key.pub"),
            host_principals,
            HOST_VALIDITY,
            host=True,
        )
        (workdir / "principals").write_text(f'restrict,command="echo {FORCED}" {PRINCIPAL}\n')
        (workdir / "principals").chmod(0o644)
        return (
            f"HostCertificate {workdir}/host_key-cert.pub\n"
            f"TrustedUserCAKeys {workdir}/user_ca.pub\n"
            f"AuthorizedPrincipalsFile {workdir}/principals\n"
        )

    with running_sshd(configure=configure) as sshd:
        yield CertHost(sshd, cas["host_ca"], cas["user_ca"])


@pytest.fixture(scope="module")
def host() -> Iterator[CertHost]:
    with cert_host("127.0.0.1") as server:
        yield server


# Host certificates ------------------------------------------------------------------------


def test_a_host_certificate_naming_the_address_is_accepted(host: CertHost) -> None:
    """One @cert-authority line pins a host whose certificate names its address."""
    assert run_one(host.section(), "echo ok").stdout == b"ok\n"


def test_a_host_certificate_without_principals_is_refused() -> None:
    """A certificate signed without -n, valid for any host to asyncssh, is refused."""
    with cert_host("") as bare:
        error = upstream_error(bare.section())
    assert (error.reason, error.retryable, error.ran) == ("host_certificate_refused", False, False)
    assert "Certificate has no principals" in error.detail


def test_a_host_certificate_for_another_name_is_refused() -> None:
    """A certificate for other.example does not pin 127.0.0.1."""
    with cert_host("other.example,10.0.0.1") as other:
        error = upstream_error(other.section())
    assert (error.reason, error.retryable) == ("host_certificate_refused", False)
    assert "Certificate principal mismatch" in error.detail


def test_a_revoked_host_key_is_refused(host: CertHost) -> None:
    """@revoked for the host's key refuses its valid certificate: never retried."""
    error = upstream_error(host.section(known_hosts=host.known_hosts(revoked=True)))
    assert (error.reason, error.retryable) == ("host_key_mismatch", False)
    assert "Host key is revoked" in error.detail


# User certificates ------------------------------------------------------------------------


def test_a_user_certificate_authenticates_and_the_principals_command_runs(
    host: CertHost,
) -> None:
    """The key with its certificate logs in; the principals file's command= runs, not ours."""
    cert = host.user_certificate("valid", validity="-5m:+1h")
    section = host.section(client_keys=(cert.parent / "valid",), certificate=str(cert))
    assert run_one(section, "echo not-this").stdout == f"{FORCED}\n".encode()


def test_a_certificate_from_systemd_credentials_authenticates(host: CertHost) -> None:
    """credential + credential_certificate, both read from $CREDENTIALS_DIRECTORY."""
    cert = host.user_certificate("cred", validity="-5m:+1h")
    section = host.section(client_keys=(), credential="cred", credential_certificate=cert.name)

    async def body(runner: Any) -> bytes:
        result = await runner.run(
            "h", "echo not-this", timeout=10.0, max_stdout=4096, max_stderr=4096
        )
        return bytes(result.stdout)

    stdout = with_runner({"h": section}, body, credentials_dir=cert.parent)
    assert stdout == f"{FORCED}\n".encode()


def test_a_certificate_the_host_refuses_is_a_clear_failure(host: CertHost) -> None:
    """A valid certificate for a principal the host does not list is refused, never retried.

    The bare key, which authorized_keys accepts, is not tried after it."""
    cert = host.user_certificate("stranger", validity="-5m:+1h", principal="someone-else")
    section = host.section(client_keys=(cert.parent / "stranger",), certificate=str(cert))
    error = upstream_error(section)
    assert (error.reason, error.retryable, error.ran) == (
        "client_certificate_refused",
        False,
        False,
    )
    assert "refused the client certificate" in error.detail


@pytest.mark.parametrize(
    ("validity", "says"),
    [("-2d:-1d", "certificate expired at"), ("+1d:+2d", "certificate not valid before")],
)
def test_an_expired_or_future_certificate_is_not_offered(
    host: CertHost, validity: str, says: str
) -> None:
    """Outside its validity window the certificate is refused before connecting."""
    cert = host.user_certificate("dated", validity=validity)
    section = host.section(client_keys=(cert.parent / "dated",), certificate=str(cert))
    error = upstream_error(section)
    assert (error.reason, error.retryable, error.ran) == (
        "client_certificate_invalid",
        False,
        False,
    )
    assert error.detail.startswith(says)


def test_check_hosts_names_an_expired_certificate(
    host: CertHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sshadapter check --hosts` names the host and its expired certificate: a miss."""
    cert = host.user_certificate("old", validity="-2d:-1d")
    (tmp_path / "commands").mkdir()
    config = tmp_path / "config.toml"
    root = Path(__file__).resolve().parents[2]
    hosts = host.sshd.host_toml(
        "edge",
        client_keys=[cert.parent / "old"],
        certificate=str(cert),
        known_hosts=host.known_hosts(),
    )
    config.write_text(
        f'[paths]\ncommands = "{tmp_path / "commands"}"\nschemas = "{root / "schemas"}"\n\n{hosts}'
    )
    assert cli_main(["check", "--config", str(config)]) == 0  # offline: certificates unread
    capsys.readouterr()
    assert cli_main(["check", "--config", str(config), "--hosts"]) == 1
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[:3] == ["edge", "certificate", f"{cert}:"]
    assert "certificate expired at" in line and line.endswith("MISS")
    assert cli_main(["check", "--config", str(config), "--hosts", "--json"]) == 1
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["kind"] == "client_certificate"]
    assert (row["case"], row["got"]["certificate"], row["ok"]) == ("edge", str(cert), False)


def test_the_expiry_gauge_shows_seconds_to_valid_before(host: CertHost) -> None:
    """sshadapter_credential_expiry_seconds{credential} is valid_before minus now."""
    before = int(time.time()) + 7200
    cert = host.user_certificate("gauge", validity=f"-5m:0x{before:x}")
    sections = {
        alias: host.section(client_keys=(cert.parent / "gauge",), certificate=str(cert))
        for alias in ("a", "b")  # two hosts, one credential: one series
    }

    async def scrape(runner: Any) -> tuple[float, bytes]:
        metrics = Metrics()
        metrics.watch_credentials(runner.credential_expiries)
        return time.time(), metrics.exposition()

    now, text = with_runner(sections, scrape)
    [family] = [
        f
        for f in text_string_to_metric_families(text.decode())
        if f.name == "sshadapter_credential_expiry_seconds"
    ]
    [sample] = family.samples
    assert sample.labels == {"credential": str(cert)}
    assert abs(sample.value - (before - now)) < EXPIRY_SLACK_SECONDS


def test_a_certificate_needs_exactly_one_key(tmp_path: Path) -> None:
    """A certificate beside two keys is a load error naming the host's key, in one line."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[hosts.edge]\naddress = "h"\nuser = "u"\nknown_hosts = "/k"\n'
        'client_keys = ["/a", "/b"]\ncertificate = "/a-cert.pub"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert "a certificate certifies one key" in str(caught.value)


def test_the_expiry_alerts_fire_six_hours_ahead_and_at_expiry(tmp_path: Path) -> None:
    """promtool test rules: 2 h left warns, past expiry is critical, a week or a day is quiet."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    rules = Path(__file__).resolve().parents[2] / "prometheus" / "sshadapter.rules.yml"
    series = 'sshadapter_credential_expiry_seconds{credential="%s"}'
    cases = tmp_path / "cases.yml"
    cases.write_text(
        f"""rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: '{series % "soon"}'
        values: '7200x5'
      - series: '{series % "gone"}'
        values: '-60x5'
      - series: '{series % "fine"}'
        values: '604800x5'
      - series: '{series % "one-day"}'
        values: '86340x5'
    alert_rule_test:
      - eval_time: 2m
        alertname: SshadapterClientCertificateExpiring
        exp_alerts:
          - exp_labels: {{severity: warning, credential: soon}}
            exp_annotations:
              summary: "sshadapter's client certificate soon expires in 2h 0m 0s"
              runbook_url: "https://github.com/sshadapter/sshadapter/blob/main/docs/runbooks.md#sshadapterclientcertificateexpiring"
      - eval_time: 2m
        alertname: SshadapterClientCertificateExpired
        exp_alerts:
          - exp_labels: {{severity: critical, credential: gone}}
            exp_annotations:
              summary: "sshadapter's client certificate gone has expired: calls fail"
              runbook_url: "https://github.com/sshadapter/sshadapter/blob/main/docs/runbooks.md#sshadapterclientcertificateexpired"
"""
    )
    checked = subprocess.run(
        [promtool, "test", "rules", str(cases)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
