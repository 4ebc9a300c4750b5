"""The breaker as the controller holds it: the pure decisions of breaker.py over the live fleet,
with every request audited before it is decided and the state persisted in the store (so a
restarted controller keeps its window and stays tripped). Tuning and drains call
`app.breaker.request(...)` before acting and `app.breaker.finished(...)` after.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from controller.config import BreakerConfig
from controller.fleet.model import Fleet
from controller.fleet.peers import group_sizes, node_group
from controller.remediate import breaker
from controller.remediate.audit import Auditor
from controller.store.audit import AuditEntry
from controller.store.store import Store

log = logging.getLogger("gpufleet.controller.breaker")


@dataclass(slots=True)
class Verdict:
    allowed: bool
    why: str
    action_id: str
    audit: AuditEntry  # the request's audit entry (outcome allowed or refused)


@dataclass(slots=True)
class Status:
    state: breaker.State
    limits: breaker.Limits
    usage: list[breaker.Usage]


class Breaker:
    def __init__(
        self,
        config: BreakerConfig,
        store: Store,
        auditor: Auditor,
        *,
        fleet: Callable[[], Fleet],
        clock: Callable[[], float],
        stale_after_seconds: float = 60.0,
    ) -> None:
        self.limits = breaker.Limits(config.window_seconds, config.share)
        self.store = store
        self.auditor = auditor
        self.fleet = fleet
        self.clock = clock
        self.stale_after_seconds = stale_after_seconds
        self.state = breaker.State()
        # (kind, outcome) -> actions since this process started: refused, succeeded, failed,
        # rolled_back (the /metrics page; the audit log keeps every one for good)
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = asyncio.Lock()  # one decision at a time: two requests never spend one slot

    async def load(self) -> None:
        stored = await self.store.load_breaker()
        if stored is not None:
            self.state = msgspec.json.decode(stored, type=breaker.State)
            if self.state.tripped:
                log.warning("breaker is tripped (since a previous run): %s", self.state.why)

    async def _save(self, state: breaker.State) -> None:
        if state != self.state:
            await self.store.save_breaker(msgspec.json.encode(state).decode(), self.clock())
            self.state = state

    def known(self, node: str) -> bool:
        """An action on a node the fleet knows counts, reporting or silent; one joining does not."""
        return node in self.fleet().nodes

    def group_of(self, node: str) -> str:
        state = self.fleet().nodes.get(node)
        return "unknown" if state is None else node_group(state)

    async def request(
        self,
        kind: str,
        node: str,
        requester: str,
        reason: str = "",
        *,
        parameters: dict[str, Any] | None = None,
        findings: Sequence[str] = (),
        is_recovery: bool = False,
    ) -> Verdict:
        """Audit the request, then allow or refuse it; recovery always proceeds. There is no
        bypass: whether an action counts is the breaker's call (the node is known), not the caller's."""
        params = dict(parameters or {}) | {"is_recovery": is_recovery}
        entry = await self.auditor.begin(
            requester, kind, node, parameters=params, reason=reason, findings=findings
        )
        async with self._lock:
            req = breaker.Request(
                id=uuid.uuid4().hex[:16],
                kind=kind,
                node=node,
                group=self.group_of(node),
                healthy=self.known(node),
                is_recovery=is_recovery,
            )
            decision = breaker.decide(self.state, req, self.clock(), self.limits, group_sizes(self.fleet()))
            was_tripped = self.state.tripped
            await self._save(decision.state)
        if decision.state.tripped and not was_tripped:
            log.error("breaker tripped: %s", decision.why)
        if not decision.allowed:
            self.counts[kind, "refused"] += 1
        await self.auditor.outcome(entry, "allowed" if decision.allowed else "refused", decision.why)
        return Verdict(decision.allowed, decision.why, req.id, entry)

    async def finished(self, verdict: Verdict, outcome: str, detail: str = "") -> None:
        """The allowed action ended: succeeded, failed or rolled_back (it keeps counting either way)."""
        async with self._lock:
            await self._save(breaker.finish(self.state, verdict.action_id, outcome, self.clock()))
        self.counts[verdict.audit.action, outcome] += 1
        await self.auditor.outcome(verdict.audit, outcome, detail)

    async def reset(self, requester: str, reason: str) -> AuditEntry:
        """Re-arm (audited); the only way out of a tripped state."""
        if not reason.strip():
            raise ValueError("a reason is required to reset the breaker")
        was = self.state
        params = {"was_tripped": was.tripped, "why": was.why}
        entry = await self.auditor.begin(requester, "breaker_reset", "", parameters=params, reason=reason)
        async with self._lock:
            await self._save(breaker.reset(self.state))
        log.warning("breaker reset by %s: %s", requester, reason)
        done = "re-armed" if was.tripped else "was armed; window cleared"
        await self.auditor.outcome(entry, "succeeded", done)
        return entry

    def status(self) -> Status:
        now = self.clock()
        state = breaker.slide(self.state, now, self.limits)
        return Status(state, self.limits, breaker.usage(state, now, self.limits, group_sizes(self.fleet())))

    def wait_reason(self, node: str) -> str:
        """Why an automatic action on `node` would be refused now ("" if it fits): the breaker is
        tripped, or the node does not fit in its window. Automatic actions wait rather than trip it."""
        status = self.status()
        if status.state.tripped:
            return f"the breaker is tripped ({status.state.why})"
        group = self.group_of(node)
        for usage in status.usage:
            if (
                usage.scope in (breaker.FLEET, group)
                and node not in usage.nodes
                and usage.used >= usage.limit
            ):
                where = "fleet-wide" if usage.scope == breaker.FLEET else f"in peer group {usage.scope}"
                return f"the breaker's budget: {usage.used} of {usage.limit} nodes in action {where}"
        return ""
