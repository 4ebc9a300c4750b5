"""What detectors return: a finding about one GPU (or node) with the evidence behind it."""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("info", "warning", "critical")

FindingKey = tuple[str, int | None, str]  # node, gpu, cause


@dataclass(frozen=True, slots=True)
class Evidence:
    metric: str
    value: float | None = None
    baseline: float | None = None
    deviation: float | None = None
    unit: str = ""
    reasons: tuple[str, ...] = ()
    peers: int = 0
    detail: str = ""
    held_seconds: float | None = None
    # peers | own_history | datasheet | fleet_majority | expected | "" (see findings.proto Evidence)
    baseline_source: str = ""


@dataclass(slots=True)
class Finding:
    node: str
    gpu: int | None
    cause: str  # a protos Cause name, e.g. "thermal_throttle", or "slow_unknown"
    severity: str  # one of SEVERITIES
    summary: str
    evidence: Evidence
    supporting: list[Evidence] = field(default_factory=list)
    detectors: list[str] = field(default_factory=list)

    @property
    def key(self) -> FindingKey:
        return (self.node, self.gpu, self.cause)


def worse(a: str, b: str) -> str:
    return a if SEVERITIES.index(a) >= SEVERITIES.index(b) else b
