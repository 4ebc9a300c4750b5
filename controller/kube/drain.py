"""A drain, as `kubectl drain` does it (pkg/drain in kubectl): cordon, list the node's pods, sort
them (pods.py), evict each through the Eviction API (policy/v1; never a delete), and wait for the
evicted pods to be gone.

- A 429 (a PodDisruptionBudget forbids the eviction now) is retried with backoff, 10 s doubling
  to 2 min per pod, and shows as `blocked by PDB <name>` in the drain's progress.
- Every step is stored (controller/store/drains.py) before the next: a pod whose eviction was
  accepted is recorded at once, so a controller restarted mid-drain resumes it (DrainRun again on
  the stored record) and never evicts a pod twice; a pod already being deleted is waited for.
- It ends `drained` (every evicted pod gone), `blocked` (still refused by a PDB at the timeout),
  `timed_out` (evicted pods not gone at the timeout) or `failed` (an API error, or pods the config
  does not allow evicting), with the pods evicted, skipped (why) and blocking (the PDB).

The clock and the sleep are injected (tests run a drain's minutes in milliseconds); API calls run
in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from controller.config import DrainConfig
from controller.kube import nodes
from controller.kube.api import ApiError, KubeApi
from controller.kube.pods import plan_pods, pod_ref
from controller.kube.selectors import budget_of
from controller.store.drains import DrainPod, DrainRecord

log = logging.getLogger("gpufleet.controller.kube")
T = TypeVar("T")
BACKOFF_FIRST = 10.0  # seconds before retrying an eviction a PDB refused; doubles per refusal
BACKOFF_MAX = 120.0
POLL_SECONDS = 1.0  # how often evicted pods are checked for being gone
BUDGET_IN_MESSAGE = re.compile(r"disruption budget (\S+)")
Sleep = Callable[[float], Awaitable[None]]


def backoff(attempts: int) -> float:
    """10, 20, 40, 80, 120, 120, ... seconds after the n-th refusal."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2.0 ** max(0, min(attempts - 1, 16)))


def progress_of(r: DrainRecord) -> str:
    """One line: what the drain waits for now."""
    parts: list[str] = []
    by_pdb: dict[str, list[str]] = {}
    for pod in r.blocking:
        by_pdb.setdefault(pod.pdb, []).append(pod.key)
    parts += [f"blocked by PDB {pdb} ({', '.join(pods)})" for pdb, pods in sorted(by_pdb.items())]
    left = [p.key for p in r.pending if not p.pdb]
    if left:
        parts.append(f"{len(left)} pod(s) to evict")
    waiting = [p.key for p in r.waiting]
    if waiting:
        parts.append(f"waiting for {len(waiting)} pod(s) to go: {', '.join(waiting)}")
    gone = sum(1 for p in r.evicted if p.gone)
    head = f"{len(r.evicted)} evicted ({gone} gone), {len(r.skipped)} skipped"
    return "; ".join([head, *parts])


class DrainRun:
    def __init__(
        self,
        api: KubeApi,
        record: DrainRecord,
        config: DrainConfig,
        *,
        save: Callable[[DrainRecord], Awaitable[None]],
        clock: Callable[[], float],
        sleep: Sleep = asyncio.sleep,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.api = api
        self.record = record
        self.config = config
        self._save = save
        self.clock = clock
        self.sleep = sleep
        self.poll_seconds = poll_seconds

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def save(self) -> None:
        r = self.record
        r.updated = self.clock()
        if r.open:
            r.progress = progress_of(r)
        await self._save(r)

    async def run(self) -> DrainRecord:
        """Drain (or resume draining) to the end; returns the record in its final state."""
        r = self.record
        try:
            await self._prepare()
            if r.open:
                await self._evict_and_wait()
        except ApiError as exc:
            await self._end("failed", error=str(exc))
        except Exception as exc:  # a bug must not leave the drain running forever: it fails, logged
            log.exception("drain %s of node %s failed", r.id, r.node)
            await self._end("failed", error=f"internal error: {exc}")
        return r

    async def _prepare(self) -> None:
        """Cordon, list the pods, and take up what the record says was done already."""
        r = self.record
        outcome = await self._call(nodes.cordon, self.api, r.node)
        r.cordoned = r.cordoned or outcome.changed
        pods = await self._call(self.api.pods_on, r.node)
        plan = await self._call(plan_pods, pods, self.config, self.api.has_daemonset)
        refusal = plan.refusal(r.node)
        if refusal:
            await self._end("failed", error=refusal)
            return
        evicted = {p.uid or p.key for p in r.evicted}
        previous = {p.uid or p.key: p for p in r.pending}
        r.pending = [previous.get(p.uid or p.key, p) for p in plan.evict if (p.uid or p.key) not in evicted]
        known = evicted | {p.uid or p.key for p in r.terminating}
        r.terminating += [p for p in plan.terminating if (p.uid or p.key) not in known]
        r.skipped = plan.skipped
        await self.save()
        log.info("drain %s of %s: %s", r.id, r.node, r.progress)

    async def _evict_and_wait(self) -> None:
        r = self.record
        while True:
            now = self.clock()
            changed = False
            for pod in list(r.pending):
                if pod.next_try <= now:
                    changed = await self._evict(pod, now) or changed
            for pod in r.waiting:
                found = await self._call(self.api.get_pod, pod.namespace, pod.name)
                if found is None or (pod.uid and pod_ref(found).uid != pod.uid):
                    pod.gone, changed = True, True
            if not r.pending and not r.waiting:
                await self._end("drained")
                return
            if now >= r.deadline:
                await self._end("blocked" if r.blocking else "timed_out")
                return
            if changed or progress_of(r) != r.progress:
                await self.save()
            waits = [r.deadline - now, *(p.next_try - now for p in r.pending)]
            if r.waiting:
                waits.append(self.poll_seconds)
            await self.sleep(max(0.0, min(waits)))

    async def _evict(self, pod: DrainPod, now: float) -> bool:
        """Ask for the pod's eviction; True when the record changed."""
        r = self.record
        try:
            await self._call(self.api.evict, pod.namespace, pod.name, self.config.grace_seconds)
        except ApiError as exc:
            if exc.status == 404:  # gone before we asked
                r.pending.remove(pod)
                return True
            if exc.status != 429:
                raise ApiError(
                    exc.status, exc.reason, f"evicting {pod.key}: {exc.message}", exc.body
                ) from exc
            pdb = await self._budget(pod, exc)
            pod.attempts += 1
            pod.next_try = now + backoff(pod.attempts)
            if pod.pdb != pdb:
                log.info("drain %s of %s: %s blocked by PDB %s", r.id, r.node, pod.key, pdb)
            pod.pdb = pdb
            return True
        r.pending.remove(pod)
        pod.time, pod.pdb, pod.next_try = now, "", 0.0
        r.evicted.append(pod)
        await self.save()  # stored before anything else: a restart never evicts it again
        log.info("drain %s of %s: evicted %s", r.id, r.node, pod.key)
        return True

    async def _budget(self, pod: DrainPod, exc: ApiError) -> str:
        """The PodDisruptionBudget behind a 429: named in the Status' causes, else the namespace's
        budget whose selector matches the pod."""
        causes = ((exc.body.get("details") or {}).get("causes")) or []
        for text in [c.get("message", "") for c in causes] + [exc.message]:
            match = BUDGET_IN_MESSAGE.search(text or "")
            if match:
                return match.group(1)
        try:
            found = await self._call(self.api.get_pod, pod.namespace, pod.name)
            budgets = await self._call(self.api.pdbs, pod.namespace)
        except ApiError:
            return "(unknown)"
        return (budget_of(found, budgets) if found else "") or "(unknown)"

    async def _end(self, state: str, *, error: str = "") -> None:
        r = self.record
        r.state, r.error = state, error
        took = f"{r.deadline - r.started:.0f}s"
        if state == "drained":
            r.progress = f"drained: {len(r.evicted)} pod(s) evicted, {len(r.skipped)} skipped"
        elif state == "blocked":
            pods = "; ".join(f"{p.key} blocked by PDB {p.pdb}" for p in r.blocking)
            r.progress = f"blocked at the timeout ({took}): {pods}"
        elif state == "timed_out":
            r.progress = f"timed out ({took}): pods not gone: {', '.join(p.key for p in r.waiting)}"
        else:
            r.progress = f"failed: {error}"
        await self.save()
        log.info("drain %s of %s ended %s: %s", r.id, r.node, state, r.progress)
