"""A node's health as operators see it: one pure function shared by `gpufleet nodes` and /metrics.

Stale is judged by what arrived, not by what the stream says: a node whose stream is still open
but that sent no Hello or accepted frame for `stale_after_seconds` (an agent stopped with SIGSTOP,
a hung process, a half-open connection the keepalive has not yet closed) is STALE like one that
disconnected.
"""

from __future__ import annotations

from controller.fleet.findings import StoredFinding
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import operator_pb2


def silent_for(node: NodeState, now: float) -> float:
    """Seconds since the node was last heard from: its newest frame's own time or the controller's
    clock when its last Hello or frame arrived, whichever is later (an agent clock running behind
    does not make a live node look silent)."""
    return now - max(node.last_seen, node.last_heard)


def node_health(
    node: NodeState, findings: list[StoredFinding], now: float, stale_after_seconds: float
) -> operator_pb2.NodeHealth.ValueType:
    """Stale when silent too long, connected or not; else the worst active finding's weight (none:
    healthy)."""
    if silent_for(node, now) > stale_after_seconds:
        return operator_pb2.NODE_HEALTH_STALE
    severities = {s.finding.severity for s in findings}
    if "critical" in severities:
        return operator_pb2.NODE_HEALTH_CRITICAL
    return operator_pb2.NODE_HEALTH_DEGRADED if findings else operator_pb2.NODE_HEALTH_HEALTHY
