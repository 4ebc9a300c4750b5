"""Rich tables for the operator commands and the demo's live view."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rich.table import Table
from rich.text import Text

from protos.gpufleet.v1 import findings_pb2, operator_pb2, telemetry_pb2
from protos.names import cause_name as _cause_name
from protos.names import clock_event_reason_names
from protos.names import health_name as _health_name
from protos.names import severity_name as _severity_name

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
HEALTH_STYLE = {"healthy": "green", "degraded": "yellow", "critical": "bold red", "stale": "dim"}


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


def findings_table(findings: Sequence[findings_pb2.Finding], title: str = "Findings") -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("NODE", "GPU", "CAUSE", "SEVERITY", "SINCE", "EVIDENCE"):
        table.add_column(column)
    for f in findings:
        severity = severity_name(f.severity)
        since = age(f.first_seen.seconds)
        table.add_row(
            f.node,
            gpu_label(f),
            cause_name(f.cause),
            Text(severity if f.active else f"{severity} (resolved)", style=SEVERITY_STYLE.get(severity, "")),
            since,
            f.evidence.detail or f.summary,
        )
    return table


def nodes_table(nodes: Sequence[operator_pb2.NodeSummary]) -> Table:
    table = Table(title=f"Nodes ({len(nodes)})", title_justify="left")
    for column in ("NODE", "HEALTH", "GPUS", "MODEL", "SOURCE", "STREAM", "LAST SEEN", "FINDINGS", "AGENT"):
        table.add_column(column)
    for n in nodes:
        health = health_name(n.health) or "unknown"
        table.add_row(
            n.name,
            Text(health, style=HEALTH_STYLE.get(health, "")),
            str(n.gpu_count),
            n.gpu_model,
            n.source,
            "connected" if n.connected else Text("disconnected", style="dim"),
            age(n.last_seen.seconds),
            str(n.active_findings),
            n.agent_version,
        )
    return table


def _fmt(sample: telemetry_pb2.GpuSample, field: str, scale: float = 1.0, digits: int = 0) -> str:
    if not sample.HasField(field):  # type: ignore[arg-type]
        return "-"
    return f"{getattr(sample, field) / scale:.{digits}f}"


def gpus_table(gpus: Sequence[telemetry_pb2.GpuSample]) -> Table:
    table = Table(title="GPUs (latest readings)", title_justify="left")
    for column in (
        "GPU",
        "SM MHz",
        "MEM MHz",
        "POWER W",
        "LIMIT W",
        "TEMP C",
        "PCIE",
        "NVLINK",
        "ROW REMAP",
        "XID",
        "REASONS",
    ):
        table.add_column(column)
    for g in gpus:
        pcie = "-"
        if g.HasField("pcie_link_gen") and g.HasField("pcie_link_width"):
            pcie = f"gen{g.pcie_link_gen} x{g.pcie_link_width}"
            if g.pcie_link_gen < g.pcie_link_gen_max or g.pcie_link_width < g.pcie_link_width_max:
                pcie += f" (max gen{g.pcie_link_gen_max} x{g.pcie_link_width_max})"
        links = f"{sum(1 for link in g.nvlinks if link.active)}/{len(g.nvlinks)}" if g.nvlinks else "-"
        remap = "pending" if g.row_remap_pending else ("failed" if g.row_remap_failure else "ok")
        if not g.HasField("row_remap_pending"):
            remap = "-"
        reasons = ", ".join(clock_event_reason_names(g.clock_event_reasons)) if g.clock_event_reasons else ""
        table.add_row(
            str(g.index),
            _fmt(g, "sm_clock_hz", 1e6),
            _fmt(g, "memory_clock_hz", 1e6),
            _fmt(g, "power_watts"),
            _fmt(g, "enforced_power_limit_watts"),
            _fmt(g, "temperature_celsius"),
            pcie,
            links,
            remap,
            ", ".join(f"{c.code} x{c.total}" for c in g.xid_counts) or "-",
            reasons,
        )
    return table


def probes_table(probes: Sequence[telemetry_pb2.ProbeResult]) -> Table:
    table = Table(title="Probe results (latest)", title_justify="left")
    for column in ("PROBE", "VARIANT", "GPU", "VALUE", "PEAK", "WHEN"):
        table.add_column(column)
    for p in probes:
        value = Text(f"failed: {p.error}", style="red") if p.error else f"{p.value:.1f} {p.unit}"
        peak = f"{p.peak_ratio:.0%}" if p.HasField("peak_ratio") else "-"
        table.add_row(
            p.probe, p.variant, str(p.gpu) if p.HasField("gpu") else "node", value, peak, age(p.time.seconds)
        )
    return table


def probe_run_table(results: Sequence[telemetry_pb2.ProbeResult], title: str) -> Table:
    """The results of one probe command (`gpufleet probe-node`), in the order the controller sends them."""
    table = Table(title=title, title_justify="left")
    for column in ("PROBE", "VARIANT", "GPU", "VALUE", "UNIT", "PEAK", "MODE", "CHECK"):
        table.add_column(column, justify="right" if column in ("VALUE", "PEAK") else "left")
    for r in results:
        value: str | Text = Text(f"failed: {r.error}", style="red") if r.error else f"{r.value:.1f}"
        check = "-"
        if r.HasField("check_passed"):
            check = "ok" if r.check_passed else "FAILED"
            if r.HasField("check_relative_error"):
                check += f" ({r.check_relative_error:.1e})"
        table.add_row(
            r.probe,
            r.variant,
            str(r.gpu) if r.HasField("gpu") else "node",
            value,
            "" if r.error else r.unit,
            f"{r.peak_ratio:.0%}" if r.HasField("peak_ratio") and not r.error else "-",
            (r.mode or "-") + (" (simulated)" if r.simulated else ""),
            check,
        )
    return table
