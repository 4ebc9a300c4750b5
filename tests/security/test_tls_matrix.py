"""Mutual TLS on a real controller (127.0.0.1): who is refused, who gets in, and which node it may be.

Each case is a fresh controller with throwaway CAs (trustme); a client says Hello and sends one
frame. Only a certificate signed by the controller's client CA, valid now and naming the Hello's
node in a DNS subjectAltName, gets its frame stored and acked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from controller.metrics import controller_registry
from controller.security.warning import security_warning
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.transport import ClientTls
from tests.controller.harness import frame, hello
from tests.security.tls_files import (
    Pki,
    Refused,
    channel,
    controller_config,
    stream_one_frame,
    tls_controller,
)


def refusals(app: object) -> dict[str, float]:
    """gpufleet_controller_identity_refusals_total by reason, as Prometheus scrapes it."""
    text = generate_latest(controller_registry(app)).decode()  # type: ignore[arg-type]
    out = {}
    for line in text.splitlines():
        if line.startswith("gpufleet_controller_identity_refusals_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('reason="')[1].split('"')[0]] = float(value)
    return out


async def list_nodes(address: str, tls: ClientTls | None) -> operator_pb2.ListNodesResponse:
    async with channel(address, tls) as ch:
        return await operator_pb2_grpc.OperatorStub(ch).ListNodes(operator_pb2.ListNodesRequest(), timeout=10)


def test_the_right_certificate_streams_a_frame_and_the_node_shows_mtls(tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            answer = await stream_one_frame(ctl.address, pki.client("n1"), hello("n1"), frame(1))
            assert answer.WhichOneof("msg") == "ack" and answer.ack.seq == 1
            assert ctl.app.ingest.counters.frames == 1
            # Operators on the agents' port present a client certificate too (theirs names no node).
            nodes = await list_nodes(ctl.address, pki.client(None))
            assert [(n.name, n.transport) for n in nodes.nodes] == [("n1", "mtls")]
            assert refusals(ctl.app) == {"no_certificate": 0, "no_node_name": 0, "other_node": 0}

    asyncio.run(scenario())


def test_a_dns_name_matches_whatever_its_case(tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            answer = await stream_one_frame(
                ctl.address, pki.client("gpu-07"), hello("GPU-07"), frame(1, "GPU-07")
            )
            assert answer.ack.seq == 1

    asyncio.run(scenario())


def _plaintext(pki: Pki, other: Pki) -> ClientTls | None:
    return None


def _wrong_ca(pki: Pki, other: Pki) -> ClientTls | None:
    """A certificate for n1 from another CA, trusting that CA: neither side accepts the other."""
    return other.client("n1")


def _trusts_wrong_ca(pki: Pki, other: Pki) -> ClientTls | None:
    """The right client certificate, but the client does not trust the controller's CA."""
    right = pki.client("n1")
    return ClientTls(other.ca_file, right.cert, right.key)


def _expired_client(pki: Pki, other: Pki) -> ClientTls | None:
    return pki.client("n1", expired=True)


def _no_client_certificate(pki: Pki, other: Pki) -> ClientTls | None:
    return ClientTls(pki.ca_file)


REFUSED_AT_HANDSHAKE: dict[str, Callable[[Pki, Pki], ClientTls | None]] = {
    "plaintext client": _plaintext,
    "certificate from another CA": _wrong_ca,
    "client trusts another CA": _trusts_wrong_ca,
    "expired client certificate": _expired_client,
    "no client certificate": _no_client_certificate,
}


@pytest.mark.parametrize("case", sorted(REFUSED_AT_HANDSHAKE))
def test_refused_before_any_message(tmp_path: Path, case: str) -> None:
    pki, other = Pki(tmp_path, "ca"), Pki(tmp_path, "other")
    client = REFUSED_AT_HANDSHAKE[case](pki, other)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            with pytest.raises(Refused) as refused:
                await stream_one_frame(ctl.address, client, hello("n1"), frame(1))
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert ctl.app.ingest.counters.frames == 0
            assert "n1" not in ctl.app.fleet.nodes

    asyncio.run(scenario())


def test_an_expired_controller_certificate_is_refused_by_the_client(tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server(expired=True))) as ctl:
            with pytest.raises(Refused) as refused:
                await stream_one_frame(ctl.address, pki.client("n1"), hello("n1"), frame(1))
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert ctl.app.ingest.counters.frames == 0

    asyncio.run(scenario())


def test_a_certificate_for_another_node_is_permission_denied_and_counted(tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            stolen = pki.client("n2")
            for _ in range(2):
                with pytest.raises(Refused) as refused:
                    await stream_one_frame(ctl.address, stolen, hello("n1"), frame(1))
                assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
                assert refused.value.details == "certificate is for node(s) n2, Hello says 'n1'"
            assert "n1" not in ctl.app.fleet.nodes and ctl.app.ingest.counters.frames == 0
            assert refusals(ctl.app)["other_node"] == 2
            # The same certificate speaks for its own node.
            assert (await stream_one_frame(ctl.address, stolen, hello("n2"), frame(1, "n2"))).ack.seq == 1

    asyncio.run(scenario())


def test_a_certificate_without_a_dns_name_speaks_for_no_node(tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def scenario() -> None:
        async with tls_controller(controller_config(pki.server())) as ctl:
            with pytest.raises(Refused) as refused:
                await stream_one_frame(ctl.address, pki.client(None), hello("n1"), frame(1))
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert "names no node" in (refused.value.details or "")
            assert refusals(ctl.app)["no_node_name"] == 1

    asyncio.run(scenario())


def test_the_operator_port_serves_operators_and_refuses_streams(tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def scenario() -> None:
        cfg = controller_config(pki.server(), operator_listen="127.0.0.1:0")
        async with tls_controller(cfg) as ctl:
            assert ctl.operator_address is not None and ctl.operator_address != ctl.address
            await stream_one_frame(ctl.address, pki.client("n1"), hello("n1"), frame(1))
            server_only = ClientTls(pki.ca_file)  # no client certificate: operators bring tokens
            nodes = await list_nodes(ctl.operator_address, server_only)
            assert [(n.name, n.transport) for n in nodes.nodes] == [("n1", "mtls")]
            for client in (server_only, pki.client("n2")):
                with pytest.raises(Refused) as refused:
                    await stream_one_frame(ctl.operator_address, client, hello("n2"), frame(1, "n2"))
                assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
                assert (
                    refused.value.details == "agents must connect to the agent port with a client certificate"
                )
            assert "n2" not in ctl.app.fleet.nodes
            with pytest.raises(grpc.aio.AioRpcError) as plaintext:
                await list_nodes(ctl.operator_address, None)
            assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())


def test_a_plaintext_controller_records_plaintext_and_warns() -> None:
    async def scenario() -> None:
        cfg = controller_config(None)
        async with tls_controller(cfg) as ctl:
            await stream_one_frame(ctl.address, None, hello("n1"), frame(1))
            nodes = await list_nodes(ctl.address, None)
            assert [(n.name, n.transport) for n in nodes.nodes] == [("n1", "plaintext")]
        assert "plaintext gRPC" in security_warning(cfg)

    asyncio.run(scenario())


def test_security_warning_names_each_weakness(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    tokens = str(tmp_path / "tokens.yaml")
    assert security_warning(controller_config(pki.server(), operator_tokens=tokens)) == ""
    only_tokens = security_warning(controller_config(pki.server()))
    assert "operator API without tokens" in only_tokens and "plaintext" not in only_tokens
    both = security_warning(controller_config(None))
    assert "plaintext gRPC" in both and "operator API without tokens" in both and "\n" not in both
    assert security_warning(controller_config(None, operator_tokens=tokens)).startswith("plaintext gRPC")
