"""Which node a telemetry stream may speak for: on TLS, the DNS names of its client certificate's
subjectAltName (protos.transport.node_names), never what its Hello says.

A certificate without a DNS name (an operator's, `gpufleet:operator:NAME` as a URI SAN) speaks for no
node. Each refusal is counted by reason for gpufleet_controller_identity_refusals_total; each
accepted stream records its transport ("mtls" or "plaintext") for `gpufleet nodes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from protos.transport import node_names

REASONS = ("other_node", "no_certificate", "no_node_name")
MTLS = "mtls"
PLAINTEXT = "plaintext"


class IdentityRefused(Exception):
    """The stream's certificate does not prove the Hello's node (PERMISSION_DENIED); `reason` is
    one of REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def stream_transport(auth_context: Mapping[str, Iterable[bytes]]) -> str:
    """ "mtls" when the connection is TLS (the port requires client certificates), else "plaintext"."""
    kinds = list(auth_context.get("transport_security_type", ()))
    return MTLS if b"ssl" in kinds else PLAINTEXT


def check_node(auth_context: Mapping[str, Iterable[bytes]], node: str) -> str:
    """The transport of a stream whose Hello says `node`; IdentityRefused when it is TLS and its
    client certificate is not for that node."""
    transport = stream_transport(auth_context)
    if transport == PLAINTEXT:
        return transport
    pems = list(auth_context.get("x509_pem_cert", ()))
    if not pems:
        raise IdentityRefused("no_certificate", "agents must present a client certificate for their node")
    names = node_names(pems[0])
    if not names:
        raise IdentityRefused(
            "no_node_name", "the client certificate names no node (no DNS subjectAltName): it cannot stream"
        )
    if node.lower() not in names:
        raise IdentityRefused(
            "other_node", f"certificate is for node(s) {', '.join(names)}, Hello says {node!r}"
        )
    return transport


class NodeIdentities:
    """What the controller learned from streams' transports: refusals by reason, and each node's
    transport (of its current stream, else its last one)."""

    def __init__(self) -> None:
        self.refusals: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.transports: dict[str, str] = {}

    def refused(self, reason: str) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def accepted(self, node: str, transport: str) -> None:
        self.transports[node] = transport
