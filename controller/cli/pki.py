"""A small lab PKI in one directory (what `gpufleet certs` makes): a CA, the controller's server
certificate, one client certificate per node and operator client certificates.

    DIR/ca.crt, ca.key                     the CA
    DIR/controller.crt, .key               serverAuth, SANs: the controller's DNS names and IPs
    DIR/nodes/NODE.crt, .key               clientAuth, the node name as the only DNS SAN
    DIR/operators/NAME.crt, .key           clientAuth, no DNS SAN: only the URI gpufleet:operator:NAME

The controller takes a node's identity from the DNS names of its certificate's subjectAltName
(protos.transport.node_names), so a node certificate carries its node name and nothing else, and an
operator certificate carries no DNS name at all: it can never speak for a node. Keys are ECDSA P-256
in files of mode 0600; existing files are replaced only with `force`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controller.cli.certs import CA_DAYS, KINDS, LEAF_DAYS

DEFAULT_CONTROLLER_NAMES = ("localhost",)
DEFAULT_CONTROLLER_IPS = ("127.0.0.1",)
OPERATOR_URI = "gpufleet:operator:{}"
# A node name is a DNS name (RFC 1123 labels, as Kubernetes node names are).
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
OPERATOR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
CLOCK_SKEW = dt.timedelta(minutes=5)  # certificates are valid from a little before now


class CertsError(Exception):
    """A one-line reason the command cannot do what was asked."""


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its key, as PEM, to be written as `<stem>.crt` and `<stem>.key`."""

    stem: Path
    cert: bytes
    key: bytes


def make(
    kind: str,
    names: list[str],
    *,
    directory: Path,
    days: int | None = None,
    dns: list[str] | None = None,
    ips: list[str] | None = None,
    force: bool = False,
    now: dt.datetime | None = None,
) -> list[Path]:
    """Make what `kind` says in `directory`; the paths written. CertsError for bad input."""
    dns, ips = dns or [], ips or []
    if kind not in KINDS:
        raise CertsError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    if days is not None and days < 1:
        raise CertsError("--days must be at least 1")
    if kind != "controller" and (dns or ips):
        raise CertsError("--name and --ip go with `gpufleet certs controller`")
    now = now or dt.datetime.now(dt.UTC)
    if kind == "ca":
        if names:
            raise CertsError("`gpufleet certs ca` takes no names")
        issued = [_issue_ca(now, days or CA_DAYS, directory / "ca")]
    else:
        ca = load_ca(directory)
        leaves = _leaves(kind, names, directory, dns, ips)
        issued = [
            _issue_leaf(ca, stem, cn, sans, server=kind == "controller", now=now, days=days or LEAF_DAYS)
            for stem, cn, sans in leaves
        ]
    return _write(issued, directory, force)


def _leaves(
    kind: str, names: list[str], directory: Path, dns: list[str], ips: list[str]
) -> list[tuple[Path, str, list[x509.GeneralName]]]:
    """(file stem, common name, subjectAltNames) of each certificate `kind` makes."""
    if kind == "controller":
        if names:
            raise CertsError("`gpufleet certs controller` takes --name DNS and --ip IP, not names")
        return [(directory / "controller", "gpufleet controller", _controller_sans(dns, ips))]
    if kind == "node":
        return [(directory / "nodes" / n, n, [x509.DNSName(n)]) for n in _node_names(names)]
    name = _operator_name(names)
    uri = x509.UniformResourceIdentifier(OPERATOR_URI.format(name))
    return [(directory / "operators" / name, f"gpufleet operator {name}", [uri])]


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA in `directory` (ca.crt, ca.key); CertsError when there is none or it is unusable."""
    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    if not cert_path.exists() or not key_path.exists():
        raise CertsError(f"no CA in {directory}: run `gpufleet certs ca --dir {directory}` first")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise CertsError(f"cannot use the CA in {directory}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise CertsError(f"{key_path} is not the key of {cert_path}")
    return cert, key


def _node_names(names: list[str]) -> list[str]:
    if not names:
        raise CertsError("`gpufleet certs node` needs at least one node name")
    for name in names:
        if not DNS_NAME.match(name):
            raise CertsError(f"node name {name!r} is not a DNS name (letters, digits, '-' and '.')")
    if len({n.lower() for n in names}) != len(names):
        raise CertsError("a node name is given twice")
    return names


def _operator_name(names: list[str]) -> str:
    if len(names) != 1:
        raise CertsError("`gpufleet certs operator` takes exactly one name")
    if not OPERATOR_NAME.match(names[0]):
        raise CertsError(f"operator name {names[0]!r} must be letters, digits, '.', '_' and '-'")
    return names[0]


def _controller_sans(dns: list[str], ips: list[str]) -> list[x509.GeneralName]:
    if not dns and not ips:
        dns, ips = list(DEFAULT_CONTROLLER_NAMES), list(DEFAULT_CONTROLLER_IPS)
    sans: list[x509.GeneralName] = []
    for name in dns:
        if not DNS_NAME.match(name):
            raise CertsError(f"--name {name!r} is not a DNS name")
        sans.append(x509.DNSName(name))
    for text in ips:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError:
            raise CertsError(f"--ip {text!r} is not an IP address") from None
    return sans


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _issue_ca(now: dt.datetime, days: int, stem: Path) -> Issued:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet lab CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(stem, cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _issue_leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    stem: Path,
    common_name: str,
    sans: list[x509.GeneralName],
    *,
    server: bool,
    now: dt.datetime,
    days: int,
) -> Issued:
    ca_cert, ca_key = ca
    if ca_cert.not_valid_after_utc <= now:
        raise CertsError(f"the CA expired on {ca_cert.not_valid_after_utc:%Y-%m-%d}: make a new one")
    key = _new_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(stem, cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write(issued: list[Issued], directory: Path, force: bool) -> list[Path]:
    """Write every certificate (0644) and key (0600); nothing at all when one would be replaced
    without `force`."""
    files = [(i.stem.with_name(f"{i.stem.name}.crt"), i.cert, 0o644) for i in issued]
    files += [(i.stem.with_name(f"{i.stem.name}.key"), i.key, 0o600) for i in issued]
    existing = [str(path) for path, _, _ in files if path.exists()]
    if existing and not force:
        raise CertsError(f"{existing[0]} exists: --force replaces it")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds the CA's key
        for path, data, mode in files:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            _write_file(path, data, mode)
    except OSError as exc:
        raise CertsError(f"cannot write in {directory}: {exc.strerror or exc}") from None
    return [path for path, _, _ in sorted(files, key=lambda f: str(f[0]))]


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with `data` atomically, created with `mode` (a key is never world-readable,
    not even for a moment)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as out:
        out.write(data)
        os.fchmod(out.fileno(), mode)  # the umask may have taken bits off a certificate's 0644
    os.replace(tmp, path)
