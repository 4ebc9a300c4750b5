"""Exception -> gRPC status, in one place. Handlers raise domain errors; clients get a clear status;
anything unexpected is logged with its traceback and answered INTERNAL, never a crash."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from controller.errors import (
    ControllerError,
    FailedPrecondition,
    InvalidMessage,
    NotFound,
    RefusedFrame,
    ResourceExhausted,
    SequenceGap,
    StoreUnavailable,
)
from controller.operator_text import check_operator_text
from protos.refusal import REFUSED_FRAME, refused_frame_value

log = logging.getLogger("gpufleet.controller.rpc")

STATUS: dict[type[ControllerError], grpc.StatusCode] = {
    InvalidMessage: grpc.StatusCode.INVALID_ARGUMENT,
    SequenceGap: grpc.StatusCode.OUT_OF_RANGE,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    for kind, code in STATUS.items():
        if isinstance(exc, kind):
            return code, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error (see the controller log)"


async def _abort(context: grpc.aio.ServicerContext[Any, Any], method: str, exc: Exception) -> None:
    code, details = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    else:
        log.warning("%s: %s: %s", method, code.name, details)
    await context.abort(code, details, trailing_metadata=_refused_metadata(exc))


def _refused_metadata(exc: Exception) -> tuple[tuple[str, str], ...]:
    """`gpufleet-refused-frame: BOOT SEQ` for a frame refused for good: the agent sets it aside."""
    if isinstance(exc, RefusedFrame):
        value = refused_frame_value(exc.boot_id, exc.seq)
        if value is not None:
            return ((REFUSED_FRAME, value),)
    return ()


async def guarded(
    inner: Callable[[Any, Any], Awaitable[None]], requests: Any, context: Any, method: str
) -> None:
    """`inner`, a streaming handler on gRPC's reader/writer API, run; an error it raises ends the
    stream with its status (also for streams relayed by an ingest front, whose context stands in for
    gRPC's: controller/fronts/relay.py). gRPC's own errors (an abort, a write on a call the client
    left) go on to gRPC, which ends the call as it does for any handler."""
    try:
        await inner(requests, context)
    except grpc.aio.BaseError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a status, logged if unexpected
        await _abort(context, method, exc)


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg] # generic only in the stubs
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return handler
        if handler.unary_unary:
            inner_unary: Any = handler.unary_unary  # an async handler here, whatever the stubs say

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                try:
                    check_operator_text(request)  # every unary RPC is an operator's
                    return await inner_unary(request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status, logged if unexpected
                    await _abort(context, method, exc)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_stream:
            inner_stream: Any = handler.stream_stream  # the Telemetry stream, on the reader/writer API

            async def stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
                await guarded(inner_stream, requests, context, method)

            return grpc.stream_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        return handler
