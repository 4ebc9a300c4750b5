"""`gpufleet certs`: the files it makes work for a real mutual-TLS gRPC handshake on 127.0.0.1, carry
the identities the controller reads (a node's name as its only DNS SAN, an operator's none), keep
their keys private, and bad requests are refused in one line with exit status 2."""

from __future__ import annotations

import asyncio
import datetime as dt
import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from controller.main import main
from protos.transport import ClientTls, node_names
from tests.support import free_port

METHOD = "/gpufleet.test.Echo/Who"


def certs(capsys: pytest.CaptureFixture[str], pki: Path, *args: str) -> tuple[int, str, str]:
    """`gpufleet certs ARGS --dir PKI`: (exit status, stdout, stderr)."""
    code = main(["certs", *args, "--dir", str(pki)])
    out, err = capsys.readouterr()
    return code, out, err


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def usages(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


@pytest.fixture
def pki(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A CA, the default controller certificate, nodes gpu-1 and gpu-2, operator alice."""
    directory = tmp_path / "pki"
    for args in (["ca"], ["controller"], ["node", "gpu-1", "gpu-2"], ["operator", "alice"]):
        code, _, err = certs(capsys, directory, *args)
        assert code == 0, err
    return directory


async def who_is_calling(pki: Path, client: ClientTls) -> str:
    """Start a gRPC server that requires client certificates signed by the PKI's CA, call it with
    `client`'s files and return the DNS names the server read from the client's certificate."""

    def who(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        (pem,) = context.auth_context()["x509_pem_cert"]
        return ",".join(node_names(pem)).encode() or b"(no DNS name)"

    handler = grpc.method_handlers_generic_handler(
        "gpufleet.test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(who)}
    )
    credentials = grpc.ssl_server_credentials(
        [((pki / "controller.key").read_bytes(), (pki / "controller.crt").read_bytes())],
        root_certificates=(pki / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handler])
    port = server.add_secure_port(f"127.0.0.1:{free_port()}", credentials)
    await server.start()
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", client.credentials()) as channel:
            answer = await channel.unary_unary(METHOD, None, None)(b"", timeout=10)
        assert isinstance(answer, bytes)
        return answer.decode()
    finally:
        await server.stop(None)


def test_a_node_certificate_makes_a_mutual_tls_handshake_and_names_its_node(pki: Path) -> None:
    client = ClientTls(
        str(pki / "ca.crt"), str(pki / "nodes" / "gpu-2.crt"), str(pki / "nodes" / "gpu-2.key")
    )
    assert asyncio.run(who_is_calling(pki, client)) == "gpu-2"


def test_an_operator_certificate_is_accepted_but_names_no_node(pki: Path) -> None:
    operator = pki / "operators" / "alice"
    client = ClientTls(str(pki / "ca.crt"), f"{operator}.crt", f"{operator}.key")
    assert asyncio.run(who_is_calling(pki, client)) == "(no DNS name)"


def test_without_a_client_certificate_the_handshake_is_refused(pki: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(who_is_calling(pki, ClientTls(str(pki / "ca.crt"))))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_certificate_of_another_ca_is_refused(
    pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    assert certs(capsys, other, "ca")[0] == 0
    assert certs(capsys, other, "node", "gpu-1")[0] == 0
    client = ClientTls(
        str(pki / "ca.crt"), str(other / "nodes" / "gpu-1.crt"), str(other / "nodes" / "gpu-1.key")
    )
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(who_is_calling(pki, client))


def test_each_certificate_carries_the_identity_and_usage_it_is_for(pki: Path) -> None:
    ca = load(pki / "ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    node = load(pki / "nodes" / "gpu-1.crt")
    assert node_names((pki / "nodes" / "gpu-1.crt").read_bytes()) == ["gpu-1"]
    assert list(sans(node)) == [x509.DNSName("gpu-1")]
    assert usages(node) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert node.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    operator = load(pki / "operators" / "alice.crt")
    assert node_names((pki / "operators" / "alice.crt").read_bytes()) == []
    assert list(sans(operator)) == [x509.UniformResourceIdentifier("gpufleet:operator:alice")]
    assert usages(operator) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    controller = load(pki / "controller.crt")
    assert usages(controller) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert sans(controller).get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans(controller).get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for cert in (node, operator, controller):
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)


def test_the_controller_certificate_has_exactly_the_names_given(
    pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = certs(
        capsys, pki, "controller", "--name", "gf.example.com", "--name", "gf", "--ip", "10.0.0.1", "--force"
    )
    assert code == 0, err
    names = sans(load(pki / "controller.crt"))
    assert names.get_values_for_type(x509.DNSName) == ["gf.example.com", "gf"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]


def test_keys_are_private_and_certificates_readable(pki: Path) -> None:
    for key in [
        pki / "ca.key",
        pki / "controller.key",
        *(pki / "nodes").glob("*.key"),
        *(pki / "operators").glob("*.key"),
    ]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    for cert in pki.rglob("*.crt"):
        assert stat.S_IMODE(cert.stat().st_mode) == 0o644, cert
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    assert {p.name for p in pki.rglob("*")} >= {"gpu-1.crt", "gpu-1.key", "gpu-2.crt", "gpu-2.key"}
    assert not list(pki.rglob(".*.tmp"))


def test_validity_follows_days_and_never_outlives_the_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tmp_path / "pki"
    assert certs(capsys, pki, "ca", "--days", "10")[0] == 0
    assert certs(capsys, pki, "node", "gpu-1", "--days", "365")[0] == 0
    assert certs(capsys, pki, "node", "gpu-2", "--days", "2")[0] == 0
    ca = load(pki / "ca.crt")
    assert load(pki / "nodes" / "gpu-1.crt").not_valid_after_utc == ca.not_valid_after_utc
    short = load(pki / "nodes" / "gpu-2.crt")
    lifetime = short.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=1) < lifetime <= dt.timedelta(days=2)


def test_without_a_ca_nothing_is_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = tmp_path / "pki"
    code, out, err = certs(capsys, pki, "node", "gpu-1")
    assert (code, out) == (2, "")
    assert err == f"gpufleet certs: no CA in {pki}: run `gpufleet certs ca --dir {pki}` first\n"
    assert not pki.exists()


def test_existing_files_are_kept_unless_forced(pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p: p.read_bytes() for p in pki.rglob("*") if p.is_file()}
    for args in (["ca"], ["controller"], ["operator", "alice"], ["node", "gpu-9", "gpu-1"]):
        code, out, err = certs(capsys, pki, *args)
        assert (code, out) == (2, ""), args
        assert err.startswith("gpufleet certs: ") and err.endswith("exists: --force replaces it\n"), err
    assert {p: p.read_bytes() for p in pki.rglob("*") if p.is_file()} == before  # gpu-9 not made either
    code, out, _ = certs(capsys, pki, "node", "gpu-1", "--force")
    assert code == 0 and out.split() == [str(pki / "nodes" / "gpu-1.crt"), str(pki / "nodes" / "gpu-1.key")]
    assert (pki / "nodes" / "gpu-1.key").read_bytes() != before[pki / "nodes" / "gpu-1.key"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["node"], "`gpufleet certs node` needs at least one node name"),
        (["node", "../etc/x"], "node name '../etc/x' is not a DNS name"),
        (["node", "gpu-1", "GPU-1"], "a node name is given twice"),
        (["node", "gpu-1", "--name", "x"], "--name and --ip go with `gpufleet certs controller`"),
        (["operator"], "`gpufleet certs operator` takes exactly one name"),
        (["operator", "a b"], "operator name 'a b' must be"),
        (["controller", "gf"], "takes --name DNS and --ip IP, not names"),
        (["controller", "--ip", "10.0.0.300"], "--ip '10.0.0.300' is not an IP address"),
        (["controller", "--name=-bad"], "--name '-bad' is not a DNS name"),
        (["ca", "x"], "`gpufleet certs ca` takes no names"),
        (["node", "gpu-3", "--days", "0"], "--days must be at least 1"),
    ],
)
def test_bad_requests_get_one_line_and_exit_2(
    pki: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = certs(capsys, pki, *args)
    assert (code, out) == (2, "")
    assert err.startswith("gpufleet certs: ") and message in err and err.count("\n") == 1, err


def test_a_key_that_is_not_the_cas_is_refused(
    pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    assert certs(capsys, other, "ca")[0] == 0
    (pki / "ca.key").write_bytes((other / "ca.key").read_bytes())
    code, _, err = certs(capsys, pki, "node", "gpu-3")
    assert code == 2 and err == f"gpufleet certs: {pki / 'ca.key'} is not the key of {pki / 'ca.crt'}\n"
