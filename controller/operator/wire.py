"""Findings as the contract's messages (shared by the Operator service and `gpufleet analyze`)."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from controller.fleet.finding import Evidence
from controller.fleet.findings import StoredFinding
from controller.fleet.remediation import remediation
from protos.gpufleet.v1 import findings_pb2
from protos.names import cause_value, severity_value


def _ts(unix_seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(unix_seconds * 1e9))
    return ts


def evidence_to_proto(ev: Evidence) -> findings_pb2.Evidence:
    msg = findings_pb2.Evidence(
        metric=ev.metric,
        unit=ev.unit,
        reasons=list(ev.reasons),
        peers=ev.peers,
        detail=ev.detail,
        baseline_source=ev.baseline_source,
    )
    for name in ("value", "baseline", "deviation", "held_seconds"):
        value = getattr(ev, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def finding_to_proto(stored: StoredFinding) -> findings_pb2.Finding:
    f = stored.finding
    msg = findings_pb2.Finding(
        id=stored.id,
        node=f.node,
        cause=cause_value(f.cause),  # type: ignore[arg-type]
        severity=severity_value(f.severity),  # type: ignore[arg-type]
        summary=f.summary,
        evidence=evidence_to_proto(f.evidence),
        supporting=[evidence_to_proto(e) for e in f.supporting],
        first_seen=_ts(stored.first_seen),
        last_seen=_ts(stored.last_seen),
        active=stored.active,
        detectors=f.detectors,
        remediation=remediation(f.cause),
    )
    if f.gpu is not None:
        msg.gpu = f.gpu
    return msg
