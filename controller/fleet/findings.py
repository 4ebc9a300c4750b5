"""Findings over time: a finding keeps its id and first_seen while detectors keep raising it, and
is resolved (kept, inactive) the first pass they stop."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from controller.fleet.finding import Finding, FindingKey


@dataclass(slots=True)
class StoredFinding:
    id: str
    finding: Finding
    first_seen: float
    last_seen: float
    active: bool = True


def finding_id(key: FindingKey, first_seen: float) -> str:
    node, gpu, cause = key
    text = f"{node}|{'' if gpu is None else gpu}|{cause}|{first_seen:.6f}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reconcile(
    active: dict[FindingKey, StoredFinding], fresh: list[Finding], now: float
) -> tuple[list[StoredFinding], list[StoredFinding]]:
    """Return (to upsert: new and continuing findings, to resolve: active ones no longer raised)."""
    upserts = []
    seen = set()
    for finding in fresh:
        seen.add(finding.key)
        previous = active.get(finding.key)
        if previous is None:
            upserts.append(StoredFinding(finding_id(finding.key, now), finding, now, now))
        else:
            upserts.append(StoredFinding(previous.id, finding, previous.first_seen, now))
    resolved = [
        StoredFinding(s.id, s.finding, s.first_seen, s.last_seen, active=False)
        for key, s in active.items()
        if key not in seen
    ]
    return upserts, resolved
