"""Findings over time, with hysteresis: a finding opens once detectors raise it in `open_after` of
the last `window` passes (at once where its evidence held over a window of its own: throttle and
the like), keeps its id and first_seen while raised and through brief gaps, and is resolved (kept,
inactive) after `close_after` clean passes in a row. A pending finding (raised, not yet open) is
neither stored nor shown; after a restart the stored active findings are open and nothing pends.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from controller.config import DetectConfig
from controller.fleet.finding import Finding, FindingKey


@dataclass(slots=True)
class StoredFinding:
    id: str
    finding: Finding
    first_seen: float
    last_seen: float
    active: bool = True


def by_node(active: Mapping[FindingKey, StoredFinding]) -> dict[str, list[StoredFinding]]:
    """Findings grouped by node in one pass (ListNodes and /metrics want every node's: asking per node
    cost nodes x findings)."""
    out: dict[str, list[StoredFinding]] = {}
    for key, stored in active.items():
        out.setdefault(key[0], []).append(stored)
    return out


def finding_id(key: FindingKey, first_seen: float) -> str:
    node, gpu, cause = key
    text = f"{node}|{'' if gpu is None else gpu}|{cause}|{first_seen:.6f}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def held_over_a_window(finding: Finding) -> bool:
    """Whether the finding's evidence is a condition held over a window (held_seconds set): that
    window is its hysteresis, so it opens at once."""
    return any(e.held_seconds is not None for e in (finding.evidence, *finding.supporting))


class FindingTracker:
    """Opens and closes findings across detection passes (see the module docstring); one per
    controller (or offline detector), fed every pass's findings in time order."""

    def __init__(self, open_after: int = 1, window: int = 1, close_after: int = 1) -> None:
        if not 1 <= open_after <= window or close_after < 1:
            raise ValueError("need 1 <= open_after <= window and close_after >= 1")
        self.open_after = open_after
        self.window = window
        self.close_after = close_after
        self._pending: dict[FindingKey, deque[float | None]] = {}  # per pass: when raised, or None
        self._clean: dict[FindingKey, int] = {}  # active findings: clean passes in a row

    @classmethod
    def for_config(cls, config: DetectConfig) -> FindingTracker:
        return cls(config.open_after_passes, config.open_window_passes, config.close_after_passes)

    def reconcile(
        self, active: dict[FindingKey, StoredFinding], fresh: list[Finding], now: float
    ) -> tuple[list[StoredFinding], list[StoredFinding]]:
        """Return (to upsert: opened and continuing findings, to resolve: active ones clean for
        close_after passes). Leaves `active` for the caller to update."""
        raised = {f.key: f for f in fresh}
        upserts: list[StoredFinding] = []
        for key, finding in raised.items():
            previous = active.get(key)
            if previous is not None:
                self._clean.pop(key, None)
                upserts.append(StoredFinding(previous.id, finding, previous.first_seen, now))
                continue
            marks = self._pending.setdefault(key, deque(maxlen=self.window))
            marks.append(now)
            times = [t for t in marks if t is not None]
            if len(times) >= self.open_after or held_over_a_window(finding):
                del self._pending[key]
                upserts.append(StoredFinding(finding_id(key, times[0]), finding, times[0], now))
        for key in [k for k in self._pending if k not in raised]:
            marks = self._pending[key]
            marks.append(None)
            if all(t is None for t in marks):
                del self._pending[key]
        resolved = []
        for key, stored in active.items():
            if key in raised:
                continue
            clean = self._clean.get(key, 0) + 1
            if clean >= self.close_after:
                resolved.append(
                    StoredFinding(stored.id, stored.finding, stored.first_seen, stored.last_seen, False)
                )
                self._clean.pop(key, None)
            else:
                self._clean[key] = clean
        for key in [k for k in self._clean if k not in active]:  # forgotten or resolved elsewhere
            del self._clean[key]
        return upserts, resolved


def reconcile(
    active: dict[FindingKey, StoredFinding], fresh: list[Finding], now: float
) -> tuple[list[StoredFinding], list[StoredFinding]]:
    """Without hysteresis: open each finding the first pass it is raised, resolve it the first pass
    it is not. Return (to upsert: new and continuing findings, to resolve)."""
    return FindingTracker().reconcile(active, fresh, now)
