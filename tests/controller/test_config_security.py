"""The controller's transport rules: TLS files go together, plaintext only on loopback or when
chosen explicitly (`--insecure`, `tls: off`), and the limits' bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import ConfigError, load
from protos.transport import is_loopback


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:1", True),
        ("127.9.9.9:1", True),
        ("[::1]:50051", True),
        ("localhost:50051", True),
        ("0.0.0.0:50051", False),
        ("10.0.0.1:50051", False),
        ("[::]:50051", False),
        ("controller.example:50051", False),
    ],
)
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_plaintext_on_a_reachable_address_must_be_chosen() -> None:
    with pytest.raises(ConfigError, match=r"not a loopback address.*--insecure"):
        load(None, {"listen": "0.0.0.0:50051"})
    config = load(None, {"listen": "0.0.0.0:50051", "insecure": True})
    assert config.plaintext and config.insecure


def test_tls_off_in_yaml_is_the_explicit_choice(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("listen: 0.0.0.0:50051\ntls: off\n")
    config = load(str(path))
    assert config.insecure and config.plaintext


def test_tls_files_go_together() -> None:
    tls = {"cert": "c.pem", "key": "k.pem", "client_ca": "ca.pem"}
    config = load(None, {"listen": "0.0.0.0:50051", "tls": tls})
    assert config.tls.enabled and not config.plaintext
    with pytest.raises(ConfigError, match=r"tls\.cert and tls\.key go together"):
        load(None, {"tls": {"cert": "c.pem"}})
    with pytest.raises(ConfigError, match=r"tls\.client_ca is required"):
        load(None, {"tls": {"cert": "c.pem", "key": "k.pem"}})
    with pytest.raises(ConfigError, match="exclude each other"):
        load(None, {"tls": tls, "insecure": True})


def test_operator_port_follows_the_same_rule() -> None:
    with pytest.raises(ConfigError, match=r"operator_listen 0\.0\.0\.0:50052 is not a loopback address"):
        load(None, {"operator_listen": "0.0.0.0:50052"})
    assert load(None, {"operator_listen": "127.0.0.1:0"}).operator_listen == "127.0.0.1:0"


@pytest.mark.parametrize(
    ("limits", "where"),
    [
        ({"max_nodes": 0}, "max_nodes"),
        ({"page_size": 0}, "page_size"),
        ({"forget_after_seconds": -1}, "forget_after_seconds"),
        ({"max_clock_skew_seconds": 0}, "max_clock_skew_seconds"),
    ],
)
def test_limits_are_checked(limits: dict[str, float], where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        load(None, {"limits": limits})
