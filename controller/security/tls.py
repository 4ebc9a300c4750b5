"""The controller's TLS credentials, following the files: rotation without a restart.

gRPC asks `fetch` before every new TLS handshake; when the files' signature (mtime, size) changed
since the last look, they are read again and the new certificates serve that connection and the
next ones. A rotation caught half-way (a certificate whose key has not arrived yet) or a broken file
is logged once and the certificates in use are kept until the files change again. Open connections
keep the certificates they were made with.
"""

from __future__ import annotations

import logging
import threading

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from controller.config import TlsConfig
from protos.transport import TransportError, files_signature, read_pem

log = logging.getLogger("gpufleet.controller.tls")

Signature = tuple[tuple[int, int, int], ...]


def load_certificates(tls: TlsConfig) -> grpc.ServerCertificateConfiguration:
    """The files as gRPC wants them; TransportError naming the file when one is unusable, or when
    the key is not the certificate's."""
    assert tls.cert is not None and tls.key is not None and tls.client_ca is not None
    cert = read_pem(tls.cert, "tls.cert")
    key = read_pem(tls.key, "tls.key")
    client_ca = read_pem(tls.client_ca, "tls.client_ca")
    _check_pair(cert, key, tls.cert, tls.key)
    _check_certificates(client_ca, "tls.client_ca", tls.client_ca)
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca)


def _check_pair(cert: bytes, key: bytes, cert_path: str, key_path: str) -> None:
    certificate = _check_certificates(cert, "tls.cert", cert_path)
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise TransportError(f"tls.key {key_path} is not a usable private key: {exc}") from None
    pem = serialization.Encoding.PEM
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(pem, spki) != certificate.public_key().public_bytes(pem, spki):
        raise TransportError(f"tls.key {key_path} is not the key of tls.cert {cert_path}")


def _check_certificates(data: bytes, what: str, path: str) -> x509.Certificate:
    """The first certificate of a PEM bundle; TransportError when there is none that parses."""
    try:
        return x509.load_pem_x509_certificates(data)[0]
    except ValueError as exc:
        raise TransportError(f"{what} {path} holds no usable certificate: {exc}") from None


class ServerTls:
    """Server credentials for the gRPC ports, re-read when tls.cert, tls.key or tls.client_ca change.

    Built from files checked now (TransportError when one is unusable: the controller does not start).
    `credentials(client_certificates=True)` makes every client present a certificate signed by
    tls.client_ca (the agents' port); False asks for none (the operators' port, tokens instead).
    """

    def __init__(self, tls: TlsConfig) -> None:
        self.tls = tls
        self._paths = [tls.cert, tls.key, tls.client_ca]
        self._lock = threading.Lock()
        self._signature: Signature = files_signature(self._paths)
        self._current = load_certificates(tls)
        self.reloads = 0  # successful reloads since start
        self.failures = 0  # rotations refused (a broken file): the old certificates were kept

    def credentials(self, *, client_certificates: bool) -> grpc.ServerCredentials:
        seen = [self._current]  # this port's certificates: each port's TLS context changes on its own

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            latest = self.latest()
            if latest is seen[0]:
                return None
            seen[0] = latest
            return latest

        return grpc.dynamic_ssl_server_credentials(
            self._current,
            fetch,  # type: ignore[arg-type] # None (no change) is allowed; the stubs say otherwise
            require_client_authentication=client_certificates,
        )

    def latest(self) -> grpc.ServerCertificateConfiguration:
        """The certificates to use now: the files read again when they changed since the last look."""
        with self._lock:
            signature = files_signature(self._paths)
            if signature == self._signature:
                return self._current
            self._signature = signature
            try:
                self._current = load_certificates(self.tls)
            except TransportError as exc:
                self.failures += 1
                log.error("TLS files changed but cannot be used, keeping the certificates in use: %s", exc)
                return self._current
            self.reloads += 1
            log.info("TLS certificates reloaded from %s", ", ".join(p for p in self._paths if p))
            return self._current
