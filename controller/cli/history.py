"""`gpufleet history`: the audit log of mutating requests, newest first.

JSON/YAML: {"entries": [...]}, each with id, time (RFC 3339), requester, action, node, parameters
(an object), reason, finding_ids, outcome (requested, allowed, refused, succeeded, failed,
rolled_back), outcome_time (null while requested) and detail.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from controller.cli.jsonify import message_to_dict
from controller.cli.layout import Cell, Col, clean, make_table, plain, show
from controller.cli.operator import TIMEOUT_S, OperatorError, call_operator, node_list
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.since import set_since
from controller.cli.tables import age
from protos.gpufleet.v1 import operator_pb2

OUTCOME_STYLE = {"refused": "bold red", "failed": "red", "rolled_back": "yellow", "succeeded": "green"}


def entry_to_dict(e: operator_pb2.AuditEntry) -> dict[str, Any]:
    out: dict[str, Any] = message_to_dict(e)
    out["parameters"] = json.loads(e.parameters) if e.parameters else {}
    out.setdefault("outcome_time", None)
    return out


def history_table(entries: Sequence[operator_pb2.AuditEntry], *, wide: bool = False) -> Table:
    columns = (
        Col("ID", key=True, wide=True),
        Col("WHEN"),
        Col("NODE", key=True),
        Col("ACTION"),
        Col("OUTCOME"),
        Col("REQUESTER", drop=3),
        Col("REASON", drop=2, wrap=True),
        Col("DETAIL", drop=1, wrap=True),
        Col("PARAMETERS", wide=True, wrap=True),
    )
    rows: list[Sequence[Cell]] = [
        (
            e.id,
            age(e.time.seconds),
            e.node or "-",
            e.action,
            plain(e.outcome, style=OUTCOME_STYLE.get(e.outcome, "")),
            e.requester,
            e.reason or "-",
            e.detail or "-",
            e.parameters,
        )
        for e in entries
    ]
    return make_table("History", columns, rows, wide=wide)


def history(target: str, output: str, node: str = "", since: str = "", limit: int = 0) -> int:
    request = operator_pb2.ListAuditRequest(node=node, limit=limit)
    if since and not set_since(request.since, since):
        return 2
    try:
        resp = call_operator(
            target, lambda s: node_list(s, node, s.ListAudit(request, timeout=TIMEOUT_S), "entries")
        )
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return 1
    if output in DOCUMENT_FORMATS:
        print_document({"entries": [entry_to_dict(e) for e in resp.entries]}, output)
    else:
        show(history_table(resp.entries, wide=output == "wide"))
    return 0
