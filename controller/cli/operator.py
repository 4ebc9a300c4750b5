"""Operator commands: `gpufleet nodes`, `gpufleet node NAME`, `gpufleet findings`.

Each returns a process exit code. A controller that cannot be reached (or that answers with an
error) gives one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence, Sized
from typing import Any, Protocol, TypeVar

import grpc
from rich.console import Console
from rich.text import Text

from controller.cli import finding_view, gpu_tables, tables
from controller.cli.bmc_view import bmc_section
from controller.cli.credentials import BearerToken
from controller.cli.jsonify import finding_to_dict, message_to_dict
from controller.cli.layout import clean, show
from controller.cli.output import DOCUMENT_FORMATS, print_document
from protos.gpufleet.v1 import findings_pb2, operator_pb2, operator_pb2_grpc
from protos.names import clock_event_reason_names

TIMEOUT_S = 10.0
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
T = TypeVar("T")
R = TypeVar("R")


class OperatorError(Exception):
    """One line for stderr; `code` is the gRPC status behind it, if any."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


def call_operator(target: str, fn: Callable[[operator_pb2_grpc.OperatorStub], T]) -> T:
    """fn(stub) over a channel to `target`: TLS and a bearer token when `target` is an OperatorTarget
    carrying them. A refused call is an OperatorError: one line, its status in `code`."""
    credentials = getattr(target, "credentials", None)
    token = getattr(target, "token", None)
    try:
        with (
            grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
        ) as channel:
            stub_channel = grpc.intercept_channel(channel, BearerToken(token)) if token else channel
            return fn(operator_pb2_grpc.OperatorStub(stub_channel))
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise OperatorError(f"not authenticated: {details}", code) from None
        if code == grpc.StatusCode.PERMISSION_DENIED:
            raise OperatorError(f"permission denied: {details}", code) from None
        if code in UNREACHABLE:
            hint = "" if credentials else " (if the controller uses TLS, give --tls-ca or $GPUFLEET_TLS_CA)"
            raise OperatorError(
                f"cannot reach controller at {target}: {details or code.name}{hint}", code
            ) from None
        raise OperatorError(f"controller at {target} answered {code.name}: {details}", code) from None


def of_known_node(stub: operator_pb2_grpc.OperatorStub, node: str, items: Sized) -> None:
    """For a list filtered by --node that came back empty: a node this controller does not know is
    NOT_FOUND (an OperatorError from call_operator), so that a mistyped name does not read as a
    node with nothing to show. A known node with nothing listed, or any listed item, passes."""
    if node and not len(items):
        stub.GetNode(operator_pb2.GetNodeRequest(name=node), timeout=TIMEOUT_S)


def node_list(stub: operator_pb2_grpc.OperatorStub, node: str, response: R, field: str) -> R:
    """`response` (a List... answer filtered by `node`), once of_known_node passed its `field`."""
    of_known_node(stub, node, getattr(response, field))
    return response


def _run(action: Callable[[], None]) -> int:
    try:
        action()
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)  # details may quote node text
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


class _Page(Protocol):
    @property
    def next_page_token(self) -> str: ...


P = TypeVar("P", bound=_Page)


def all_pages(fetch: Callable[[str], P]) -> list[P]:
    """Every page of a list: fetch("") first, then fetch(next_page_token) until it is empty."""
    pages = [fetch("")]
    seen: set[str] = set()
    while token := pages[-1].next_page_token:
        if token in seen:  # a controller that loops would keep us here forever
            raise OperatorError("the controller answered the same page twice: the list is incomplete")
        seen.add(token)
        pages.append(fetch(token))
    return pages


def warn(text: str) -> None:
    """The controller's own security warning, loud on stderr (stdout stays a clean document)."""
    if text:
        Console(stderr=True, highlight=False).print(Text(f"WARNING: {text}", style="bold"), soft_wrap=True)


def list_nodes(target: str) -> tuple[str, list[operator_pb2.NodeSummary]]:
    """Every node the controller knows, worst first, and the controller's security warning."""
    pages = call_operator(
        target,
        lambda s: all_pages(
            lambda token: s.ListNodes(operator_pb2.ListNodesRequest(page_token=token), timeout=TIMEOUT_S)
        ),
    )
    return pages[-1].warning, worst_first([n for page in pages for n in page.nodes])


def nodes(target: str, output: str) -> int:
    def action() -> None:
        warning, ordered = list_nodes(target)
        warn(warning)
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
        parts += finding_view.findings_detail(detail.findings)
        if detail.HasField("kubernetes"):
            from controller.cli.kube_view import kube_section

            parts += kube_section(detail.kubernetes, wide=wide)
        show(*parts)

    return _run(action)


def findings(
    target: str,
    output: str,
    node: str = "",
    include_resolved: bool = False,
    *,
    include_silenced: bool = False,
    since: str = "",
) -> int:
    """`gpufleet findings`: active findings; `include_resolved` and `include_silenced` (--all) add the
    resolved and the silenced; `since` (a duration back from now, 90s, 30m, 2h, 1d, or an RFC 3339
    time) lists what was open at any moment since then, resolved ones included. A `since` that does
    not parse is one line on stderr and exit status 2."""
    request = operator_pb2.ListFindingsRequest(
        node=node, include_resolved=include_resolved or bool(since), include_silenced=include_silenced
    )
    if since:
        from controller.cli.since import set_since

        if not set_since(request.since, since):
            return 2

    def action() -> None:
        def page(stub: operator_pb2_grpc.OperatorStub, token: str) -> operator_pb2.ListFindingsResponse:
            paged = operator_pb2.ListFindingsRequest()
            paged.CopyFrom(request)
            paged.page_token = token
            return stub.ListFindings(paged, timeout=TIMEOUT_S)

        def fetch(stub: operator_pb2_grpc.OperatorStub) -> tuple[str, list[findings_pb2.Finding]]:
            # ListFindings carries no warning: the smallest ListNodes answer brings it.
            warning = stub.ListNodes(operator_pb2.ListNodesRequest(page_size=1), timeout=TIMEOUT_S).warning
            return warning, [f for p in all_pages(lambda token: page(stub, token)) for f in p.findings]

        def checked(stub: operator_pb2_grpc.OperatorStub) -> tuple[str, list[findings_pb2.Finding]]:
            warning, found = fetch(stub)
            of_known_node(stub, node, found)
            return warning, found

        warning, found = call_operator(target, checked)
        warn(warning)
        if output in DOCUMENT_FORMATS:
            print_document({"findings": [finding_to_dict(f) for f in found]}, output)
        else:
            where = f" on {node}" if node else ""
            shown = "none" if include_resolved or since else "none active"
            show(tables.findings_table(found, wide=output == "wide", empty=f"{shown}{where}"))

    return _run(action)
