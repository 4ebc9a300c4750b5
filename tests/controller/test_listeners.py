"""Several gRPC servers on the agents' port (controller/listeners.py): the kernel spreads the
connections over them, each serves what the port serves, and a bind that fails leaves nothing
listening."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from controller.listeners import REUSEPORT, Listeners, listen_on, taken_by_another
from controller.server import build_server
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from tests.controller.harness import config, frame, hello, running_controller

WHO = "/test.Listeners/Who"
# A connection of its own per channel, as each agent has (gRPC otherwise shares one between channels
# to the same address in a process).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


Build = Callable[[], grpc.aio.Server]
Bind = Callable[[grpc.aio.Server, str], int]


def _builder(made: list[grpc.aio.Server]) -> tuple[Build, Bind]:
    """A build that makes servers answering Who with their number, and a plain insecure bind."""

    def build() -> grpc.aio.Server:
        number = len(made)

        async def who(_request: bytes, _context: object) -> bytes:
            return str(number).encode()

        server = grpc.aio.server(options=[REUSEPORT])
        handler = grpc.unary_unary_rpc_method_handler(who)  # bytes as they are, both ways
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.Listeners", {"Who": handler}),)
        )
        made.append(server)
        return server

    def bind(server: grpc.aio.Server, where: str) -> int:
        return server.add_insecure_port(where)

    return build, bind


async def _who(address: str) -> str:
    """Which server answered, over a connection of its own."""
    async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as channel:
        who = channel.unary_unary(WHO)  # type: ignore[call-arg] # no serializers: bytes as they are
        answer = await who(b"", timeout=10)
    return bytes(answer).decode()


def _free(port: int) -> bool:
    """Whether a socket without SO_REUSEPORT can bind the port (nothing listens there). With
    SO_REUSEADDR: the connections just closed may leave the port's side of theirs in TIME_WAIT,
    which only a listening socket's bind is refused for (Linux)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE, exc
            return False
    return True


def test_the_connections_are_spread_over_servers_on_one_port() -> None:
    async def go() -> None:
        made: list[grpc.aio.Server] = []
        build, bind = _builder(made)
        listeners, address = await listen_on("127.0.0.1:0", 4, build, bind)
        try:
            assert len(listeners.servers) == 4 and address.startswith("127.0.0.1:")
            answered = await asyncio.gather(*(_who(address) for _ in range(40)))
            # 40 connections all hashed to one of 4 servers: about 4 in 10^24
            assert len(set(answered)) >= 2, answered
            assert set(answered) <= {"0", "1", "2", "3"}
        finally:
            await listeners.stop(None)
        assert _free(int(address.rpartition(":")[2]))

    asyncio.run(go())


def test_a_bind_that_fails_halfway_leaves_nothing_listening() -> None:
    async def go() -> None:
        made: list[grpc.aio.Server] = []
        build, plain = _builder(made)
        bound: list[int] = []

        def bind(server: grpc.aio.Server, where: str) -> int:
            if len(bound) == 2:
                return 0  # as gRPC answers a port it could not bind
            bound.append(plain(server, where))
            return bound[-1]

        with pytest.raises(OSError, match=r"cannot listen on 127\.0\.0\.1:"):
            await listen_on("127.0.0.1:0", 4, build, bind)
        assert len(made) == 3 and len(set(bound)) == 1
        assert _free(bound[0])  # the two started were stopped

    asyncio.run(go())


def test_a_port_another_socket_holds_is_an_error() -> None:
    async def go() -> None:
        with socket.socket() as taken:  # no SO_REUSEPORT: nobody may share it
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            build, bind = _builder([])
            with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port}"):
                await listen_on(f"127.0.0.1:{port}", 2, build, bind)

    asyncio.run(go())


def test_a_port_another_grpc_server_listens_on_is_refused_though_both_share_ports() -> None:
    """gRPC sets SO_REUSEPORT: before, a second controller on the first one's port started without
    an error, and the kernel spread the agents over two controllers and two stores."""

    async def go() -> None:
        other = grpc.aio.server(options=[REUSEPORT])  # another process's controller, say
        port = other.add_insecure_port("127.0.0.1:0")
        await other.start()
        try:
            assert taken_by_another(f"127.0.0.1:{port}").startswith("already in use")
            build, bind = _builder([])
            with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port}: already in use"):
                await listen_on(f"127.0.0.1:{port}", 2, build, bind)
        finally:
            await other.stop(None)
        assert taken_by_another(f"127.0.0.1:{port}") == ""  # once it is gone, the port is free

    asyncio.run(go())


def test_a_restarted_controller_is_not_refused_for_its_old_connections_in_time_wait() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
            client.recv(1)
    assert taken_by_another(f"127.0.0.1:{port}") == ""
    assert taken_by_another("127.0.0.1:0") == ""  # the OS picks a free one


def test_a_unix_socket_gets_one_server(tmp_path: Path) -> None:
    async def go() -> None:
        made: list[grpc.aio.Server] = []
        build, bind = _builder(made)
        listeners, _ = await listen_on(f"unix:{tmp_path}/agents.sock", 4, build, bind)
        try:
            assert len(listeners.servers) == 1
            assert await _who(f"unix:{tmp_path}/agents.sock") == "0"
        finally:
            await listeners.stop(None)

    asyncio.run(go())


def test_every_listener_of_a_controller_takes_agents_and_the_operator_port_has_one(tmp_path: Path) -> None:
    """listeners: 3 on the agents' port: 24 agents on connections of their own (the kernel spreads
    them over the three servers) each get their frame acked by the one app; the operators' port is
    one server."""

    async def stream(address: str, node: str) -> int:
        async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as channel:
            messages = [pb.AgentMessage(hello=hello(node)), pb.AgentMessage(frame=frame(1, node))]
            call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(iter(messages))
            async for message in call:
                if message.WhichOneof("msg") == "ack" and message.ack.seq == 1:
                    call.cancel()
                    return message.ack.seq
        return 0

    async def go() -> None:
        cfg = config(listeners=3, operator_listen="127.0.0.1:0")
        async with running_controller(cfg) as running:
            assert isinstance(running.server, Listeners) and len(running.server.servers) == 3
            acked = await asyncio.gather(*(stream(running.address, f"n{i:02d}") for i in range(24)))
            assert acked == [1] * 24
            assert len(running.app.fleet.nodes) == 24
            operators, _ = await build_server(running.app, operator=True)
            try:
                assert len(operators.servers) == 1
            finally:
                await operators.stop(None)

    asyncio.run(go())
