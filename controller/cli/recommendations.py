"""`gpufleet recommendations`: what the controller proposes for each node's findings, and how each
apply went.

JSON/YAML: {"recommendations": [...]}, newest first, each with id, node, cause ("" for an
operator's retune), action (tune, set_fleet_value, recommend_firmware, drain, investigate),
profile, changes [{setting, current, target, pending_reboot}], finding_ids, expected_effect, risk
(online, needs_reboot; "" when nothing is applied), state (proposed, approved, applying, verified,
rolled_back, failed, needs_attention), created, updated (RFC 3339), policy (off, recommend, auto),
command_id, detail, gpus and result (the agent's ApplyProfileResult; null until it answered).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from controller.cli.jsonify import message_to_dict
from controller.cli.layout import Cell, Col, clean, make_table, plain, show
from controller.cli.operator import TIMEOUT_S, OperatorError, call_operator, node_list
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.tables import age
from protos.gpufleet.v1 import operator_pb2

STATE_STYLE = {
    "proposed": "cyan",
    "approved": "cyan",
    "applying": "yellow",
    "verified": "green",
    "rolled_back": "yellow",
    "failed": "red",
    "needs_attention": "bold red",
}
RISK_STYLE = {"needs_reboot": "yellow", "online": "green"}


def recommendation_to_dict(r: operator_pb2.Recommendation) -> dict[str, Any]:
    out: dict[str, Any] = message_to_dict(r)
    out.setdefault("result", None)
    return out


def fix_text(r: operator_pb2.Recommendation) -> str:
    """`tune gpu-defaults`, `drain`: what the recommendation does."""
    return f"{r.action} {r.profile}".strip() if r.action else r.profile


def changes_text(r: operator_pb2.Recommendation) -> Text:
    """One line per change (each escaped: a newline in a setting cannot make another)."""
    if not r.changes:
        return Text("-")
    return Text("\n").join(
        plain(f"{c.setting}: {c.current} -> {c.target}" + (" (at reboot)" if c.pending_reboot else ""))
        for c in r.changes
    )


def recommendations_table(recs: Sequence[operator_pb2.Recommendation], *, wide: bool = False) -> Table:
    columns = (
        Col("ID", key=True),
        Col("NODE", key=True),
        Col("CAUSE"),
        Col("FIX"),
        Col("STATE"),
        Col("RISK", drop=4),
        Col("POLICY", drop=5),
        Col("CHANGES", wrap=True),
        Col("EXPECTED", drop=2, wrap=True),
        Col("DETAIL", drop=3, wrap=True),
        Col("FINDINGS", wide=True, wrap=True),
        Col("COMMAND", wide=True),
        Col("UPDATED", wide=True),
    )
    rows: list[Sequence[Cell]] = [
        (
            r.id,
            r.node,
            r.cause or "(retune)",
            fix_text(r),
            plain(r.state, style=STATE_STYLE.get(r.state, "")),
            plain(r.risk or "-", style=RISK_STYLE.get(r.risk, "")),
            r.policy or "-",
            changes_text(r),
            r.expected_effect or "-",
            r.detail or "-",
            ", ".join(r.finding_ids) or "-",
            r.command_id or "-",
            age(r.updated.seconds),
        )
        for r in recs
    ]
    return make_table("Recommendations", columns, rows, wide=wide)


def recommendations(target: str, output: str, node: str = "", limit: int = 0) -> int:
    request = operator_pb2.ListRecommendationsRequest(node=node, limit=limit)
    try:
        resp = call_operator(
            target,
            lambda s: node_list(
                s, node, s.ListRecommendations(request, timeout=TIMEOUT_S), "recommendations"
            ),
        )
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return 1
    if output in DOCUMENT_FORMATS:
        print_document({"recommendations": [recommendation_to_dict(r) for r in resp.recommendations]}, output)
    else:
        show(recommendations_table(resp.recommendations, wide=output == "wide"))
    return 0
