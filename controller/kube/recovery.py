"""Auto uncordon: a node gpufleet drained for a drain recommendation is made schedulable again once
it is back within fleet normal after a re-probe (after repair or tuning); otherwise only an operator
uncordons it (`gpufleet uncordon`).

After each detection pass, a node is uncordoned (requester `policy`: audited, recovery, never
counted by the breaker) when all of these hold:
- its newest drain was started for a drain recommendation (the policy's or an approved one) and
  has ended; an operator's own `gpufleet drain` is the operator's to undo;
- it has no active finding any more; the first pass that sees it so is when its findings cleared
  (a finding that comes back starts this over; a restarted controller starts it at its first pass);
- it has a probe result newer than that, and a detection pass has judged it since (so a slow
  re-probe would have raised a finding first). That re-probe is asked for when the pass sees the
  findings clear (`reprobe`); where it cannot go then (the agent not connected, a probe in flight),
  the probe schedule's next round of the node counts;
- it is still cordoned by gpufleet (`gpufleet.io/cordoned-by: gpufleet`): never someone else's
  cordon, never a node under someone else's maintenance, nothing while another action holds it;
- nobody has uncordoned it since the drain ended (a later cordon is someone's new decision).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from controller.errors import ControllerError
from controller.fleet.findings import StoredFinding
from controller.fleet.model import Fleet
from controller.fleet.probe_index import newest_probe
from controller.kube import nodes
from controller.kube.actions import KubeActions
from controller.kube.api import ApiError
from controller.store.drains import DrainRecord
from controller.store.recommendations import Recommendation

log = logging.getLogger("gpufleet.controller.kube")
REQUESTER = "policy"


class Recovery:
    def __init__(
        self,
        kube: KubeActions,
        *,
        recs: Callable[[], Iterable[Recommendation]],
        fleet: Callable[[], Fleet],
        active: Callable[[], Iterable[StoredFinding]],
        clock: Callable[[], float],
        reprobe: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        self.kube = kube
        self.reprobe = reprobe
        self._recs = recs
        self._fleet = fleet  # the app replaces its Fleet when it loads the store: always ask
        self._active = active
        self.clock = clock
        self.cleared: dict[str, float] = {}  # node -> when this controller first saw it clear
        self.judged: dict[str, float] = {}  # node -> its newest probe time at the previous check
        self.done: set[str] = set()  # drains whose cordon is over (lifted, or not ours any more)

    async def after_pass(self) -> None:
        """Uncordon the drained nodes that are back within fleet normal (see the module's doc)."""
        if self.kube.cluster.api is None:
            return
        now = self.clock()
        findings = {s.finding.node for s in self._active() if s.active}
        for node, drain_id in sorted(self._drained().items()):
            if drain_id in self.done:
                continue
            if node in findings:  # not cleared (or back): wait for it to clear again
                self.cleared.pop(node, None)
                self.judged.pop(node, None)
                continue
            record = await self.kube.latest(node)
            if record is None or record.id != drain_id or record.open:
                continue  # still draining, or drained since by someone else (theirs to undo)
            if node not in self.cleared:
                self.cleared[node] = now
                await self._reprobe(node)
            cleared = self.cleared[node]
            judged = self.judged.get(node, 0.0)  # a pass has judged the probes seen then
            self.judged[node] = newest_probe(self._fleet(), node)
            if judged > cleared:
                await self._uncordon(node, record, cleared, judged)

    async def _reprobe(self, node: str) -> None:
        if self.reprobe is None:
            return
        try:
            await self.reprobe(node)
        except ControllerError as exc:
            why = f"no re-probe as its findings cleared ({exc}): the schedule's next one counts"
            log.info("node %s: %s", node, why)
        else:
            log.info("node %s: findings cleared after its drain: re-probing it before the uncordon", node)

    def _drained(self) -> dict[str, str]:
        """Node -> the drain its newest started drain recommendation ran."""
        newest: dict[str, Recommendation] = {}
        for rec in self._recs():
            if rec.action == "drain" and rec.command_id and not rec.open:
                held = newest.get(rec.node)
                if held is None or (rec.updated, rec.id) > (held.updated, held.id):
                    newest[rec.node] = rec
        return {node: rec.command_id for node, rec in newest.items()}

    async def _uncordon(self, node: str, record: DrainRecord, cleared: float, probed: float) -> None:
        why = await self._why_not(node, record)
        if why is None:
            return  # not now (maintenance, another action): the next pass looks again
        if why:
            log.info("node %s: not uncordoned after drain %s: %s", node, record.id, why)
            self.done.add(record.id)
            return
        reason = (
            f"back within fleet normal: its findings cleared and it was re-probed since "
            f"(after drain {record.id})"
        )
        try:
            done, _ = await self.kube.uncordon(node, requester=REQUESTER, reason=reason)
        except ControllerError as exc:  # audited by uncordon; the next pass tries again
            log.warning("node %s: uncordon after drain %s failed: %s", node, record.id, exc)
            return
        self.done.add(record.id)
        self.cleared.pop(node, None)
        self.judged.pop(node, None)
        log.info("node %s: %s (cleared at %.0f, re-probed at %.0f)", node, done.detail, cleared, probed)

    async def _why_not(self, node: str, record: DrainRecord) -> str | None:
        """ "" when gpufleet may lift the drain's cordon now, a reason when it never will, None when
        not now."""
        since = await self.kube.store.list_audit(node, record.updated, 100)
        if any(e.action == "uncordon" and e.outcome == "succeeded" for e in since):
            return "uncordoned since the drain ended"
        if self.kube.busy.get(node) or self.kube.channel.mutating_holder(node) is not None:
            return None
        try:
            obj = await asyncio.to_thread(self.kube.cluster.require().get_node, node)
        except ApiError as exc:
            if exc.status == 404:
                return "the cluster has no such node any more"
            log.warning("node %s: cannot check it on Kubernetes for uncordon: %s", node, exc)
            return None
        if nodes.maintenance_mark(obj, self.kube.config.maintenance):
            return None
        by = nodes.cordoned_by(obj)
        if by == "other":
            return "cordoned by someone else: gpufleet never uncordons it"
        return "" if by == nodes.GPUFLEET else "not cordoned any more"
