"""Configuration: the example file loads, unknown keys are named, the environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from sshadapter.config import Config, load_config
from sshadapter.contract.registry import load_registry
from sshadapter.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "config.example.toml"


def test_example_config_documents_every_key_with_its_default() -> None:
    """config.example.toml loads, and each section shown is at its default."""
    config, _ = load_config(EXAMPLE)
    defaults = Config()
    for section in ("server", "audit", "metrics", "logging"):
        assert getattr(config, section) == getattr(defaults, section), section
    text = EXAMPLE.read_text()
    for section in ("server", "paths", "audit", "metrics", "logging"):
        for key in type(getattr(defaults, section)).model_fields:
            # a key whose default is "unset" (None) is shown commented out
            shown = f"\n{key} = " in text or f"\n# {key} = " in text
            assert shown, f"{section}.{key} is not documented"


def test_example_config_loads_the_shipped_commands() -> None:
    """Paths are relative to the config file, and every host alias used exists."""
    config, _ = load_config(EXAMPLE)
    registry = load_registry(config.paths.commands, config.paths.schemas, hosts=config.hosts.keys())
    assert "job_run_status" in registry.operations


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    """A typo in a key is an error naming the file and the dotted key."""
    path = tmp_path / "c.toml"
    path.write_text("[server]\nmax_concurent_calls = 8\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.file, info.value.key, info.value.reason) == (
        str(path),
        "server.max_concurent_calls",
        "unknown key",
    )


def test_there_is_no_switch_for_host_key_checking(tmp_path: Path) -> None:
    """known_hosts is required and no key can turn checking off."""
    path = tmp_path / "c.toml"
    path.write_text(
        '[hosts.a]\naddress = "h"\nuser = "u"\nknown_hosts = "/k"\n'
        "strict_host_key_checking = false\n"
    )
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(path)
    path.write_text('[hosts.a]\naddress = "h"\nuser = "u"\n')
    with pytest.raises(ConfigError, match=r"hosts\.a\.known_hosts: required key is missing"):
        load_config(path)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSHADAPTER_SERVER__MAX_CONCURRENT_CALLS beats the file's value."""
    path = tmp_path / "c.toml"
    path.write_text("[server]\nmax_concurrent_calls = 4\n")
    monkeypatch.setenv("SSHADAPTER_SERVER__MAX_CONCURRENT_CALLS", "9")
    assert load_config(path)[0].server.max_concurrent_calls == 9


def test_metrics_listen_is_loopback_only(tmp_path: Path) -> None:
    """Metrics on 0.0.0.0 would publish tool names to the network: refused."""
    path = tmp_path / "c.toml"
    path.write_text('[metrics]\nlisten = "0.0.0.0:9464"\n')
    with pytest.raises(ConfigError, match=r"metrics\.listen"):
        load_config(path)


def test_bad_toml_is_one_clear_error(tmp_path: Path) -> None:
    """A syntax error names the file and says it is not valid TOML."""
    path = tmp_path / "c.toml"
    path.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[server]\nmax_concurrent_calls = "8"\n', "server.max_concurrent_calls"),
        ('[server]\nidle_timeout_seconds = "60"\n', "server.idle_timeout_seconds"),
        ("[audit]\nquarantine_max_bytes = 1024.0\n", "audit.quarantine_max_bytes"),
    ],
)
def test_a_file_value_of_the_wrong_type_is_an_error(tmp_path: Path, text: str, key: str) -> None:
    """The file is read strictly: a quoted number is no number; the file and key are named."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.file, info.value.key) == (str(path), key)


def test_environment_overrides_are_text_and_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SSHADAPTER_SERVER__MAX_CONCURRENT_CALLS=8 overrides the file: environment values are text."""
    path = tmp_path / "c.toml"
    path.write_text("[server]\nmax_concurrent_calls = 4\n")
    monkeypatch.setenv("SSHADAPTER_SERVER__MAX_CONCURRENT_CALLS", "8")
    config, _ = load_config(path)
    assert config.server.max_concurrent_calls == 8
