"""How agent, controller and CLI secure the gRPC transport: one rule for what plaintext is allowed,
one way to read the PEM files, one way to see that they changed.

Part of the contract: a node's identity is a DNS name in its certificate's subjectAltName
(`node_names`), never what its Hello says.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc


class TransportError(Exception):
    """A TLS file is missing, unreadable or not PEM; the message names the file."""


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT names a loopback host (127.0.0.0/8, ::1, localhost)."""
    host = address.rpartition(":")[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_pem(path: str, what: str) -> bytes:
    """The file's bytes; TransportError naming `what` and the path when it cannot be used."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TransportError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TransportError(f"{what} {path} is not a PEM file")
    return data


def files_signature(paths: Sequence[str | None]) -> tuple[tuple[int, int, int], ...]:
    """(inode, mtime_ns, size) of each file (missing: (0, 0, 0)): compare two to see a rotation; a
    rewrite in place and a rename over the file (a Kubernetes Secret's update) both change it."""
    out = []
    for path in paths:
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append((st.st_ino, st.st_mtime_ns, st.st_size) if st else (0, 0, 0))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """A client's TLS files: the CA that signed the server's certificate, and optionally the
    client's own certificate and key (mutual TLS)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials read from the files now (TransportError when one is unusable)."""
        import grpc  # not at import: agent.config reads is_loopback and must stay light

        root = read_pem(self.ca, "CA file")
        cert = read_pem(self.cert, "certificate") if self.cert else None
        key = read_pem(self.key, "key") if self.key else None
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)

    def signature(self) -> tuple[tuple[int, int, int], ...]:
        return files_signature([self.ca, self.cert, self.key])


def node_names(pem_cert: bytes) -> list[str]:
    """The DNS names in a certificate's subjectAltName: the nodes it may speak for (lower case)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem_cert)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [name.lower() for name in san.get_values_for_type(x509.DNSName)]
