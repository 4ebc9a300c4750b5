"""`gpufleet cordon NODE`, `gpufleet uncordon NODE [--force]` and `gpufleet drain NODE`: Kubernetes
node actions, executed by the controller (audited, breaker-counted, one per node at a time).

`drain` asks for confirmation on a terminal unless --yes (off a terminal --yes is required; not
with --dry-run) and waits for the drain to end. JSON/YAML of a drain: {node, id, outcome (drained,
blocked, timed_out, failed; planned for a dry run), progress, error, evicted [{pod, time, gone}],
skipped [{pod, why}], blocking [{pod, pdb}], waiting [pod], pending [pod], audit_id}. Of a cordon
or uncordon: {node, changed, detail, audit_id}. Exit status: 0 done (drained, planned); 1 blocked,
timed out, failed, refused by the breaker, or no controller; 2 bad arguments, unknown node, no
cluster configured, a node under maintenance, busy or cordoned by someone else.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import grpc
from rich.table import Table

from controller.cli.jsonify import message_to_dict
from controller.cli.layout import Col, clean, make_table, plain, show
from controller.cli.operator import OperatorError, call_operator
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.waiting import waited
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc

USAGE_ERRORS = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
)
ACTION_TIMEOUT_S = 60.0  # a cordon or uncordon: a few API calls, with 409 retries
NO_TIMEOUT_RPC_S = 24 * 3600.0  # the controller's own timeout applies: wait for it
RPC_MARGIN_S = 30.0
OUTCOME_STYLE = {"drained": "green", "planned": "cyan", "running": "yellow"}


def _key(p: operator_pb2.DrainPod) -> str:
    return f"{p.namespace}/{p.name}"


def drain_to_dict(s: operator_pb2.DrainStatus) -> dict[str, Any]:
    return {
        "node": s.node,
        "id": s.id,
        "outcome": s.outcome,
        "progress": s.progress,
        "error": s.error,
        "evicted": [
            {
                "pod": _key(p),
                "time": p.evicted.ToJsonString() if p.HasField("evicted") else None,
                "gone": p.gone,
            }
            for p in s.evicted
        ],
        "skipped": [{"pod": _key(p), "why": p.why} for p in s.skipped],
        "blocking": [{"pod": _key(p), "pdb": p.pdb} for p in s.blocking],
        "waiting": [_key(p) for p in s.waiting],
        "pending": [_key(p) for p in s.pending],
        "audit_id": s.audit_id,
    }


def pods_table(s: operator_pb2.DrainStatus, *, wide: bool = False) -> Table:
    rows: list[tuple[str, str, str]] = []
    waiting = {_key(p) for p in s.waiting}
    rows += [(_key(p), "waiting" if _key(p) in waiting else "evicted", "") for p in s.evicted]
    rows += [(_key(p), "blocked", f"PDB {p.pdb}") for p in s.blocking]
    verb = "would evict" if s.outcome == "planned" else "to evict"
    rows += [(_key(p), verb, "") for p in s.pending if not p.pdb]
    rows += [(_key(p), "waiting", p.why) for p in s.waiting if _key(p) not in {_key(e) for e in s.evicted}]
    rows += [(_key(p), "skipped", p.why) for p in s.skipped]
    columns = (Col("POD", key=True), Col("STATE"), Col("WHY", wrap=True))
    return make_table("Pods", columns, rows, wide=wide)


def show_drain(s: operator_pb2.DrainStatus, output: str) -> None:
    if output in DOCUMENT_FORMATS:
        print_document(drain_to_dict(s), output)
        return
    head = plain(f"{s.node}: {s.outcome}: {s.progress}", OUTCOME_STYLE.get(s.outcome, "red"))
    show(head, pods_table(s, wide=output == "wide"))


def _fail(command: str, exc: OperatorError) -> int:
    print(f"gpufleet {command}: {clean(str(exc))}", file=sys.stderr)
    return 2 if exc.code in USAGE_ERRORS else 1


def _node_action(
    command: str,
    target: str,
    output: str,
    call: Callable[[operator_pb2_grpc.OperatorStub], operator_pb2.NodeActionResponse],
) -> int:
    try:
        resp = call_operator(target, call)
    except OperatorError as exc:
        return _fail(command, exc)
    if output in DOCUMENT_FORMATS:
        print_document(message_to_dict(resp), output)
    else:
        print(clean(resp.detail))
    return 0


def cordon(target: str, node: str, output: str, *, reason: str) -> int:
    request = operator_pb2.CordonRequest(node=node, reason=reason)
    return _node_action("cordon", target, output, lambda s: s.Cordon(request, timeout=ACTION_TIMEOUT_S))


def uncordon(target: str, node: str, output: str, *, reason: str, force: bool) -> int:
    request = operator_pb2.UncordonRequest(node=node, reason=reason, force=force)
    return _node_action("uncordon", target, output, lambda s: s.Uncordon(request, timeout=ACTION_TIMEOUT_S))


def _confirm(node: str) -> bool | None:
    """True to go on, False when the operator said no; None off a terminal (--yes required)."""
    if not sys.stdin.isatty():
        return None
    answer = input(f"Drain node {node}: cordon it and evict its pods? [y/N] ")
    return answer.strip().lower() in {"y", "yes"}


def drain(
    target: str, node: str, output: str, *, reason: str, dry_run: bool, timeout: float, yes: bool
) -> int:
    if not 0 <= timeout < math.inf:  # NaN and infinity too: a deadline that fires at once
        print(
            "gpufleet drain: --timeout must be a finite number of seconds > 0 (0: the controller's default)",
            file=sys.stderr,
        )
        return 2
    if not dry_run and not yes:
        confirmed = _confirm(node)
        if confirmed is None:
            print(
                f"gpufleet drain: not a terminal: pass --yes to drain {node} (or --dry-run to see the plan)",
                file=sys.stderr,
            )
            return 2
        if not confirmed:
            print("gpufleet drain: nothing done", file=sys.stderr)
            return 1
    request = operator_pb2.DrainRequest(
        node=node, reason=reason, dry_run=dry_run, timeout_seconds=timeout, wait=True
    )
    deadline = (timeout or NO_TIMEOUT_RPC_S) + RPC_MARGIN_S
    try:
        status: operator_pb2.DrainStatus = call_operator(
            target,
            lambda s: (
                waited(s.Drain.future(request, timeout=deadline), f"draining {node}", timeout)
                if not dry_run
                else s.Drain(request, timeout=deadline)
            ),
        )
    except OperatorError as exc:
        return _fail("drain", exc)
    show_drain(status, output)
    if status.outcome in ("drained", "planned"):
        return 0
    print(
        clean(f"gpufleet drain: {node}: {status.outcome}: {status.error or status.progress}"), file=sys.stderr
    )
    return 1
