"""`gpufleet probe-node NAME`: ask the controller to have a connected node probe now, show the results.

Exit status: 0 every probe ran; 1 a probe failed, the node did not answer in time, or the controller
could not be reached; 2 bad arguments, an unknown node, or one that cannot probe now (not connected,
no probes, already probing).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import grpc

from controller.cli.gpu_tables import probe_run_table
from controller.cli.jsonify import message_to_dict
from controller.cli.layout import clean, show
from controller.cli.operator import OperatorError, call_operator
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.waiting import waited
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc

USAGE_ERRORS = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
)
RPC_MARGIN_S = 10.0  # the RPC's deadline beyond the wait the controller is asked for


def response_to_dict(node: str, resp: operator_pb2.ProbeNodeResponse) -> dict[str, Any]:
    """`probe-node -o json`: stable keys; results as `gpufleet node -o json` prints probe results."""
    return {
        "node": node,
        "command_id": resp.command_id,
        "done": resp.done,
        "ok": resp.ok,
        "error": resp.error,
        "results": [message_to_dict(r) for r in resp.results],
    }


def _wait(stub: operator_pb2_grpc.OperatorStub, request: operator_pb2.ProbeNodeRequest) -> Any:
    """The RPC, with a progress line on stderr while it runs when stderr is a terminal."""
    deadline = (request.timeout_seconds if request.wait else 0.0) + RPC_MARGIN_S
    call: Any = stub.ProbeNode.future(request, timeout=deadline)  # a grpc.Future; untyped in the stubs
    if not request.wait:
        return call.result()
    return waited(call, f"probing {request.node}", request.timeout_seconds)


def probe_node(
    target: str,
    node: str,
    output: str,
    *,
    probes: list[str],
    gpus: list[int],
    force: bool,
    wait: bool,
    timeout: float,
) -> int:
    if not 0 < timeout < math.inf:
        print("gpufleet probe-node: --timeout must be a finite number of seconds > 0", file=sys.stderr)
        return 2
    if any(g < 0 for g in gpus):
        print("gpufleet probe-node: --gpu must be a GPU index (>= 0)", file=sys.stderr)
        return 2
    request = operator_pb2.ProbeNodeRequest(
        node=node, probes=probes, gpus=gpus, force=force, wait=wait, timeout_seconds=timeout
    )
    try:
        resp: operator_pb2.ProbeNodeResponse = call_operator(target, lambda stub: _wait(stub, request))
    except OperatorError as exc:
        if exc.code == grpc.StatusCode.NOT_FOUND:
            print(clean(f"gpufleet probe-node: node {node} not found"), file=sys.stderr)
            return 2
        print(f"gpufleet probe-node: {clean(str(exc))}", file=sys.stderr)
        return 2 if exc.code in USAGE_ERRORS else 1
    except KeyboardInterrupt:
        print("gpufleet probe-node: interrupted (the node may still be probing)", file=sys.stderr)
        return 130
    if output in DOCUMENT_FORMATS:
        print_document(response_to_dict(node, resp), output)
    elif not wait:
        print(clean(f"probe command {resp.command_id} sent to {node}"))
    elif resp.results:
        title = f"Probe results of {node} (command {resp.command_id})"
        show(probe_run_table(resp.results, title, wide=output == "wide"))
    if not wait:
        return 0
    if not resp.done:
        why = resp.error or f"no answer within {timeout:.0f}s"
        print(clean(f"gpufleet probe-node: {node}: {why} (command {resp.command_id})"), file=sys.stderr)
        return 1
    failed = [r for r in resp.results if r.error]
    if not resp.ok or failed:
        print(
            clean(f"gpufleet probe-node: {node}: {resp.error or f'{len(failed)} probe(s) failed'}"),
            file=sys.stderr,
        )
        return 1
    if not resp.results and output not in DOCUMENT_FORMATS:
        print(clean(f"{node} answered without results (command {resp.command_id})"), file=sys.stderr)
    return 0
