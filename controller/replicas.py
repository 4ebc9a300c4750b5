"""Agents spread over controller replicas (`replica_ingest: true`).

Every replica serves the agents that connect to it: the standbys too, while they wait for the
lead. A node belongs to the replica that holds its newest stream (controller/store/owners.py): the
Hello takes it, from whichever replica had it, dead or alive, after taking in what that one stored
(Ingest._take); every write of its rows is fenced by that ownership, so a replica that lost a node
writes nothing more of it. When a replica dies, its agents reconnect through their Service to the
others, which take their nodes over from the store: ack positions included, so nothing is resent
twice or lost.

A standby ingests (checks, stores, acks) and probes its agents on connect; it runs no detection,
breaker, tuning or drain, and serves no operators (controller/standby_gate.py). When it takes the
lead its agents' streams stay open (without ingest fronts): its port serves on as the leader's and
their nodes are carried over from its memory (ControllerApp._carry_streams). The leader does all
fleet-wide work: every replica_sync_seconds it takes in (controller/fleet/adopt.py) the nodes that
the others wrote since its last look, so its detectors, operators' lists and /metrics see the whole
fleet; a node another replica wrote lately is connected in the leader's fleet.

Commands go through the store both ways. The leader issues a command for a node that streams to
another replica as for its own (its row stored first); that replica finds it among its nodes'
unfinished commands (every COMMAND_POLL_SECONDS), sends it on the node's stream and stores how it
went; the leader reads the rows of the commands it is waiting for at the same pace and finishes them
as stored (CommandChannel.take_up, settle).

Each replica writes its own clock into the store; the replicas' clocks should agree within a few
seconds (NTP, as Kubernetes nodes do). A node counts as streaming to another replica while that one
wrote it within STREAMING_SYNCS syncs by the leader's clock, and every look reads again what was
written within CHANGE_MARGIN_SECONDS before the last (loading only what was rewritten since).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from controller.commands.channel import CommandChannel
from controller.errors import StoreUnavailable
from controller.fleet.adopt import adopt, adopt_history
from controller.fleet.model import Fleet, ProbeKey
from controller.ingest import FleetMirror
from controller.store.owners import CHANGE_MARGIN_SECONDS
from controller.store.store import Store
from controller.store.stored_nodes import StoredNodes
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.replicas")
STREAMING_SYNCS = 3  # a node another replica wrote within this many replica_sync_seconds streams there
COMMAND_POLL_SECONDS = 2.0  # how often commands across replicas are looked for, both ways
NODES_PER_LOAD = 250  # nodes taken in per store call (the event loop serves between them)


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
        self.commands: CommandChannel | None = None  # the app's, once made
        # Probe results taken in that name a command (the app's probe commands keep them).
        self.on_results: Callable[[str, list[pb.ProbeResult]], None] = lambda node, results: None
        self.clock = clock
        self.sync_seconds = sync_seconds
        self.since: float | None = None  # this replica's clock at its last look
        self.elsewhere: dict[str, tuple[str, float]] = {}  # node -> (replica, when it last wrote it)
        self.taken = 0  # node loads taken in, for /metrics
        self.due = False  # the first look at once, not after replica_sync_seconds (begin)
        self.failures = 0

    def begin(self, since: float | None = None, seen: Mapping[str, tuple[str, float]] | None = None) -> None:
        """From now (the leader loaded the store as it was): look for what changes after. A warm
        standby's fleet (controller/warm_standby.py) is as the store was at `since`, with the nodes
        it took in at the times `seen`: the first look is then at once, from there."""
        self.since = self.clock() if since is None else since
        self.elsewhere.update(seen or {})
        self.due = since is not None

    async def catch_up(self) -> None:
        """After a warm standby's lead (begin with `since`): its first look, at once, so that its
        fleet is the store's before its detectors and actions start (the agents and operators are
        served meanwhile). A look that fails is taken again by run_forever, at once."""
        if not self.due:
            return
        try:
            names = await self.take_in(apart=True)  # (its agents' writes queued meanwhile)
        except StoreUnavailable as exc:
            self.failures += 1
            log.warning("could not take in the other replicas' nodes after taking the lead: %s", exc)
            return
        self.due = False
        log.info("caught up: took in %d nodes written since the standby's last look", len(names))

    async def take_in(self, *, apart: bool = False) -> list[str]:
        """Take in the nodes other replicas wrote since the last look (allowing for skew between
        their clocks and this one's), read `apart` from this replica's writes (Store._read) or after
        them; their names. Nodes streaming here are left as they are."""
        now = self.clock()
        since = (now if self.since is None else self.since) - CHANGE_MARGIN_SECONDS
        changed = await self.store.changed_nodes(since, apart=apart)
        # Rows read again for the margin's sake are loaded only when rewritten since.
        names = sorted(
            n
            for n, seen in changed.items()
            if self._connections.get(n, 0) == 0 and self.elsewhere.get(n) != seen
        )
        for start in range(0, len(names), NODES_PER_LOAD):
            chunk = names[start : start + NODES_PER_LOAD]
            rows = await self.store.load_nodes(chunk, self._held, apart=apart)
            self._adopt(rows, {n: changed[n][1] for n in chunk})
            await self._take_history(rows, apart=apart)
            self.elsewhere.update((n, changed[n]) for n in chunk)
        self.since = now  # (a failed look is taken again from the same time)
        self.elsewhere.update(changed)
        fleet = self._fleet()
        for name, node in fleet.nodes.items():  # connected: streaming here or to another replica
            if self._connections.get(name, 0) == 0:
                node.connected = self.streaming(name)
        return names

    def _held(self, key: ProbeKey) -> float | None:
        """When the probe result the fleet holds under `key` was taken (None: none held). Called
        from the store's thread while the loop waits for the load (or, for the catch-up, from one of
        its own while the loop serves agents): a dict read, atomic under the GIL; a result the loop
        replaces meanwhile is newer, so the stored one skipped for it is older."""
        record = self._fleet().probes.get(key)
        return None if record is None else record.time

    def _adopt(self, rows: StoredNodes, heard: Mapping[str, float]) -> None:
        fleet = self._fleet()
        mirror = self._mirror()
        stored = rows.fleet()
        same = {n for n, r in stored.nodes.items() if n in fleet.nodes and fleet.nodes[n].hello == r.hello}
        # With a detection copy, the error counters' trends are kept there only (as for frames).
        adopt(fleet, stored, heard, counters=mirror is None)
        for name in stored.nodes:
            if name in fleet.nodes:
                fleet.nodes[name].connected = self.streaming(name)
        if mirror is not None:  # the rows as stored (cheap to send); the Hellos it holds left out
            mirror.adopt(rows.without_hellos(same), heard)
        self.taken += len(stored.nodes)
        results: dict[str, list[pb.ProbeResult]] = {}
        for record in stored.probes.values():
            if record.result.command_id:
                results.setdefault(record.node, []).append(record.result)
        for node, found in results.items():  # an operator waiting for a command's results sees them
            self.on_results(node, found)

    async def _take_history(self, rows: StoredNodes, *, apart: bool = False) -> None:
        """The stored probe history of the nodes that had new results in `rows`: a node new to this
        fleet (another replica ingested it from its first frame) came with only each key's newest
        result, as did a key probed more than once since the last look, and the detectors judge a
        GPU against its own history. Read in the store's thread (Store.read_history, while the loop
        goes on with this fleet), then taken in here and by the detection copy."""
        probed = sorted({row[0] for row in rows.probes})
        if not probed:
            return
        history = await self.store.read_history(probed, apart=apart)
        mirror = self._mirror()
        if mirror is not None and history:
            mirror.history(history)  # (encoded now: the fleet below may change its series)
        adopt_history(self._fleet(), history)

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

    # Commands across replicas

    async def settle_commands(self) -> int:
        """The leader's side: the commands it issued for nodes streaming elsewhere, as their
        replicas stored them (finished ones finished here); how many finished."""
        channel = self.commands
        if channel is None:
            return 0
        waiting = channel.delegated()
        if not waiting:
            return 0
        rows = await self.store.commands_by_id([r.id for r in waiting])
        done = [row for row in rows if row.finished is not None]
        nodes = sorted({row.node for row in done if self._connections.get(row.node, 0) == 0})
        if nodes:  # what they sent before answering (probe results) is stored: taken in first
            taken = await self.store.load_nodes(nodes, self._held)
            self._adopt(taken, {})
            await self._take_history(taken)
        for row in rows:
            channel.settle(row)
        return len(done)

    async def deliver_commands(self) -> int:
        """A standby's side: its streaming nodes' unfinished commands that another replica issued,
        sent on their streams; those it sent that the issuer finished meanwhile let go (and its own
        past their deadline timed out). How many it sent."""
        channel = self.commands
        if channel is None:
            return 0
        channel.expire()
        nodes = sorted(channel.streams)
        stored = await self.store.open_commands_of(nodes) if nodes else []
        channel.let_go({r.id for r in stored})
        return sum(channel.take_up(record) for record in stored)

    async def deliver_forever(self) -> None:
        """deliver_commands every COMMAND_POLL_SECONDS, until cancelled (a standby's lifetime)."""
        while True:
            await asyncio.sleep(COMMAND_POLL_SECONDS)
            try:
                await self.deliver_commands()
            except StoreUnavailable as exc:
                log.warning("could not look for commands to send: %s", exc)

    async def run_forever(self, stop: asyncio.Event) -> None:
        """The leader's side: take_in every sync_seconds (read apart from this replica's writes),
        settle_commands every COMMAND_POLL_SECONDS."""
        loop = asyncio.get_running_loop()
        next_take = loop.time() + (0 if self.due else self.sync_seconds)
        tick = min(COMMAND_POLL_SECONDS, self.sync_seconds)
        wait = 0.0 if self.due else tick
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
                return
            wait = tick
            try:
                await self.settle_commands()
            except StoreUnavailable as exc:
                log.warning("could not read the commands other replicas send: %s", exc)
            if loop.time() < next_take:
                continue
            next_take = loop.time() + self.sync_seconds
            try:  # apart: its agents' acks do not wait behind the loads (0.3-0.5 s a chunk)
                await self.take_in(apart=True)
            except StoreUnavailable as exc:  # tried again next time, from the same look
                self.failures += 1
                log.warning("could not take in the other replicas' nodes: %s", exc)
