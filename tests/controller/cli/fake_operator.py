"""An in-process Operator service on port 0 that answers from lists and records every request, for
CLI tests that need to see exactly what the CLI asked (ListFindings.since, ListAudit.node, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message

from protos.gpufleet.v1 import findings_pb2, operator_pb2


@dataclass
class FakeOperator:
    """The four read RPCs the operator views use; any other RPC is UNIMPLEMENTED."""

    nodes: list[operator_pb2.NodeSummary] = field(default_factory=list)
    findings: list[findings_pb2.Finding] = field(default_factory=list)
    audit: list[operator_pb2.AuditEntry] = field(default_factory=list)
    known: set[str] = field(default_factory=set)  # GetNode answers these; NOT_FOUND otherwise
    warning: str = ""
    fail: grpc.StatusCode | None = None  # every call aborts with this while set
    requests: list[tuple[str, Message]] = field(default_factory=list)

    def _record(self, name: str, request: Message, context: Any) -> None:
        self.requests.append((name, request))
        if self.fail is not None:
            context.abort(self.fail, f"fake says {self.fail.name}")

    def asked(self, name: str) -> list[Any]:
        return [r for n, r in self.requests if n == name]

    def ListNodes(self, request: Any, context: Any) -> operator_pb2.ListNodesResponse:
        self._record("ListNodes", request, context)
        return operator_pb2.ListNodesResponse(nodes=self.nodes, warning=self.warning, total=len(self.nodes))

    def ListFindings(self, request: Any, context: Any) -> operator_pb2.ListFindingsResponse:
        self._record("ListFindings", request, context)
        return operator_pb2.ListFindingsResponse(findings=self.findings)

    def ListAudit(self, request: Any, context: Any) -> operator_pb2.ListAuditResponse:
        self._record("ListAudit", request, context)
        return operator_pb2.ListAuditResponse(entries=self.audit)

    def GetNode(self, request: Any, context: Any) -> operator_pb2.NodeDetail:
        self._record("GetNode", request, context)
        if request.name not in self.known:
            context.abort(grpc.StatusCode.NOT_FOUND, f"node {request.name!r} is not known")
        return operator_pb2.NodeDetail(summary=operator_pb2.NodeSummary(name=request.name))


RPCS: dict[str, tuple[type[Message], type[Message]]] = {
    "ListNodes": (operator_pb2.ListNodesRequest, operator_pb2.ListNodesResponse),
    "ListFindings": (operator_pb2.ListFindingsRequest, operator_pb2.ListFindingsResponse),
    "ListAudit": (operator_pb2.ListAuditRequest, operator_pb2.ListAuditResponse),
    "GetNode": (operator_pb2.GetNodeRequest, operator_pb2.NodeDetail),
}


@contextmanager
def serving(fake: FakeOperator) -> Iterator[str]:
    """Serve `fake` as gpufleet.v1.Operator on a loopback port; yields its address."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(fake, name),
            request_deserializer=request.FromString,
            response_serializer=reply.SerializeToString,
        )
        for name, (request, reply) in RPCS.items()
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("gpufleet.v1.Operator", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)
