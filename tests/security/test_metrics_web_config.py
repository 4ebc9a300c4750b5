"""The /metrics web-config file: what is refused at start (in one line), and the basic-auth cache."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.cli import main as agent_main
from controller.metrics_http import MetricsServer as ControllerMetricsServer
from protos.webconfig import BasicAuth, WebConfigError, load_web_config
from tests.security.metrics_servers import Pki, bcrypt_hash

GOOD_HASH = "$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basic_auth_user:\n  prom: x\n", "unknown or unsupported key 'basic_auth_user'"),
        ("rate_limit:\n  burst: 20\n", "unknown or unsupported key 'rate_limit'"),
        ("basic_auth_users:\n  prom: plaintext-password\n", "basic_auth_users.prom: not a bcrypt hash"),
        ("basic_auth_users:\n  prom: '$2y$10$short'\n", "basic_auth_users.prom: not a bcrypt hash"),
        ("basic_auth_users: [prom]\n", "basic_auth_users must be a mapping"),
        ("tls_server_config:\n  cert_file: a.pem\n", "cert_file and key_file are required"),
        ("- just\n- a list\n", "must be a mapping"),
        ("basic_auth_users: {prom: [\n", "not valid YAML at line"),
    ],
)
def test_bad_web_config_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError) as caught:
        load_web_config(str(path))
    assert message in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ("  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "unknown or unsupported key 'cipher_suites'"),
        ("  client_auth_type: RequireAnyClientCert\n", "'RequireAnyClientCert' is not supported"),
        ("  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        ("  min_version: TLS10\n", "min_version 'TLS10' is not supported"),
        ("  min_version: TLS13\n  max_version: TLS12\n", "min_version TLS13 is above max_version"),
    ],
)
def test_bad_tls_server_config_is_one_line(pki: Pki, tls: str, message: str) -> None:
    path = pki.dir / "web.yml"
    path.write_text(pki.tls_block() + tls)
    with pytest.raises(WebConfigError, match=message):
        load_web_config(str(path))


def test_unusable_tls_files_are_named(pki: Pki) -> None:
    path = pki.dir / "web.yml"
    (pki.dir / "server.key").write_text("not a key\n")
    path.write_text(pki.tls_block())
    with pytest.raises(
        WebConfigError, match=r"cannot load cert_file .*server\.pem with key_file .*server\.key"
    ):
        load_web_config(str(path))
    path.write_text(pki.tls_block().replace("server.pem", "missing.pem"))
    with pytest.raises(WebConfigError, match=r"missing\.pem"):
        load_web_config(str(path))
    with pytest.raises(WebConfigError, match=r"cannot read web config .*absent\.yml"):
        load_web_config(str(pki.dir / "absent.yml"))


def test_the_example_of_the_exporter_toolkit_loads(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: {GOOD_HASH}\n")
    assert dict(load_web_config(str(path)).users) == {"alice": GOOD_HASH.encode()}


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.make(tmp_path)


def test_agent_refuses_a_bad_web_config_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  prom: hunter2\n")
    code = agent_main(["--sim", "--metrics-address", "127.0.0.1:0", "--metrics-web-config", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        f"gpufleet agent: web config {path}: basic_auth_users.prom: not a bcrypt hash "
        '(make one with htpasswd -nBC 10 "")'
    ]


def test_controller_metrics_server_refuses_a_bad_web_config(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config: {cert_file: a, key_file: b, verbose: true}\n")
    server = ControllerMetricsServer(CollectorRegistry(), web_config=str(path))
    with pytest.raises(
        OSError, match=r"cannot serve metrics: web config .*unknown or unsupported key 'verbose'"
    ):
        asyncio.run(server.start("127.0.0.1:0"))


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_caches_successes_only() -> None:
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()})
    right, wrong = _basic("prom", "right"), _basic("prom", "wrong")
    assert not auth.cached(right)
    assert not auth.check(wrong) and not auth.cached(wrong)  # a failure is never remembered
    assert auth.check(right) and auth.cached(right)  # the next scrape skips bcrypt
    assert not auth.cached(wrong) and not auth.check(wrong)
    for header in (None, "", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()):
        assert not auth.check(header), header
    assert not auth.check(_basic("other", "right"))
