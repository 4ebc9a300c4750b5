"""How an operator command reaches the controller: its address, TLS and bearer token.

`OperatorTarget` is the HOST:PORT string every operator command takes (so their `target: str`
stays as it is), carrying the channel credentials and the token read once from the flags:
--token-file ($GPUFLEET_TOKEN_FILE), --tls-ca, --tls-cert, --tls-key ($GPUFLEET_TLS_CA, _CERT, _KEY).
"""

from __future__ import annotations

import argparse
import collections
import string
from typing import Any

import grpc

from protos.transport import ClientTls, TransportError, is_loopback

TOKEN_FILE_ENV = "GPUFLEET_TOKEN_FILE"
TLS_ENV = {"tls_ca": "GPUFLEET_TLS_CA", "tls_cert": "GPUFLEET_TLS_CERT", "tls_key": "GPUFLEET_TLS_KEY"}
TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)


class CredentialError(Exception):
    """A token or TLS file cannot be used; one line naming it (exit status 2)."""


class OperatorTarget(str):
    """The controller's HOST:PORT, plus TLS credentials (None: plaintext) and a bearer token."""

    credentials: grpc.ChannelCredentials | None
    token: str | None

    def __new__(
        cls, address: str, *, credentials: grpc.ChannelCredentials | None = None, token: str | None = None
    ) -> OperatorTarget:
        self = super().__new__(cls, address)
        self.credentials = credentials
        self.token = token
        return self


def read_token(path: str) -> str:
    """The one token a token file holds (surrounding whitespace ignored)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read(64 * 1024).strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
        raise CredentialError(f"cannot read token file {path}: {why}") from None
    if not token:
        raise CredentialError(f"token file {path} is empty")
    if not set(token) <= TOKEN_CHARS:
        raise CredentialError(f"token file {path} must hold one token (printable ASCII, no spaces)")
    return token


def client_tls(ca: str | None, cert: str | None, key: str | None) -> ClientTls | None:
    """The TLS files as given (None: plaintext); CredentialError when they do not go together."""
    if (cert is None) != (key is None):
        raise CredentialError("--tls-cert and --tls-key go together")
    if ca is None:
        if cert is not None:
            raise CredentialError("--tls-cert and --tls-key need --tls-ca (the CA of the controller)")
        return None
    return ClientTls(ca, cert, key)


def operator_target(args: argparse.Namespace) -> OperatorTarget:
    """args.controller with the credentials its flags name, each file read now."""
    tls = client_tls(args.tls_ca or None, args.tls_cert or None, args.tls_key or None)
    try:
        credentials = tls.credentials() if tls is not None else None
    except TransportError as exc:
        raise CredentialError(str(exc)) from None
    token = read_token(args.token_file) if args.token_file else None
    if token is not None and credentials is None and not is_loopback(args.controller):
        # Whoever can see the traffic could replay the token: never send it in the clear off-host.
        raise CredentialError(
            f"refusing to send an operator token in plaintext to {args.controller}: give --tls-ca "
            f"(or ${TLS_ENV['tls_ca']}) with the controller's CA"
        )
    return OperatorTarget(args.controller, credentials=credentials, token=token)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    """Adds `authorization: Bearer <token>` to every call on the channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)
