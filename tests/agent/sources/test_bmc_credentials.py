"""BMC credentials come from a file, a mounted secret or the environment, in that order."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.sources.redfish.credentials import ENV_PASSWORD, ENV_USERNAME, load_credentials
from agent.sources.redfish.session import BmcError, Credentials


def test_nothing_configured_means_anonymous() -> None:
    assert load_credentials(environ={}) is None


def test_password_file_loses_only_its_trailing_newline(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text(" s3cret \n")
    secret.chmod(0o600)
    creds = load_credentials(username="root", password_file=str(secret), environ={ENV_PASSWORD: "env"})
    assert creds == Credentials("root", " s3cret ")
    assert "s3cret" not in repr(creds)  # never in a log line or a traceback


def test_mounted_secret_then_environment(tmp_path: Path) -> None:
    (tmp_path / "username").write_text("admin\n")
    (tmp_path / "password").write_text("from-secret")
    env = {ENV_USERNAME: "env-user", ENV_PASSWORD: "env-pw"}
    assert load_credentials(credentials_dir=str(tmp_path), environ=env) == Credentials("admin", "from-secret")
    assert load_credentials(environ=env) == Credentials("env-user", "env-pw")
    assert load_credentials(username="cfg", environ=env) == Credentials("cfg", "env-pw")


def test_half_a_pair_or_an_unreadable_file_is_a_clear_config_error(tmp_path: Path) -> None:
    with pytest.raises(BmcError, match="no password") as exc:
        load_credentials(username="root", environ={})
    assert exc.value.kind == "config"
    with pytest.raises(BmcError, match="no username"):
        load_credentials(environ={ENV_PASSWORD: "x"})
    with pytest.raises(BmcError, match=r"cannot read the BMC password from .*missing"):
        load_credentials(username="root", password_file=str(tmp_path / "missing"), environ={})
    with pytest.raises(BmcError, match="does not exist"):
        load_credentials(credentials_dir=str(tmp_path / "nope"), environ={})


def test_world_readable_password_file_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x")
    secret.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.bmc"):
        load_credentials(username="root", password_file=str(secret), environ={})
    assert "readable by every user" in caplog.text
