"""The operator API on a standby's agents' port (replica_ingest): refused until this replica leads.

A standby serves its agents on the port it will lead on, operator service and all, so that taking
the lead keeps their streams open (controller/server.py): until then every operator call is refused
with UNAVAILABLE, naming the replica that serves operators; once open, calls pass as on any leader.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

OPERATOR_SERVICE = "/gpufleet.v1.Operator/"


class StandbyGate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg] # generic only in the stubs
    def __init__(self, refusal: str) -> None:
        self.refusal: str | None = refusal  # None: open

    def open(self) -> None:
        self.refusal = None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        refusal = self.refusal
        if handler is None or refusal is None or not handler_call_details.method.startswith(OPERATOR_SERVICE):
            return handler

        async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)

        async def refuse_stream(
            _request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
            yield  # (a generator, as the interceptors around it iterate a streaming answer)

        kinds = (
            (handler.unary_unary, grpc.unary_unary_rpc_method_handler, refuse),
            (handler.unary_stream, grpc.unary_stream_rpc_method_handler, refuse_stream),
            (handler.stream_unary, grpc.stream_unary_rpc_method_handler, refuse),
            (handler.stream_stream, grpc.stream_stream_rpc_method_handler, refuse_stream),
        )
        make, answer = next((make, answer) for inner, make, answer in kinds if inner)
        return make(answer, handler.request_deserializer, handler.response_serializer)
