"""Throwaway CAs (trustme) written as PEM files, and a real TLS controller on 127.0.0.1 to test them on."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import trustme

from controller.app import ControllerApp
from controller.config import ControllerConfig, TlsConfig
from controller.listeners import Listeners
from controller.server import build_server
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from protos.transport import ClientTls
from tests.controller.harness import Clock

TIMEOUT = 10.0
LONG_AGO = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
EXPIRED = dt.datetime(2021, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True)
class ServerFiles:
    cert: str
    key: str
    client_ca: str

    def config(self) -> TlsConfig:
        return TlsConfig(cert=self.cert, key=self.key, client_ca=self.client_ca)


class Pki:
    """One CA and the files it signs, all under `root/name-*`."""

    def __init__(self, root: Path, name: str = "ca") -> None:
        self.root = root
        self.name = name
        self.ca = trustme.CA()
        self.ca_file = self._path("ca.crt")
        self.ca.cert_pem.write_to_path(self.ca_file)

    def _path(self, leaf: str) -> str:
        return str(self.root / f"{self.name}-{leaf}")

    def leaf(self, stem: str, *identities: str, expired: bool = False) -> tuple[str, str]:
        """(certificate chain file, key file) for `identities` (DNS names, IPs, e-mail addresses)."""
        window: dict[str, Any] = {"not_before": LONG_AGO, "not_after": EXPIRED} if expired else {}
        issued = self.ca.issue_cert(*identities, **window)
        cert, key = self._path(f"{stem}.crt"), self._path(f"{stem}.key")
        Path(cert).write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(key)
        return cert, key

    def server(self, *, expired: bool = False, client_ca: str | None = None) -> ServerFiles:
        """The controller's files for 127.0.0.1; clients signed by this CA (or `client_ca`)."""
        cert, key = self.leaf("controller", "127.0.0.1", "localhost", expired=expired)
        return ServerFiles(cert, key, client_ca or self.ca_file)

    def client(self, node: str | None, *, expired: bool = False, stem: str | None = None) -> ClientTls:
        """A client trusting this CA, with a certificate for `node` (a DNS SAN) signed by it; None:
        a certificate naming no node (an e-mail SAN only, as an operator's would)."""
        identity = node if node is not None else "operator@example.org"
        cert, key = self.leaf(stem or f"client-{node or 'operator'}", identity, expired=expired)
        return ClientTls(self.ca_file, cert, key)


def controller_config(tls: ServerFiles | None, **fields: Any) -> ControllerConfig:
    base: dict[str, Any] = {"listen": "127.0.0.1:0", "db": ":memory:", "metrics_address": None}
    if tls is not None:
        base["tls"] = tls.config()
    return ControllerConfig(**(base | fields))


@dataclass(slots=True)
class Controller:
    app: ControllerApp
    address: str
    operator_address: str | None


@contextlib.asynccontextmanager
async def tls_controller(
    config: ControllerConfig, clock: Callable[[], float] | None = None
) -> AsyncIterator[Controller]:
    """The agents' port, and the operators' when the config has operator_listen, until the block ends
    (clock: the harness's, at T0, unless given)."""
    app = ControllerApp(config, clock=clock or Clock())
    await app.start()
    servers: list[Listeners] = []
    try:
        server, address = await build_server(app)
        servers.append(server)
        operator_address = None
        if config.operator_listen is not None:
            operators, operator_address = await build_server(app, operator=True)
            servers.append(operators)
        yield Controller(app, address, operator_address)
    finally:
        for running in servers:
            await running.stop(None)
        app.close()


def channel(address: str, tls: ClientTls | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, tls.credentials())


class Refused(Exception):
    """The controller (or the TLS handshake) refused the stream: its gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


async def stream_one_frame(
    address: str, tls: ClientTls | None, hello: pb.Hello, frame: pb.TelemetryFrame
) -> pb.ControllerMessage:
    """Hello and one frame on a new connection: the controller's ack of it; Refused when the stream
    was refused.

    A synchronous client in a thread: grpc.aio turns a write that races the server's refusal into
    INTERNAL ("Internal error from Core") and loses the real status; the synchronous client keeps it.
    """
    return await asyncio.to_thread(_stream_one_frame, address, tls, hello, frame)


def _sync_channel(address: str, tls: ClientTls | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, tls.credentials())


def _stream_one_frame(
    address: str, tls: ClientTls | None, hello: pb.Hello, frame: pb.TelemetryFrame
) -> pb.ControllerMessage:
    held = threading.Event()

    def requests() -> Iterator[pb.AgentMessage]:
        yield pb.AgentMessage(hello=hello)
        yield pb.AgentMessage(frame=frame)
        held.wait(TIMEOUT)  # the stream stays open until the answer is in

    with _sync_channel(address, tls) as ch:
        answers: Any = telemetry_pb2_grpc.TelemetryStub(ch).Stream(requests(), timeout=TIMEOUT)  # also a call
        try:
            for answer in answers:  # a reconnecting node hears its acked position first
                assert isinstance(answer, pb.ControllerMessage)
                if answer.WhichOneof("msg") == "ack" and answer.ack.seq >= frame.seq:
                    return answer
        except grpc.RpcError as exc:
            call: Any = exc  # the error is also the call: code() and details()
            raise Refused(call.code(), call.details() or "") from None
        finally:
            held.set()
            answers.cancel()
    raise AssertionError("the stream ended without the frame's ack")
