"""What operators said about findings: acks, silences and nodes under maintenance, decided purely.

- An ack marks a finding as seen (by whom, when, why); it changes nothing else.
- A silence covers a node's active findings of one cause (or of every cause, cause "") from its
  start until its end; `Unsilence` ends it early. Expiry needs no timer: a silence covers a finding
  only while `starts <= now < ends`, judged each time it is asked.
- A node under maintenance has every active finding silenced (silenced_by "maintenance"), and the
  controller takes no automatic action on it (probes, retunes, drains, uncordons).

A silenced finding stays active in detection and in the store; it is listed only on request, does
not count in a node's health or active findings in the operator API, and drives no action.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.fleet.findings import StoredFinding
from protos.names import CAUSES

MAINTENANCE = "maintenance"  # Finding.silenced_by of a node under maintenance
MAX_SILENCE_SECONDS = 30 * 86400.0


@dataclass(slots=True)
class Silence:
    id: str
    node: str
    cause: str  # a Cause name; "": every cause
    starts: float
    ends: float  # set to the time of an Unsilence that ended it early
    by: str  # the caller, as the audit log names it
    comment: str = ""
    ended_by: str = ""  # who ended it with Unsilence ("" while it runs its course)
    end_comment: str = ""

    def active(self, now: float) -> bool:
        return self.starts <= now < self.ends

    def covers(self, node: str, cause: str, now: float) -> bool:
        return self.node == node and (not self.cause or self.cause == cause) and self.active(now)


@dataclass(slots=True)
class Maintenance:
    node: str
    by: str
    comment: str
    since: float


@dataclass(slots=True)
class Ack:
    finding_id: str
    node: str
    by: str
    comment: str
    time: float


@dataclass(slots=True)
class Silencing:
    """The controller's book of acks, silences and maintenance (loaded from the store at start,
    written through by the operator API). `silences` holds those not yet over; ended ones stay in
    the store for `gpufleet silences --all`."""

    silences: dict[str, Silence] = field(default_factory=dict)
    maintenance: dict[str, Maintenance] = field(default_factory=dict)
    acks: dict[str, Ack] = field(default_factory=dict)  # finding id -> its newest ack

    def silenced_by(self, node: str, cause: str, now: float) -> str:
        """What covers a finding of `cause` on `node` now: "maintenance", the id of the newest
        covering silence, or "" (not silenced)."""
        if node in self.maintenance:
            return MAINTENANCE
        covering = [s for s in self.silences.values() if s.covers(node, cause, now)]
        return max(covering, key=lambda s: (s.starts, s.id)).id if covering else ""

    def is_silenced(self, stored: StoredFinding, now: float) -> bool:
        return stored.active and bool(self.silenced_by(stored.finding.node, stored.finding.cause, now))

    def unsilenced(self, findings: Iterable[StoredFinding], now: float) -> list[StoredFinding]:
        """The findings no silence or maintenance covers now: those that may drive actions."""
        return [s for s in findings if not self.is_silenced(s, now)]

    def current(self, node: str, now: float) -> list[Silence]:
        """The silences active now (optionally one node's), newest first."""
        found = [s for s in self.silences.values() if s.active(now) and (not node or s.node == node)]
        return sorted(found, key=lambda s: (-s.starts, s.id))

    def add(self, silence: Silence, now: float) -> None:
        """Book a new silence, dropping those already over from memory (the store keeps them)."""
        self.silences = {k: s for k, s in self.silences.items() if s.ends > now}
        self.silences[silence.id] = silence


def silence_error(cause: str, duration_seconds: float) -> str:
    """Why a silence of `cause` for `duration_seconds` is refused ("" when it is fine)."""
    if not duration_seconds > 0:  # NaN included
        return "duration_seconds must be > 0"
    if duration_seconds > MAX_SILENCE_SECONDS:
        return f"duration_seconds must be at most {MAX_SILENCE_SECONDS:.0f} (30 days)"
    if cause and cause not in CAUSES:
        return f"unknown cause {cause!r}; expected one of {', '.join(CAUSES)} (or none: every cause)"
    return ""
