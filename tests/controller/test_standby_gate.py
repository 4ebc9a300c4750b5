"""A standby's agents' port (controller/standby_gate.py): agents stream there while every operator
call, unary or streaming, is refused with UNAVAILABLE saying why; once the gate opens (it leads on
that port), the same server serves operators."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from controller.app import ControllerApp
from controller.server import STANDBY_REFUSAL, build_server
from controller.standby_gate import StandbyGate
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc, telemetry_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import Clock, config, hello
from tests.controller.store.test_store import run


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        if isinstance(call, grpc.aio.UnaryStreamCall):
            async for _ in call:
                pass
        else:
            await call  # type: ignore[misc]
    return refused.value


def test_operators_are_refused_until_the_gate_opens_while_agents_stream() -> None:
    async def go() -> None:
        app = ControllerApp(config(), clock=Clock())
        await app.start()
        gate = StandbyGate(STANDBY_REFUSAL)
        server, address = await build_server(app, gate=gate)
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                operators = operator_pb2_grpc.OperatorStub(channel)
                for call in (
                    operators.ListNodes(operator_pb2.ListNodesRequest(), timeout=5),
                    operators.Record(operator_pb2.RecordRequest(), timeout=5),
                ):
                    error = await _refused(call)
                    assert (error.code(), error.details()) == (grpc.StatusCode.UNAVAILABLE, STANDBY_REFUSAL)

                agents = telemetry_pb2_grpc.TelemetryStub(channel)
                stream = agents.Stream(None, timeout=5)
                await stream.write(pb.AgentMessage(hello=hello("n1")))
                await asyncio.wait_for(stream.initial_metadata(), 5)  # accepted: the agents' side is open
                assert "n1" in app.fleet.nodes
                stream.cancel()

                gate.open()
                listed = await operators.ListNodes(operator_pb2.ListNodesRequest(), timeout=5)
                assert [n.name for n in listed.nodes] == ["n1"]
        finally:
            await server.stop(None)
            app.close()

    run(go())
