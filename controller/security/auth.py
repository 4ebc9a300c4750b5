"""Who may call the Operator service: bearer tokens (tokens.py) checked against each method's role.

A call to /gpufleet.v1.Operator/* carries `authorization: Bearer <token>`. No token or an unknown one
is UNAUTHENTICATED; a token whose role is below the method's is PERMISSION_DENIED. Inside the
handler, `caller(context)` names the caller for the audit log ("alice (operator) from PEER").
Without a tokens file the API is open: every caller is "anonymous from PEER" with admin rights.
The Telemetry service is not checked here (agents prove who they are with certificates).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from controller.config import ControllerConfig
from controller.security.tokens import TokenStore, role_rank

log = logging.getLogger("gpufleet.controller.security")

SERVICE_PREFIX = "/gpufleet.v1.Operator/"
# Every method of the Operator service and the least role that may call it (a test walks the
# service descriptor: a new method without a role fails it, and the interceptor refuses it).
METHOD_ROLES: dict[str, str] = {
    "ListNodes": "viewer",
    "GetNode": "viewer",
    "ListFindings": "viewer",
    "ListCommands": "viewer",
    "GetBreaker": "viewer",
    "ListAudit": "viewer",
    "ListRecommendations": "viewer",
    "ListSilences": "viewer",
    "Record": "viewer",
    "ProbeNode": "operator",
    "Cordon": "operator",
    "Uncordon": "operator",
    "Drain": "operator",
    "Retune": "operator",
    "Approve": "operator",
    "AckFinding": "operator",
    "Silence": "operator",
    "Unsilence": "operator",
    "SetMaintenance": "operator",
    "ResetBreaker": "admin",
}
NO_TOKEN = "no operator token: give --token-file or GPUFLEET_TOKEN_FILE"
UNKNOWN_TOKEN = "unknown operator token"
BAD_HEADER = "authorization metadata must be 'Bearer <token>'"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made the call: a token's name and role, or anonymous (no tokens file), and the peer."""

    name: str | None
    role: str
    peer: str

    def __str__(self) -> str:
        if self.name is None:
            return f"anonymous from {self.peer}"
        return f"{self.name} ({self.role}) from {self.peer}"


_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("gpufleet_caller", default=None)


def current_caller() -> Caller | None:
    """The caller of the Operator call being handled, once the interceptor has checked it."""
    return _CALLER.get()


def caller(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The audit log's requester for the call being handled: "alice (operator) from PEER", or
    "anonymous from PEER" when the API is open."""
    who = _CALLER.get()
    return str(who) if who is not None else f"anonymous from {context.peer()}"


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    values = [v for k, v in metadata or () if k.lower() == "authorization"]
    if not values:
        return None
    if len(values) > 1 or not isinstance(values[0], str):
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, BAD_HEADER)
    scheme, _, token = values[0].strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, BAD_HEADER)
    return token.strip()


class OperatorAuth(grpc.aio.ServerInterceptor):  # type: ignore[type-arg] # generic only in the stubs
    """Checks each Operator call's token and role; `store` None: the API is open (anonymous admin)."""

    def __init__(self, store: TokenStore | None) -> None:
        self.store = store

    def check(self, method: str, metadata: tuple[tuple[str, str | bytes], ...] | None, peer: str) -> Caller:
        """The caller of `method` (a short name: Cordon); Refused when it may not call it."""
        if self.store is None:
            return Caller(None, "admin", peer)
        needed = METHOD_ROLES.get(method)
        if needed is None:  # fail closed: a method nobody gave a role to is nobody's
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{method} has no role: refused")
        token = _bearer(metadata)
        if token is None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, NO_TOKEN)
        entry = self.store.lookup(token)
        if entry is None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, UNKNOWN_TOKEN)
        if role_rank(entry.role) < role_rank(needed):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {entry.name} has role {entry.role}; {method} needs {needed}",
            )
        return Caller(entry.name, entry.role, peer)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        full = handler_call_details.method
        if handler is None or not full.startswith(SERVICE_PREFIX):
            return handler
        method = full[len(SERVICE_PREFIX) :]
        metadata = handler_call_details.invocation_metadata

        async def admit(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            try:
                who = self.check(method, metadata, context.peer())
            except Refused as exc:
                log.warning("%s from %s refused: %s", method, context.peer(), exc.details)
                await context.abort(exc.code, exc.details)
            # Each call runs in a task of its own (a copy of the context): nothing to reset after.
            _CALLER.set(who)

        return _wrap(handler, admit)


Admit = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]


def _wrap(handler: grpc.RpcMethodHandler[Any, Any], admit: Admit) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler, admitting the caller (or aborting) before it runs."""
    args = (handler.request_deserializer, handler.response_serializer)
    if handler.unary_unary or handler.stream_unary:
        inner_unary: Any = handler.unary_unary or handler.stream_unary  # async, whatever the stubs say

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await admit(context)
            return await inner_unary(request, context)

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(unary, *args)
        return grpc.stream_unary_rpc_method_handler(unary, *args)
    inner_stream: Any = handler.unary_stream or handler.stream_stream

    async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await admit(context)
        async for response in inner_stream(request, context):
            yield response

    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream, *args)
    return grpc.stream_stream_rpc_method_handler(stream, *args)


def operator_auth(config: ControllerConfig) -> OperatorAuth:
    """The interceptor for `config.operator_tokens` (TokenFileError when the file is unusable); with
    no file, an open API and a WARNING saying so."""
    if config.operator_tokens is None:
        log.warning("operator API is open: no --operator-tokens file, every caller acts as admin (anonymous)")
        return OperatorAuth(None)
    store = TokenStore(config.operator_tokens)
    log.info("operator tokens from %s: %d token(s)", config.operator_tokens, len(store.entries))
    return OperatorAuth(store)
