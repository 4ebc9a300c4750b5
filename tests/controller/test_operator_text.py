"""Operators' reasons and comments are at most MAX_OPERATOR_TEXT characters (controller/operator_text.py),
over real gRPC on 127.0.0.1: a longer one is refused as INVALID_ARGUMENT before anything is done or
stored; one at the limit goes through."""

from __future__ import annotations

import asyncio

import grpc

from controller.operator_text import MAX_OPERATOR_TEXT
from protos.gpufleet.v1 import operator_pb2
from tests.controller.remediate.test_retune import fleet_of_five
from tests.controller.test_probe_node import status_of
from tests.controller.test_silences_api import audit, controller, summary


def test_a_reason_or_comment_past_the_limit_is_refused_and_nothing_is_done() -> None:
    async def go() -> None:
        async with controller() as (running, stub, _):
            await fleet_of_five(running.app)
            long = "x" * (MAX_OPERATOR_TEXT + 1)
            code, details = await status_of(
                stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="n0", on=True, comment=long))
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert (
                details == f"comment is {MAX_OPERATOR_TEXT + 1} characters long; at most {MAX_OPERATOR_TEXT}"
            )
            assert not (await summary(stub, "n0")).maintenance and await audit(stub, "maintenance") == []
            code, details = await status_of(stub.ResetBreaker(operator_pb2.ResetBreakerRequest(reason=long)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("reason is ")
            # At the limit, counted in characters (not bytes): accepted, stored and shown as given.
            comment = "é" * MAX_OPERATOR_TEXT
            await stub.SetMaintenance(operator_pb2.SetMaintenanceRequest(node="n0", on=True, comment=comment))
            shown = await summary(stub, "n0")
            assert shown.maintenance and shown.maintenance_comment == comment

    asyncio.run(go())
