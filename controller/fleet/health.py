"""A node's health as operators see it: one pure function shared by `gpufleet nodes` and /metrics."""

from __future__ import annotations

from controller.fleet.findings import StoredFinding
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import operator_pb2


def node_health(
    node: NodeState, findings: list[StoredFinding], now: float, stale_after_seconds: float
) -> operator_pb2.NodeHealth.ValueType:
    """Stale when silent too long; else the worst active finding's weight (none: healthy)."""
    if not node.connected and now - node.last_seen > stale_after_seconds:
        return operator_pb2.NODE_HEALTH_STALE
    severities = {s.finding.severity for s in findings}
    if "critical" in severities:
        return operator_pb2.NODE_HEALTH_CRITICAL
    return operator_pb2.NODE_HEALTH_DEGRADED if findings else operator_pb2.NODE_HEALTH_HEALTHY
