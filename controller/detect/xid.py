"""XID errors: per GPU, the XIDs that signal a fault, with their meaning, counts and times.

Which XIDs make a finding (cause xid_error; meanings and classes in xid_catalogue.py):
- hardware-side classes (memory, bus, interconnect, firmware, hardware) and every XID that needs a
  reset: one event is enough; severity from the catalogue (critical for 48, 64, 74, 79, 95, ...).
- application and driver classes (13, 31, 43: a user's program faulted) raise nothing on their own.
  Only a code repeating its catalogue `repeat` times within the window is a (warning) finding: one
  program's bug stops its job, the same fault across job after job points at the GPU. 45 (cleanup
  after an earlier error) never is: it follows other XIDs.
- codes not in the catalogue: a warning once seen detect.xid_unknown_repeat times in the window
  (a single unknown event says too little to act on).

How long a finding stays open:
- while the XID was seen within detect.xid_window_seconds (an hour) before the GPU's latest reading
  (NodeState.trends keeps each node's XID events for an hour, so a longer window sees no further);
- an XID that needs a reset stays open while the agent's xid_counts (per code since the agent
  started) still show it, however long ago it came: a GPU reset is invisible in telemetry, and a GPU
  fallen off the bus stays broken after the hour. It closes when the agent restarts (a reboot does;
  after a GPU reset alone, restart the agent) or the GPU leaves the inventory.
Times are the GPU's latest reading's, not now: a node gone silent keeps its findings as its last
readings left them, like the other detectors'.

A GPU fallen off the bus (XID 79) answers nothing but its XIDs: its readings carry only index, uuid,
xid_events and xid_counts, which is all this detector reads.

Row remaps: XIDs 63, 64 and 94 on a GPU whose row remap is pending or failed report the same event
as row_remap.py's ecc_row_remap_pending finding. They are returned under that cause, so the runner
merges them into it as supporting evidence instead of raising a second critical finding. Without a
pending remap they are xid_error; 95 (uncontained) is always xid_error, being worse than the remap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from controller.config import DetectConfig
from controller.detect.base import DetectContext, register
from controller.detect.per_gpu import each_gpu
from controller.detect.xid_catalogue import CATALOGUE, ROW_REMAP_CODES, describe
from controller.fleet.finding import SEVERITIES, Evidence, Finding
from controller.fleet.model import GpuState, NodeState

NAME = "xid"


@dataclass(slots=True)
class Seen:
    """One XID code on one GPU: its events within the window, and its count since the agent started."""

    code: int
    count: int = 0
    first: float = 0.0
    last: float = 0.0
    total: int = 0  # xid_counts: since the agent started


def seen(node: NodeState, gpu: GpuState, window_seconds: float) -> dict[int, Seen]:
    codes: dict[int, Seen] = {}
    for x in node.trends.recent_xids(gpu.time - window_seconds):
        if x.gpu != gpu.index or x.time > gpu.time:
            continue
        s = codes.setdefault(x.code, Seen(x.code, first=x.time))
        s.count += 1
        s.first, s.last = min(s.first, x.time), max(s.last, x.time)
    for c in gpu.sample.xid_counts:
        codes.setdefault(c.code, Seen(c.code)).total = c.total
    return codes


def severity(s: Seen, config: DetectConfig) -> str | None:
    """The finding's severity for this code, None when it makes none (see the module's docstring)."""
    entry = CATALOGUE.get(s.code)
    if entry is None:
        return "warning" if s.count >= config.xid_unknown_repeat else None
    if entry.reset and (s.count or s.total):
        return entry.severity
    if entry.signals_fault and s.count:
        return entry.severity
    if entry.repeat is not None and s.count >= entry.repeat:
        return "warning"
    return None


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(t))


def evidence(s: Seen, config: DetectConfig) -> Evidence:
    entry = CATALOGUE.get(s.code)
    if s.count:
        when = f"at {_clock(s.last)}" if s.count == 1 else f"from {_clock(s.first)} to {_clock(s.last)}"
        what = f"{describe(s.code)} x{s.count} {when}"
    else:
        what = f"{describe(s.code)} x{s.total} since the agent started"
    baseline: float | None = None
    if entry is None:
        action = f"repeats ({s.count} in {config.xid_window_seconds / 60:.0f} min)"
        baseline = float(config.xid_unknown_repeat)
    elif entry.drain:
        action = "drain and reset"
    elif entry.reset:
        action = "reset needed"
    elif not entry.signals_fault and entry.repeat is not None:
        minutes = config.xid_window_seconds / 60
        action = f"repeats across jobs ({entry.repeat} in {minutes:.0f} min): suspect the GPU"
        baseline = float(entry.repeat)
    else:
        action = f"{entry.klass} fault"
    return Evidence(
        metric="xid",
        value=float(s.count or s.total),
        baseline=baseline,
        unit="events",
        reasons=(f"xid{s.code}",),
        detail=f"{what}: {action}",
        baseline_source="expected" if baseline is not None else "",
    )


def _order(item: tuple[Seen, str]) -> tuple[int, int, float, int]:
    s, sev = item
    entry = CATALOGUE.get(s.code)
    return (-SEVERITIES.index(sev), 0 if entry and entry.reset else 1, -s.last, s.code)


def gpu_findings(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[Finding]:
    if not node.trends.xids and not gpu.sample.xid_counts:
        return []  # no XID seen on the node, none counted on the GPU: most GPUs, most passes
    remap = gpu.sample.row_remap_pending or gpu.sample.row_remap_failure
    found = []
    for s in seen(node, gpu, config.xid_window_seconds).values():
        sev = severity(s, config)
        if sev is not None:
            found.append((s, sev))
    if not found:
        return []
    found.sort(key=_order)
    findings = []
    # The same event as row_remap.py's finding: joins it (the runner merges by node, GPU and cause).
    for s, sev in [(s, sev) for s, sev in found if remap and s.code in ROW_REMAP_CODES]:
        state = "failed" if gpu.sample.row_remap_failure else "pending"
        summary = f"GPU {gpu.index} {describe(s.code)}: row remap {state}, reset needed"
        ev = evidence(s, config)
        findings.append(Finding(node.name, gpu.index, "ecc_row_remap_pending", sev, summary, ev, [], [NAME]))
    rest = [(s, sev) for s, sev in found if not (remap and s.code in ROW_REMAP_CODES)]
    if rest:
        (first, worst), others = rest[0], rest[1:]
        primary = evidence(first, config)
        summary = f"GPU {gpu.index} {primary.detail}"
        if others:
            summary += f" (+{len(others)} more XID code{'s' if len(others) > 1 else ''})"
        supporting = [evidence(s, config) for s, _ in others]
        findings.append(
            Finding(node.name, gpu.index, "xid_error", worst, summary, primary, supporting, [NAME])
        )
    return findings


def ends(node: NodeState) -> tuple[object, ...]:
    """The node's first and last XID event kept: what its deque holds (detect/per_gpu.py), which
    any of its GPUs' readings changes."""
    xids = node.trends.xids
    return (xids[0], xids[-1]) if xids else ()


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    return each_gpu(ctx, NAME, gpu_findings, ends)
