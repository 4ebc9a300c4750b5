"""Agents spread over controller replicas (`replica_ingest: true`).

Every replica serves the agents that connect to it: the standbys too, while they wait for the
lead. A node belongs to the replica that holds its newest stream (controller/store/owners.py): the
Hello takes it, from whichever replica had it, dead or alive, after taking in what that one stored
(Ingest._take); every write of its rows is fenced by that ownership, so a replica that lost a node
writes nothing more of it. When a replica dies, its agents reconnect through their Service to the
others, which take their nodes over from the store: ack positions included, so nothing is resent
twice or lost.

A standby ingests (checks, stores, acks) and answers its agents' command results; it runs no
detection, breaker, tuning or drain, and serves no operators. The leader does all fleet-wide work:
every replica_sync_seconds it takes in (controller/fleet/adopt.py) the nodes that the others wrote
since its last look, so its detectors, operators' lists and /metrics see the whole fleet.

Not yet: commands the leader issues (periodic probes, retunes, an operator's probe) reach only
the nodes that stream to the leader itself; for the others they are refused as not connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from controller.errors import StoreUnavailable
from controller.fleet.adopt import adopt
from controller.fleet.model import Fleet
from controller.ingest import FleetMirror
from controller.store.owners import CHANGE_MARGIN_SECONDS
from controller.store.store import Store

log = logging.getLogger("gpufleet.controller.replicas")
STREAMING_SYNCS = 3  # a node another replica wrote within this many replica_sync_seconds streams there


class ReplicaFeed:
    """The leader's side: the nodes other replicas ingest, taken in from the store."""

    def __init__(
        self,
        store: Store,
        *,
        fleet: Callable[[], Fleet],
        connections: Mapping[str, int],
        mirror: Callable[[], FleetMirror | None],
        clock: Callable[[], float],
        sync_seconds: float,
    ) -> None:
        self.store, self._fleet, self._connections, self._mirror = store, fleet, connections, mirror
        self.clock = clock
        self.sync_seconds = sync_seconds
        self.since: float | None = None  # this replica's clock at its last look
        self.elsewhere: dict[str, tuple[str, float]] = {}  # node -> (replica, when it last wrote it)
        self.taken = 0  # node loads taken in, for /metrics
        self.failures = 0

    def begin(self) -> None:
        """From now (the leader loaded the store as it was): look for what changes after."""
        self.since = self.clock()

    async def take_in(self) -> list[str]:
        """Take in the nodes other replicas wrote since the last look (allowing for skew between
        their clocks and this one's); their names. Nodes streaming here are left as they are."""
        now = self.clock()
        since = (now if self.since is None else self.since) - CHANGE_MARGIN_SECONDS
        changed = await self.store.changed_nodes(since)
        names = sorted(n for n in changed if self._connections.get(n, 0) == 0)
        stored = await self.store.load_nodes(names) if names else Fleet()
        self.since = now  # (a failed look is taken again from the same time)
        self.elsewhere.update(changed)
        if not names:
            return []
        heard = {n: changed[n][1] for n in names}
        mirror = self._mirror()
        # With a detection copy, the error counters' trends are kept there only (as for frames).
        adopt(self._fleet(), stored, heard, counters=mirror is None)
        if mirror is not None:
            mirror.adopt(stored, heard)
        self.taken += len(stored.nodes)
        return names

    def streaming(self, node: str) -> bool:
        """Whether another replica wrote the node lately (its agent streams there)."""
        seen = self.elsewhere.get(node)
        recent = seen is not None and self.clock() - seen[1] < STREAMING_SYNCS * self.sync_seconds
        return recent and self._connections.get(node, 0) == 0

    def elsewhere_streaming(self) -> int:
        now = self.clock()
        window = STREAMING_SYNCS * self.sync_seconds
        return sum(
            1
            for node, (_, written) in self.elsewhere.items()
            if now - written < window and self._connections.get(node, 0) == 0
        )

    async def run_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.sync_seconds)
                return
            try:
                await self.take_in()
            except StoreUnavailable as exc:  # tried again next time, from the same look
                self.failures += 1
                log.warning("could not take in the other replicas' nodes: %s", exc)
