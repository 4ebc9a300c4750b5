"""Operator commands: `gpufleet nodes`, `gpufleet node NAME`, `gpufleet findings`.

Each returns a process exit code. A controller that cannot be reached (or that answers with an
error) gives one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from rich.text import Text

from controller.cli import gpu_tables, tables
from controller.cli.bmc_view import bmc_section
from controller.cli.jsonify import finding_to_dict, message_to_dict
from controller.cli.layout import show
from controller.cli.output import DOCUMENT_FORMATS, print_document
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.names import clock_event_reason_names

TIMEOUT_S = 10.0
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
T = TypeVar("T")


class OperatorError(Exception):
    """One line for stderr; `code` is the gRPC status behind it, if any."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


def call_operator(target: str, fn: Callable[[operator_pb2_grpc.OperatorStub], T]) -> T:
    try:
        with grpc.insecure_channel(target) as channel:
            return fn(operator_pb2_grpc.OperatorStub(channel))
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code in UNREACHABLE:
            raise OperatorError(
                f"cannot reach controller at {target}: {details or code.name}", code
            ) from None
        raise OperatorError(f"controller at {target} answered {code.name}: {details}", code) from None


def _run(action: Callable[[], None]) -> int:
    try:
        action()
    except OperatorError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 1
    return 0


def print_json(obj: Any) -> None:
    print_document(obj, "json")


# worst first: critical, degraded, stale, then the rest (healthy, unknown); by name within each
HEALTH_RANK = {
    operator_pb2.NODE_HEALTH_CRITICAL: 0,
    operator_pb2.NODE_HEALTH_DEGRADED: 1,
    operator_pb2.NODE_HEALTH_STALE: 2,
}


def worst_first(nodes: Sequence[operator_pb2.NodeSummary]) -> list[operator_pb2.NodeSummary]:
    return sorted(nodes, key=lambda n: (HEALTH_RANK.get(n.health, len(HEALTH_RANK)), n.name))


def nodes(target: str, output: str) -> int:
    def action() -> None:
        resp = call_operator(
            target, lambda s: s.ListNodes(operator_pb2.ListNodesRequest(), timeout=TIMEOUT_S)
        )
        ordered = worst_first(resp.nodes)
        if output in DOCUMENT_FORMATS:
            print_document({"nodes": [message_to_dict(n) for n in ordered]}, output)
        else:
            show(tables.nodes_table(ordered, wide=output == "wide"))

    return _run(action)


def node_to_dict(detail: operator_pb2.NodeDetail) -> dict[str, Any]:
    """`gpufleet node NAME -o json`: the NodeDetail, findings shaped as `findings -o json` prints them,
    and each GPU's clock-event reasons decoded next to the raw bitmask."""
    out: dict[str, Any] = message_to_dict(detail)
    for gpu_out, gpu in zip(out.get("gpus", []), detail.gpus, strict=True):
        gpu_out["clock_event_reason_names"] = clock_event_reason_names(gpu.clock_event_reasons)
    out["findings"] = [finding_to_dict(f) for f in detail.findings]
    return out


def node(target: str, name: str, output: str) -> int:
    def action() -> None:
        try:
            detail = call_operator(
                target, lambda s: s.GetNode(operator_pb2.GetNodeRequest(name=name), timeout=TIMEOUT_S)
            )
        except OperatorError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                raise OperatorError(f"node {name} not found") from None
            raise
        if output in DOCUMENT_FORMATS:
            print_document(node_to_dict(detail), output)
            return
        wide = output == "wide"
        parts: list[Any] = [tables.nodes_table([detail.summary], wide=wide)]
        if detail.hello.HasField("host"):
            h = detail.hello.host
            parts.append(
                Text(f"host {h.hostname}: {h.os}, kernel {h.kernel}, {h.cpu_count} CPUs ({h.cpu_model})")
            )
        if detail.hello.probes or detail.hello.probe_infos:
            parts.append(Text(gpu_tables.probes_offered(detail.hello)))
        parts.append(gpu_tables.gpus_table(detail.gpus, wide=wide))
        if detail.HasField("bmc"):
            parts.append(bmc_section(detail.bmc, detail.gpus))
        if detail.probes:
            units = gpu_tables.units_of(detail.hello)
            parts.append(gpu_tables.probes_table(detail.probes, wide=wide, units=units))
        parts.append(tables.findings_table(detail.findings, title="Active findings", wide=wide))
        if detail.HasField("kubernetes"):
            from controller.cli.kube_view import kube_section

            parts += kube_section(detail.kubernetes, wide=wide)
        show(*parts)

    return _run(action)


def findings(target: str, output: str, node: str = "", include_resolved: bool = False) -> int:
    def action() -> None:
        request = operator_pb2.ListFindingsRequest(node=node, include_resolved=include_resolved)
        resp = call_operator(target, lambda s: s.ListFindings(request, timeout=TIMEOUT_S))
        if output in DOCUMENT_FORMATS:
            print_document({"findings": [finding_to_dict(f) for f in resp.findings]}, output)
        else:
            show(tables.findings_table(resp.findings, wide=output == "wide"))

    return _run(action)
