"""The store: nodes, boots (ack positions), latest GPU/host/BMC state, probe results, findings,
commands (controller/store/commands.py), the audit log and the breaker's state (controller/store/audit.py),
tuning recommendations (controller/store/recommendations.py), drains (controller/store/drains.py).

The rows live in SQLite or PostgreSQL (controller/store/backends.py); the SQL that reads and
writes them runs in the store thread (writer.py); `Store` is the async face the rest of the
controller uses.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import TypeVar

from controller.errors import RowBusy, StoreUnavailable
from controller.fleet.findings import StoredFinding
from controller.fleet.model import Fleet, FrameWrite, GpuState, NodeState, ProbeKey
from controller.fleet.series import Series
from controller.fleet.silencing import Ack, Maintenance, Silence, Silencing
from controller.metrics_record import STORE_BUCKETS, LabelledHistograms
from controller.paging import FindingKey
from controller.store import audit as audit_rows
from controller.store import commands as command_rows
from controller.store import drains as drain_rows
from controller.store import finding_pages, logged_history
from controller.store import forget as forget_rows
from controller.store import leader as leader_rows
from controller.store import nodes as node_rows
from controller.store import owners as owner_rows
from controller.store import recommendations as recommendation_rows
from controller.store import silences as silence_rows
from controller.store.audit import AuditEntry
from controller.store.backends import Backend, Connection, open_backend
from controller.store.checkpoint import Checkpointer
from controller.store.commands import CommandRecord
from controller.store.drains import DrainRecord
from controller.store.lease import POLL_SECONDS, BothLeases, Lease
from controller.store.lease_keeper import LeaseKeeper
from controller.store.recommendations import Recommendation
from controller.store.stored_nodes import HeldProbeTime, StoredNodes, fetch_nodes
from controller.store.writer import StoreThread, Together
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.store")

T = TypeVar("T")
# A claim waits this long for a node's row locked by another replica's batch, then its own batch
# goes on without it and it comes again (first after about CLAIM_FIRST_RETRY_SECONDS, doubling),
# for up to CLAIM_DEADLINE_SECONDS in all (then the Hello fails, as when the store is down).
CLAIM_LOCK_WAIT_SECONDS = 0.1
CLAIM_FIRST_RETRY_SECONDS = 0.02
CLAIM_MAX_RETRY_SECONDS = 1.0
CLAIM_DEADLINE_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class TakenNode:
    """What Store.take_node did: the replica that had the node before (None: none, or this one),
    its rows as stored (None: not read) and the ack position of the Hello's boot (0: new)."""

    before: str | None
    rows: StoredNodes | None
    acked: int


OPERATIONS = (
    "init",
    "load",
    "save_hello",
    "save_frame",
    "save_latest",
    "save_findings",
    "list_findings",
    "prune_history",
    "save_command",
    "list_commands",
    "load_commands",
    "audit",
    "list_audit",
    "breaker",
    "recommendations",
    "drains",
    "silences",
    "leader",
    "owners",
)


AckItem = tuple[FrameWrite, str | None, float]  # a frame, the replica writing it (or None), its time
# A Hello, whether its node is held, the replica taking it, the claim's time (owner_clock), the Hello's
TakeItem = tuple[pb.Hello, bool, str, float, float]


class Store:
    def __init__(self, path: str, *, synchronous: str = "full", commit_interval_seconds: float = 0.0) -> None:
        """`path`: an SQLite file (":memory:" for tests) or a postgresql:// URL.
        `commit_interval_seconds`: a transaction begins at most this often (writer.py)."""
        self.path = path
        self.backend: Backend = open_backend(path, synchronous=synchronous)
        self.description = self.backend.description  # for logs: no password
        self._thread = StoreThread(self.backend, pace_seconds=commit_interval_seconds)
        # Seconds from a call to its commit (queueing and group commit included), per operation.
        self.latency = LabelledHistograms(STORE_BUCKETS, OPERATIONS)
        self.epoch: int | None = None  # this controller's term as leader, once lead() returned
        self._lease: LeaseKeeper | None = None  # checked from the moment it is won
        # A standby taking the lead on its agents' streams (ControllerApp.start): the state a start
        # loads (commands, silences, recommendations, drains, the breaker) read apart (_read), not
        # queued behind their writes.
        self.loads_apart = False
        # replica_ingest (controller/replicas.py): this replica's name. Every write of a node's rows
        # then checks that it still owns the node (controller/store/owners.py); None: no check.
        self.owner: str | None = None
        self.owner_clock: Callable[[], float] = time.time  # when rows were written, for the leader
        self.claim_retries = 0  # claims that found their node's row locked and came again
        self.busy_writes = 0  # writes not made: their node's owner row held by another replica's claim

    @property
    def batches_run_again(self) -> int:
        """Batches of writes that may run twice rolled back and run again (controller/store/writer.py)."""
        return self._thread.batches_run_again

    @property
    def lock_waits(self) -> int:
        """Transactions tried again: another writer held the store's file (controller/store/writer.py)."""
        return self._thread.lock_waits

    @property
    def checkpointer(self) -> Checkpointer | None:
        """SQLite's WAL checkpoints (controller/store/checkpoint.py); None on PostgreSQL or in memory."""
        checkpointer: Checkpointer | None = getattr(self.backend, "checkpointer", None)
        return checkpointer

    async def _call(
        self,
        operation: str,
        fn: Callable[[Connection], T],
        *,
        replayable: bool = False,
        together: Together | None = None,
    ) -> T:
        """fn in the store thread (controller/store/writer.py: `replayable`, fn may run twice;
        `together`, how it may run as one with the jobs beside it)."""
        start = perf_counter()
        try:
            return await self._thread.call(fn, replayable=replayable, together=together)
        finally:
            self.latency.observe(operation, perf_counter() - start)

    # The leader lease (controller/store/lease.py)

    async def lead(
        self,
        holder: str,
        now: float,
        on_wait: Callable[[], None],
        poll: float = POLL_SECONDS,
        *,
        election: Lease | None = None,
    ) -> int:
        """Wait until this controller holds the store's lease (on_wait() once, if it has to wait),
        then start its term; the term's number. Call after open(). `election` (a Kubernetes Lease)
        is held first, and the store's lease after it."""
        lease: Lease = self.backend.lease()
        if election is not None:
            lease = BothLeases(election, lease)
        waited = False
        try:
            while not await asyncio.to_thread(lease.try_acquire):
                if not waited:
                    on_wait()
                    waited = True
                await asyncio.sleep(poll)
        except BaseException:  # cancelled while waiting (a standby stopped): what it opened, closed
            lease.release()
            raise
        self._lease = LeaseKeeper(lease, poll)
        self._lease.start()
        try:
            self.epoch = await self._call("leader", lambda c: leader_rows.begin_term(c, holder, now))
        except BaseException:
            self._release()
            raise
        return self.epoch

    async def still_leading(self) -> bool:
        """Whether the lease is still held and the store still names this term."""
        if self._lease is None or self.epoch is None or not await self._lease.alive():
            return False
        term = await self._call("leader", leader_rows.current_term)
        return term is not None and term[0] == self.epoch

    def _fenced(self, fn: Callable[[Connection], T]) -> Callable[[Connection], T]:
        """fn, after checking in the same transaction that this controller's term is the store's
        (NotLeader if not; no check before lead())."""

        def fenced(conn: Connection) -> T:
            if self.epoch is not None:
                leader_rows.check_term(conn, self.epoch)
            return fn(conn)

        return fenced

    def _release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.stop()

    async def open(self) -> None:
        self._thread.start()

        def init(conn: Connection) -> int:
            self.backend.init(conn)
            return node_rows.fill_series(conn)  # in the schema's transaction: once, by one replica

        filled = await self._call("init", init)
        if filled:
            log.info(
                "store %s: probe_series built from probe_history for %d probe keys", self.description, filled
            )
        self.backend.start()

    def close(self) -> None:
        self.backend.stop()
        self._thread.stop()  # the last connection to close checkpoints what is left
        self._release()  # after the last write: a standby may take over from here

    async def load(self) -> tuple[Fleet, list[StoredFinding]]:
        return await self._call("load", node_rows.load)

    async def load_apart(self) -> tuple[Fleet, list[StoredFinding]]:
        """load(), on a connection of its own in a thread of its own: the store thread goes on with
        this replica's writes meanwhile (a standby's load while it waits, controller/warm_standby.py).
        StoreUnavailable when the store cannot be read."""
        return await self._read("load", node_rows.load, apart=True)

    async def _read(self, operation: str, fn: Callable[[Connection], T], *, apart: bool) -> T:
        """fn in the store thread (_call), or `apart`: on a connection of its own in a thread of its
        own (_read_apart), not queued behind this replica's writes, which it sees once committed."""
        if not apart:
            return await self._call(operation, fn)
        start = perf_counter()
        try:
            return await asyncio.to_thread(self._read_apart, fn)
        finally:
            self.latency.observe(operation, perf_counter() - start)

    def _read_apart(self, fn: Callable[[Connection], T]) -> T:
        """fn(a new connection) in one read transaction, rolled back; the connection closed (in
        this thread, with every cursor fn made: controller/gc_policy.py says why)."""
        failures: tuple[type[BaseException], ...] = (*self.backend.errors, OSError)
        try:
            conn = self.backend.connect()
            try:
                conn.execute("BEGIN")
                return fn(conn)
            finally:
                conn.close()  # (its open read transaction ends with it)
        except failures as exc:
            traceback.clear_frames(exc.__traceback__)
            raise StoreUnavailable(f"store unavailable: {exc}") from None

    async def active_findings(self, *, apart: bool = False) -> list[StoredFinding]:
        """Every active finding, as load() reads them (`apart`: _read)."""
        return await self._read("load", node_rows.active_findings, apart=apart)

    async def read_history(self, nodes: Sequence[str], *, apart: bool = False) -> dict[ProbeKey, Series]:
        """These nodes' probe history as stored, each key's series (read in the store's thread, or
        `apart` in one of its own (_read), into a fleet of its own: nothing the loop holds is written
        from there; the caller takes them in, controller/fleet/adopt.py adopt_history)."""
        names = list(nodes)
        read = Fleet()
        await self._read("load", lambda c: node_rows.load_history(c, read, names), apart=apart)
        return read.history

    async def node_names(self, *, apart: bool = False) -> set[str]:
        """The names of the nodes the store holds."""
        return await self._read("load", node_rows.node_names, apart=apart)

    async def save_hello(self, hello: pb.Hello, now: float) -> int:
        """Record the node's Hello; return the acked seq of its boot (0 if new). It may run twice
        (all it does is in the database), and Hellos queued one after another are saved as one
        (node_rows.save_hellos): when a fleet reconnects at once, a Hello in a batch of frames no
        longer gave every job of that batch its own savepoint, and the Hellos their own statements."""
        return await self._call(
            "save_hello",
            lambda c: node_rows.save_hello(c, hello, now),
            replayable=True,
            together=Together(node_rows.save_hellos, (hello, now)),
        )

    async def save_frame(self, write: FrameWrite) -> None:
        """NotOwner (nothing written) when another replica took the node. A frame with nothing to
        store but its ack position may be written together with the others queued beside it
        (_acks_together)."""
        owner = self.owner
        now = self.owner_clock() if owner is not None else 0.0
        plain = not write.state and not write.probes and write.bmc is None
        together = Together(self._acks_together, (write, owner, now)) if plain else None

        def job(conn: Connection) -> None:
            if owner is not None:
                owner_rows.mark_written(conn, write.node, owner, now, self.backend.skip_locked)
            node_rows.save_frame(conn, write)

        try:
            await self._call("save_frame", job, replayable=True, together=together)
        except RowBusy:
            self.busy_writes += 1  # being taken: its agent sends the frame to the replica taking it
            raise

    def _acks_together(self, conn: Connection, items: list[AckItem]) -> list[None]:
        """Frames with nothing to store but their ack positions, written as one (controller/store/
        writer.py Together): with an owner, their nodes' owner rows marked in one statement, raising
        RowBusy when one is not this replica's to write (the batch then goes frame by frame, each
        refused or written as save_frame does); their ack positions in another."""
        owner = items[0][1]
        if owner is not None:
            nodes = [write.node for write, _, _ in items]
            now = max(now for _, _, now in items)
            if any(o != owner for _, o, _ in items) or not owner_rows.mark_owned(
                conn, nodes, owner, now, self.backend.skip_locked
            ):
                raise RowBusy("a node of the group is not this replica's to write: frame by frame")
        node_rows.save_acks(conn, [write for write, _, _ in items])
        return [None] * len(items)

    # Nodes spread over replicas (controller/store/owners.py)

    async def claim_node(self, node: str) -> str | None:
        """This replica (`owner`) ingests `node` from now; the replica that did before, or None."""
        return await self._claiming(node, lambda conn, now: owner_rows.claim(conn, node, self._owner(), now))

    async def take_node(self, hello: pb.Hello, now: float, *, known: bool) -> TakenNode:
        """A Hello on this replica (`owner`), in one job of the store thread: its node claimed as
        claim_node does, its rows read as load_nodes does when another replica had it or this one
        does not hold it (`known`: it does), its Hello saved as save_hello does at `now`. One turn
        in the store thread's queue, not three: when a fleet's agents move at once (a replica's
        death) each Hello waited its turn three times behind their first frames."""
        owner, node = self._owner(), hello.node

        def take(conn: Connection, claimed: float) -> TakenNode:
            before = owner_rows.claim(conn, node, owner, claimed)
            # Read after the claim: what the replica that had it wrote before the claim, every row
            # (its writes after are refused: the claim holds its owner row, then names this one).
            rows = fetch_nodes(conn, [node], None) if before is not None or not known else None
            return TakenNode(before, rows, node_rows.save_hello(conn, hello, now))

        def together(claimed: float) -> Together:
            return Together(self._takes_together, (hello, known, owner, claimed, now))

        return await self._claiming(node, take, together)

    def _takes_together(self, conn: Connection, items: list[TakeItem]) -> list[TakenNode]:
        """Hellos queued one after another, taken as one (writer.py Together): their nodes claimed
        in one executemany, the rows of those another replica had (or this one does not hold) read
        in one set of statements, their Hellos saved in one more, where each alone took a dozen
        round trips to the server (when a replica dies, its agents' Hellos reach the heir by the
        thousand). A node named twice, or a row another transaction holds (RowBusy), and the batch
        goes Hello by Hello, each as take_node does it alone."""
        if len({hello.node for hello, *_ in items}) != len(items):
            raise RowBusy("a node's Hello twice in the group: Hello by Hello")
        with self.backend.short_lock_waits(conn, CLAIM_LOCK_WAIT_SECONDS):
            before = owner_rows.claim_all(
                conn, [(hello.node, owner, claimed) for hello, _, owner, claimed, _ in items]
            )
            read = [hello.node for hello, known, *_ in items if before[hello.node] is not None or not known]
            rows = fetch_nodes(conn, read, None).by_node() if read else {}
            acked = node_rows.save_hellos(conn, [(hello, now) for hello, _, _, _, now in items])
        return [
            TakenNode(
                before[hello.node],
                rows.get(hello.node, StoredNodes()) if hello.node in read else None,
                seq,
            )
            for (hello, *_), seq in zip(items, acked, strict=True)
        ]

    def _owner(self) -> str:
        if self.owner is None:
            raise RuntimeError("claiming a node needs the store's owner set")
        return self.owner

    async def _claiming(
        self,
        node: str,
        job: Callable[[Connection, float], T],
        together: Callable[[float], Together] | None = None,
    ) -> T:
        """job(connection, now by owner_clock) in the store thread, its node's owner row waited for
        at most CLAIM_LOCK_WAIT_SECONDS; a row that stays locked (another replica's batch holds it)
        makes the job come again, after a backoff, for up to CLAIM_DEADLINE_SECONDS. With
        `together` (its Together for that now) the job may run as one with its neighbours: all it
        does is in the database, so it may run twice (writer.py `replayable`)."""
        began, delay = time.monotonic(), CLAIM_FIRST_RETRY_SECONDS
        while True:
            now = self.owner_clock()

            def claim(conn: Connection, now: float = now) -> T:
                with self.backend.short_lock_waits(conn, CLAIM_LOCK_WAIT_SECONDS):
                    return job(conn, now)

            try:
                if together is not None:
                    return await self._call("owners", claim, replayable=True, together=together(now))
                return await self._call("owners", claim)
            except RowBusy as exc:
                # The node's row is in another replica's open batch (its last frame, or that
                # replica claiming it too). Waiting inside this batch could close a circle (that
                # batch waiting on a row this one holds: PostgreSQL's deadlock, a job aborted a
                # second later); so this batch goes on without the claim, which comes again.
                self.claim_retries += 1
                if time.monotonic() - began + delay > CLAIM_DEADLINE_SECONDS:
                    raise StoreUnavailable(f"node {node}: {exc}; gave up claiming it") from None
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, CLAIM_MAX_RETRY_SECONDS)

    async def changed_nodes(
        self, since: float, *, mine: bool = False, apart: bool = False
    ) -> dict[str, tuple[str, float]]:
        """The nodes other replicas (`mine`: this one too) wrote after `since`: node -> (replica, when)."""
        owner = "" if mine else self.owner or ""
        return await self._read("owners", lambda c: owner_rows.changed(c, owner, since), apart=apart)

    async def load_nodes(
        self, names: Sequence[str], held: HeldProbeTime | None = None, *, apart: bool = False
    ) -> StoredNodes:
        """The named nodes' rows as stored, unparsed (StoredNodes.fleet parses them); with `held`,
        only their probe results newer than held says (it is called from the store's thread, or
        `apart`, one of its own: _read)."""
        names = list(names)
        return await self._read("load", lambda c: fetch_nodes(c, names, held), apart=apart)

    def queue_latest(
        self, nodes: Sequence[NodeState], gpus: Mapping[str, list[GpuState]] | None = None
    ) -> asyncio.Future[int]:
        """Queue these nodes' latest readings as memory holds them now (Ingest.save_state; `gpus`:
        a node's GPU readings to write instead); the future settles once they are committed, with
        how many were not written because another replica was taking their node."""
        instead = gpus or {}
        rows = [(n.name, instead.get(n.name) or list(n.gpus.values()), n.host, n.host_time) for n in nodes]
        owner, now = self.owner, self.owner_clock()

        def save(conn: Connection) -> int:
            if owner is None:
                node_rows.save_latest_of(conn, rows)
                return 0
            # Those another replica took, or is taking (busy), are that one's to write.
            names = [row[0] for row in rows]
            written, busy = owner_rows.mark_all_written(conn, names, owner, now, self.backend.skip_locked)
            node_rows.save_latest_of(conn, [row for row in rows if row[0] in written])
            return busy

        start = perf_counter()
        future = self._thread.submit(save, replayable=True)

        def done(settled: asyncio.Future[int]) -> None:
            self.latency.observe("save_latest", perf_counter() - start)
            if not settled.cancelled() and settled.exception() is None:
                self.busy_writes += settled.result()

        future.add_done_callback(done)
        return future

    async def save_findings(self, upserts: list[StoredFinding], resolved: list[StoredFinding]) -> None:
        await self._call("save_findings", lambda c: node_rows.save_findings(c, upserts + resolved))

    async def list_findings(
        self, node: str = "", include_resolved: bool = False, limit: int = 1000
    ) -> list[StoredFinding]:
        return await self._call(
            "list_findings", lambda c: node_rows.list_findings(c, node, include_resolved, limit)
        )

    async def list_findings_page(
        self,
        node: str,
        include_resolved: bool,
        severities: Sequence[str] | None,
        after: FindingKey | None,
        limit: int,
        *,
        since: float | None = None,
    ) -> list[StoredFinding]:
        """A page of findings in the operator API's order (controller/store/finding_pages.py);
        `since`: only those last seen at or after it."""
        return await self._call(
            "list_findings",
            lambda c: finding_pages.list_page(
                c, node, include_resolved, severities=severities, after=after, limit=limit, since=since
            ),
        )

    async def prune_history(self, before: float) -> int:
        """Drop finished commands and finished recommendations older than `before`, and probe_history's
        rows (written by a controller from before probe_series) as old, a few nodes a job
        (controller/store/logged_history.py); how many rows went."""
        removed, nodes = await self._call(
            "prune_history",
            lambda c: (
                command_rows.prune_commands(c, before) + recommendation_rows.prune(c, before),
                logged_history.nodes_logged(c),
            ),
        )
        for start in range(0, len(nodes), logged_history.PRUNE_NODES):
            chunk = nodes[start : start + logged_history.PRUNE_NODES]
            job = partial(logged_history.prune, nodes=chunk, before=before)
            removed += await self._call("prune_history", job)
        return removed

    async def forget_nodes(self, names: list[str]) -> int:
        """Delete every row about these nodes but the audit log's (controller/store/forget.py)."""
        return await self._call("prune_history", lambda c: forget_rows.forget_nodes(c, names))

    def save_command(self, record: CommandRecord, *, if_open: bool = False) -> asyncio.Future[None]:
        """Queue the command's current state at once (writes keep their order); await to know it is
        stored. `if_open`: only over a row not finished yet."""
        row = copy.copy(record)  # the row as it is now, whatever changes before the store thread runs
        start = perf_counter()
        future = self._thread.submit(
            self._fenced(lambda c: command_rows.save_command(c, row, if_open=if_open))
        )
        future.add_done_callback(lambda _: self.latency.observe("save_command", perf_counter() - start))
        return future

    async def list_commands(self, node: str = "", limit: int = 100) -> list[CommandRecord]:
        return await self._call("list_commands", lambda c: command_rows.list_commands(c, node, limit))

    async def load_commands(self) -> tuple[list[CommandRecord], list[CommandRecord]]:
        """What a starting controller takes up: the unfinished commands, and those timed out with no
        answer yet (a late answer is still recorded against them)."""
        return await self._read("load_commands", command_rows.load_commands, apart=self.loads_apart)

    async def open_commands_of(self, nodes: Sequence[str]) -> list[CommandRecord]:
        """These nodes' unfinished commands, oldest first."""
        names = list(nodes)
        return await self._call("list_commands", lambda c: command_rows.open_commands_of(c, names))

    async def commands_by_id(self, ids: Sequence[str]) -> list[CommandRecord]:
        wanted = list(ids)
        return await self._call("list_commands", lambda c: command_rows.commands_by_id(c, wanted))

    async def add_audit(self, entry: AuditEntry) -> None:
        """Write a request's audit entry; returns once it is committed (so before anything acts)."""
        await self._call("audit", self._fenced(lambda c: audit_rows.add_entry(c, entry)))

    async def set_audit_outcome(self, entry_id: str, outcome: str, when: float, detail: str = "") -> None:
        await self._call("audit", lambda c: audit_rows.set_outcome(c, entry_id, outcome, when, detail))

    async def get_audit(self, entry_id: str) -> AuditEntry | None:
        return await self._call("list_audit", lambda c: audit_rows.get_entry(c, entry_id))

    async def list_audit(
        self, node: str = "", since: float | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        return await self._call("list_audit", lambda c: audit_rows.list_entries(c, node, since, limit))

    async def save_recommendation(self, rec: Recommendation) -> None:
        row = recommendation_rows.to_row(rec)  # as it is now, whatever changes before the thread runs
        await self._call("recommendations", lambda c: recommendation_rows.save(c, row))

    async def delete_recommendation(self, rec_id: str) -> None:
        await self._call("recommendations", lambda c: recommendation_rows.delete(c, rec_id))

    # Acks, silences and maintenance (controller/store/silences.py)

    async def load_silencing(self, now: float) -> Silencing:
        """The silences not over at `now`, the nodes under maintenance and every finding's ack."""
        return await self._read("silences", lambda c: silence_rows.load(c, now), apart=self.loads_apart)

    async def save_silence(self, silence: Silence) -> None:
        row = copy.copy(silence)  # as it is now, whatever changes before the thread runs
        await self._call("silences", lambda c: silence_rows.save_silence(c, row))

    async def get_silence(self, silence_id: str) -> Silence | None:
        return await self._call("silences", lambda c: silence_rows.get_silence(c, silence_id))

    async def list_silences(self, node: str, include_expired: bool, now: float, limit: int) -> list[Silence]:
        return await self._call(
            "silences", lambda c: silence_rows.list_silences(c, node, include_expired, now, limit)
        )

    async def set_maintenance(self, node: str, maintenance: Maintenance | None) -> None:
        await self._call("silences", lambda c: silence_rows.set_maintenance(c, node, maintenance))

    async def save_ack(self, ack: Ack) -> None:
        await self._call("silences", lambda c: silence_rows.save_ack(c, ack))

    async def get_finding(self, finding_id: str) -> StoredFinding | None:
        return await self._call("list_findings", lambda c: silence_rows.get_finding(c, finding_id))

    async def list_recommendations(self, node: str = "", limit: int = 100) -> list[Recommendation]:
        return await self._call("recommendations", lambda c: recommendation_rows.list_rows(c, node, limit))

    async def load_recommendations(self) -> list[Recommendation]:
        return await self._read("recommendations", recommendation_rows.load_all, apart=self.loads_apart)

    async def save_drain(self, record: DrainRecord) -> None:
        row = drain_rows.to_row(record)  # as it is now, whatever changes before the thread runs
        await self._call("drains", lambda c: drain_rows.save(c, row))

    async def list_drains(self, node: str = "", limit: int = 10) -> list[DrainRecord]:
        return await self._call("drains", lambda c: drain_rows.list_rows(c, node, limit))

    async def load_running_drains(self) -> list[DrainRecord]:
        return await self._read("drains", drain_rows.load_running, apart=self.loads_apart)

    async def save_breaker(self, state: str, when: float) -> None:
        await self._call("breaker", lambda c: audit_rows.save_breaker(c, state, when))

    async def load_breaker(self) -> str | None:
        return await self._read("breaker", audit_rows.load_breaker, apart=self.loads_apart)
