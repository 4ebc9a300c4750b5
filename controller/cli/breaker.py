"""`gpufleet breaker` and `gpufleet breaker reset`: the blast-radius breaker.

JSON/YAML: {"state": "armed"|"tripped", "why", "tripped_at" (RFC 3339, null when armed),
"window_seconds", "share", "usage": [{"scope": "fleet" or a peer group, "size", "limit", "used",
"nodes"}], "actions": [{"id", "kind", "node", "group", "time", "outcome"}]}.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.table import Table
from rich.text import Text

from controller.cli.jsonify import message_to_dict
from controller.cli.layout import Col, clean, make_table, plain, show
from controller.cli.operator import TIMEOUT_S, OperatorError, call_operator
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.tables import age
from protos.gpufleet.v1 import operator_pb2


def breaker_to_dict(status: operator_pb2.BreakerStatus) -> dict[str, Any]:
    return {
        "state": "tripped" if status.tripped else "armed",
        "why": status.why,
        "tripped_at": status.tripped_at.ToJsonString() if status.HasField("tripped_at") else None,
        "window_seconds": status.window_seconds,
        "share": status.share,
        "usage": [message_to_dict(u) for u in status.usage],
        "actions": [message_to_dict(a) for a in status.actions],
    }


def usage_table(status: operator_pb2.BreakerStatus, *, wide: bool = False) -> Table:
    columns = (
        Col("SCOPE", key=True),
        Col("USED"),
        Col("LIMIT"),
        Col("SIZE", drop=2),
        Col("NODES", drop=1, wrap=True),
    )
    rows = [
        (u.scope, str(u.used), str(u.limit), str(u.size), ", ".join(u.nodes) or "-") for u in status.usage
    ]
    window = f"{status.window_seconds / 60:.0f} min"
    return make_table(
        f"In action within {window} (limit max(1, ceil({status.share:g} x N)))", columns, rows, wide=wide
    )


def headline(status: operator_pb2.BreakerStatus) -> Text:
    if not status.tripped:
        return Text("breaker: armed", style="green")
    since = age(status.tripped_at.seconds) if status.HasField("tripped_at") else "?"
    return plain(f"breaker: TRIPPED ({since}): {status.why}", style="bold red")


def breaker(target: str, output: str) -> int:
    try:
        status = call_operator(
            target, lambda s: s.GetBreaker(operator_pb2.GetBreakerRequest(), timeout=TIMEOUT_S)
        )
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return 1
    _print(status, output)
    return 0


def _print(status: operator_pb2.BreakerStatus, output: str) -> None:
    if output in DOCUMENT_FORMATS:
        print_document(breaker_to_dict(status), output)
    else:
        show(headline(status), usage_table(status, wide=output == "wide"))


def reset(target: str, output: str, reason: str, yes: bool) -> int:
    """Re-arm the breaker (audited). Asks on a terminal unless --yes; elsewhere --yes is required."""
    if not reason.strip():
        print("gpufleet: breaker reset needs --reason TEXT", file=sys.stderr)
        return 2
    if not yes:
        if not sys.stdin.isatty():
            print("gpufleet: not a terminal: pass --yes to reset the breaker", file=sys.stderr)
            return 2
        answer = input("Re-arm the breaker and start a fresh window? [y/N] ")
        if answer.strip().lower() not in {"y", "yes"}:
            print("gpufleet: breaker not reset", file=sys.stderr)
            return 1
    request = operator_pb2.ResetBreakerRequest(reason=reason)
    try:
        status = call_operator(target, lambda s: s.ResetBreaker(request, timeout=TIMEOUT_S))
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return 1
    _print(status, output)
    return 0
