"""Operator RPC Record: the fleet's stream as the controller ingests it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from controller.recording import Accepted
from protos.gpufleet.v1 import operator_pb2

if TYPE_CHECKING:
    from controller.app import ControllerApp


class RecordApi:
    """Mixed into OperatorServicer (which sets self.app)."""

    app: ControllerApp

    async def Record(
        self, request: operator_pb2.RecordRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[operator_pb2.RecordedMessage]:
        """The current Hello of every known node (or of request.node), received now; then every
        Hello and frame the controller accepts, as it accepts them, until the client hangs up. A
        reader that falls behind loses messages, counted in the next one's dropped_before."""
        with self.app.recording.subscribe(request.node) as subscription:
            # Taken before the first yield: anything accepted from here on is in the subscription.
            now = self.app.clock()
            nodes = self.app.fleet.nodes
            current = [
                Accepted(now, name, hello=nodes[name].hello).to_proto()
                for name in sorted(nodes)
                if not request.node or name == request.node
            ]
            for msg in current:
                yield msg
            while True:
                yield await subscription.get()
