"""A standby that holds the fleet while it waits for the lead (replica_ingest with warm_standby).

Without it a standby that takes the lead loads the whole store first: 15-20 s at 12,500 nodes with
full probe history on PostgreSQL, on top of the 15 s in which the server ends a hung leader's
session (controller/store/postgres_lease.py). So a warm standby loads the store once while it waits,
on a connection of its own (the store thread goes on with its agents' writes), and then, every
LOOK_SECONDS, takes in the nodes any replica wrote since (node_owners.written, as the leader does
every replica_sync_seconds: controller/replicas.py) and drops those the store no longer holds; its
looks read apart too (Store._read), not queued behind its agents' writes: when the fleet's agents
move to it as it takes the lead, its last look's reads waited 14-22 s in that queue.
On taking the lead it catches up its own nodes (but those whose agents stream on, carried over
from its ingest's memory instead: ControllerApp._carry_streams) and leads with that fleet; its first
take-in of the others' nodes (ReplicaFeed.catch_up, at once, before the detection process gets the
fleet) starts from its last look, so the fleet is then the store's, as a load would have read it.
Until then the other replicas' nodes are as that look left them, up to LOOK_SECONDS old (a leader's are up to
replica_sync_seconds old at any time). At 12,500 nodes on PostgreSQL it serves 0.14 s after its
term begins and has caught up 10 s later; loading the store took 15-20 s before it served
(bench/controller_startup.py --warm).

A look takes in each probe key's newest result, and the stored history of the nodes that have new
ones (a key probed twice between two looks has both there). Each look reads again the nodes that
were rewritten, readings and all: the replicas write every node every replica_sync_seconds, so a look
costs about what one of the leader's does; at 60 s the standby spends a sixth of that leader's work.

Findings, silences, commands, the breaker, tuning and drains are read at the lead as before
(ControllerApp.start): they are small, and only the leader writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from controller.errors import StoreUnavailable
from controller.fleet.adopt import adopt, adopt_history
from controller.fleet.expiry import forget
from controller.fleet.model import Fleet, ProbeKey
from controller.store.owners import CHANGE_MARGIN_SECONDS
from controller.store.store import Store

log = logging.getLogger("gpufleet.controller.warm_standby")
LOOK_SECONDS = 60.0
RETRY_SECONDS = 10.0  # after a load that failed (the store unreachable)
NODES_PER_LOOK_LOAD = 250  # nodes read per store call: the store thread serves the agents' writes between


class WarmStandby:
    """The fleet as stored, kept while this replica stands by: start(), then take_over() at the lead."""

    def __init__(self, store: Store, clock: Callable[[], float], look_seconds: float = LOOK_SECONDS) -> None:
        self.store, self.clock, self.look_seconds = store, clock, look_seconds
        self.fleet: Fleet | None = None  # once loaded
        self.since = 0.0  # this replica's clock when the last look (or the load) began
        self.seen: dict[str, tuple[str, float]] = {}  # node -> (replica, when) as last taken in
        self.looks = 0
        self.failures = 0  # loads and looks that failed
        self._loading: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop looking (a standby that stops without leading). A load under way finishes in its
        thread and is dropped."""
        for task in (self._task, self._loading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
                    await task

    async def take_over(self, skip: Callable[[str], bool] | None = None) -> Fleet | None:
        """The fleet to lead with (a load under way awaited first: it is further along than a new
        one), with this replica's own nodes caught up (their agents' streams here just ended; its
        last readings were stored as they did) and the nodes the store no longer holds dropped. The
        other replicas' nodes are as the last look left them: the leader's first take-in reads them
        from `since`, at once (ReplicaFeed.begin), as it does every replica_sync_seconds after.
        None when there is none (its load failed, or this look did): the caller loads the store.
        `skip(name)`: a node not read again (its agent streams on here: the caller carries it over
        from its ingest's memory, which is newer), asked as each is about to be read."""
        if self._loading is not None:
            with contextlib.suppress(StoreUnavailable):
                await asyncio.shield(self._loading)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.fleet is None:
            return None
        try:
            await self.look(mine_only=True, skip=skip)
        except StoreUnavailable as exc:
            self.failures += 1
            log.warning("warm standby: the last look before leading failed (%s); loading the store", exc)
            return None
        return self.fleet

    async def _run(self) -> None:
        while self.fleet is None:
            loading = self._loading = asyncio.create_task(self._load())
            try:
                await asyncio.shield(loading)  # a take_over() waits for it, uncancelled
            except StoreUnavailable as exc:
                self.failures += 1
                log.warning("warm standby: loading the store failed (%s); trying again", exc)
                await asyncio.sleep(RETRY_SECONDS)
            finally:
                if loading.done():
                    self._loading = None
        while True:
            await asyncio.sleep(self.look_seconds)
            try:
                await self.look()
            except StoreUnavailable as exc:
                self.failures += 1
                log.warning("warm standby: a look at the store failed (%s); looking again later", exc)

    async def _load(self) -> None:
        since = self.clock()
        fleet, _ = await self.store.load_apart()
        self.fleet, self.since = fleet, since
        log.info("warm standby: %d nodes loaded from the store while waiting for the lead", len(fleet.nodes))

    async def look(self, *, mine_only: bool = False, skip: Callable[[str], bool] | None = None) -> list[str]:
        """Take in the nodes any replica (`mine_only`: this one) wrote since the last look (allowing
        for skew between the replicas' clocks), but those `skip` names as each chunk is read, and
        drop the ones the store no longer holds; the names taken in."""
        fleet = self.fleet
        if fleet is None:
            raise RuntimeError("look() before the warm standby's load")
        now = self.clock()
        changed = await self.store.changed_nodes(self.since - CHANGE_MARGIN_SECONDS, mine=True, apart=True)
        names = sorted(
            n
            for n, written in changed.items()
            if self.seen.get(n) != written and (not mine_only or written[0] == self.store.owner)
        )

        def held(key: ProbeKey) -> float | None:  # (in the store's thread: a dict read)
            record = fleet.probes.get(key)
            return None if record is None else record.time

        taken: list[str] = []
        for start in range(0, len(names), NODES_PER_LOOK_LOAD):
            chunk = [n for n in names[start : start + NODES_PER_LOOK_LOAD] if skip is None or not skip(n)]
            if not chunk:
                continue
            taken += chunk
            rows = await self.store.load_nodes(chunk, held, apart=True)
            adopt(fleet, rows.fleet(), {n: changed[n][1] for n in chunk})
            self.seen.update((n, changed[n]) for n in chunk)
            # A key may have had more than one result since the last look: its history as stored.
            probed = sorted({row[0] for row in rows.probes})
            if probed:  # (read apart, taken in here: the store's thread writes nothing of this fleet)
                adopt_history(fleet, await self.store.read_history(probed, apart=True))
        stored = await self.store.node_names(apart=True)
        gone = [n for n in fleet.nodes if n not in stored]
        if gone:  # forgotten by the leader (limits.forget_after_seconds)
            forget(fleet, gone)
            for name in gone:
                self.seen.pop(name, None)
        if not mine_only:
            self.since = now
            self.looks += 1
        return taken
