"""Rich tables of nodes and findings for the operator commands and the demo's live view.

Per-GPU tables are in gpu_tables.py; how a table fits the terminal, in layout.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rich.table import Table
from rich.text import Text

from controller.cli import finding_view
from controller.cli.layout import Cell, Col, make_table, plain
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.names import cause_name as _cause_name
from protos.names import health_name as _health_name
from protos.names import severity_name as _severity_name

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
HEALTH_STYLE = {"healthy": "green", "degraded": "yellow", "critical": "bold red", "stale": "dim"}
PLAINTEXT = "plaintext"  # NodeSummary.transport of a node whose stream had no TLS


def _named(fn: Callable[[int], str], value: int) -> str:
    """An enum value's name; its number if it is newer than this CLI (never a crash)."""
    try:
        return fn(value)
    except ValueError:
        return str(value)


def cause_name(value: int) -> str:
    return _named(_cause_name, value)


def severity_name(value: int) -> str:
    return _named(_severity_name, value)


def health_name(value: int) -> str:
    return _named(_health_name, value)


def gpu_label(f: findings_pb2.Finding) -> str:
    return str(f.gpu) if f.HasField("gpu") else "-"


def age(ts_seconds: int, now: float | None = None) -> str:
    """ "12s ago", "5m ago", "3h ago", "2d ago"; "-" for an unset timestamp."""
    if ts_seconds <= 0:
        return "-"
    delta = max(0.0, (time.time() if now is None else now) - ts_seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{delta // size:.0f}{unit} ago"
    return f"{delta:.0f}s ago"


def findings_table(
    findings: Sequence[findings_pb2.Finding],
    title: str = "Findings",
    *,
    wide: bool = False,
    empty: str = "none",
) -> Table:
    """One row a finding: where, what, how bad (and whether resolved, acknowledged or silenced), its
    evidence (in units, with the baseline's origin) and what to do about it (finding_view.py)."""
    columns = (
        Col("ID", key=True, wide=True),
        Col("NODE", key=True),
        Col("GPU", key=True),
        Col("CAUSE", key=True),
        Col("SEVERITY", drop=3, wrap=True),
        Col("SINCE", drop=4),
        Col("LAST SEEN", drop=5, wide=True),
        Col("DETECTORS", drop=6, wide=True),
        Col("EVIDENCE", drop=1, wrap=True),
        Col("REMEDIATION", drop=2, wrap=True),
    )
    rows: list[Sequence[Cell]] = []
    for f in findings:
        severity = severity_name(f.severity)
        state = Text(
            severity if f.active else f"{severity} (resolved)", style=SEVERITY_STYLE.get(severity, "")
        )
        for mark in finding_view.status_marks(f):  # "acked by alice", "silenced (s-123)"
            state.append(f"; {mark}")
        rows.append(
            (
                f.id,
                f.node,
                gpu_label(f),
                cause_name(f.cause),
                state,
                age(f.first_seen.seconds),
                age(f.last_seen.seconds),
                ", ".join(f.detectors) or "-",
                finding_view.evidence_cell(f),
                finding_view.remediation_cell(f),
            )
        )
    return make_table(title, columns, rows, wide=wide, empty=empty)


def node_name(n: operator_pb2.NodeSummary) -> Text:
    """The node's name; " (plaintext)" after it, in yellow, when its stream had no TLS (the name is
    only what the agent said)."""
    name = plain(n.name)
    if n.transport == PLAINTEXT:
        name.append(f" ({PLAINTEXT})", style="yellow")
    return name


def nodes_table(
    nodes: Sequence[operator_pb2.NodeSummary],
    *,
    wide: bool = False,
    title: str | None = None,
    empty: str = "none (no agent has connected to this controller yet)",
) -> Table:
    columns = (
        Col("NODE", key=True),
        Col("HEALTH"),
        Col("GPUS", drop=3),
        Col("MODEL", drop=4, wrap=True),
        Col("SOURCE", drop=7),
        Col("STREAM", drop=5),
        Col("LAST SEEN", drop=6),
        Col("FINDINGS", drop=2),
        Col("AGENT", drop=8),
        Col("BOOT ID", drop=10, wide=True),
        Col("ACKED SEQ", drop=9, wide=True),
        Col("TRANSPORT", drop=11, wide=True),
    )
    rows: list[Sequence[Cell]] = []
    for n in nodes:
        health = health_name(n.health) or "unknown"
        rows.append(
            (
                node_name(n),
                Text(health, style=HEALTH_STYLE.get(health, "")),
                str(n.gpu_count),
                n.gpu_model,
                n.source,
                "connected" if n.connected else Text("disconnected", style="dim"),
                age(n.last_seen.seconds),
                str(n.active_findings),
                n.agent_version,
                n.boot_id or "-",
                str(n.acked_seq),
                Text(n.transport or "-", style="yellow" if n.transport == PLAINTEXT else ""),
            )
        )
    return make_table(title or f"Nodes ({len(nodes)})", columns, rows, wide=wide, empty=empty)
