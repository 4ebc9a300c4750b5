"""The controller's core, without gRPC: store, fleet state, ingest, connections, detection passes,
the command channel to agents (controller/commands/), probe commands (controller/probing.py) and
tuning (controller/remediate/retune.py: recommendations after each pass, applies, their outcomes).

This is the controller's composition root: ControllerApp.__init__ wires every subsystem from the
config, and a new one (tuning, Kubernetes) plugs in here; controller/server.py adds gRPC and
/metrics around it, and controller/main.py is the `gpufleet` command's dispatcher. Servicers
translate the wire to calls on this object; tests drive it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Protocol

from controller.commands.channel import CommandChannel
from controller.config import ConfigError, ControllerConfig
from controller.connection_log import ConnectionLog
from controller.detect.base import DetectContext, discover
from controller.detect.runner import PassReport, run_detectors_yielding
from controller.detection.pool import DetectionPool
from controller.detection.process import DetectionUnavailable
from controller.errors import StoreUnavailable
from controller.fleet.adopt import adopt_history, carry
from controller.fleet.expiry import forget, gone_nodes
from controller.fleet.finding import FindingKey
from controller.fleet.findings import FindingTracker, StoredFinding
from controller.fleet.health import silent_for
from controller.fleet.model import Fleet, ProbeKey
from controller.fleet.series import Series
from controller.fleet.silencing import Silencing
from controller.gc_policy import CollectorPolicy, collector_paused
from controller.ingest import Ingest
from controller.kube.actions import KubeActions
from controller.kube.cluster import find_cluster
from controller.kube.lease import KubeLease
from controller.kube.policy import DrainPolicy
from controller.kube.publish import HealthPublisher
from controller.kube.recovery import Recovery
from controller.kube.role import POD_NAMESPACE_ENV
from controller.loop_lag import LoopLag
from controller.metrics_record import PASS_BUCKETS, SecondsHistogram
from controller.probing import Probing
from controller.record_lines import Converter
from controller.record_space import SpaceGuard
from controller.recording import FileSink, RecordHub
from controller.remediate.audit import Auditor
from controller.remediate.guard import Breaker
from controller.remediate.retune import Tuner
from controller.replicas import ReplicaFeed
from controller.security.identity import NodeIdentities
from controller.store.store import Store
from controller.warm_standby import WarmStandby
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller")


@dataclass(slots=True)
class Takeover:
    """A standby's passage to the lead (ControllerApp.start)."""

    won: bool = False  # the store's lead won
    # Set by the server when the standby's agents' port serves on as the leader's: its agents'
    # streams stay open through the lead (controller/server.py; ControllerApp._carry_streams).
    streams_kept: bool = False
    unflushed: set[str] = field(default_factory=set)  # its nodes' readings not stored as it ended


CARRY_HISTORY_READS = 3  # rounds of reading carried nodes' probe history before the fleet moves
PROBE_HISTORY_DAYS = 30


class IngestFront(Protocol):
    """What the app shows of one ingest front (controller/fronts/relay.py, which imports the app)."""

    @property
    def index(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def streams(self) -> Sized: ...


class IngestFronts(Protocol):
    @property
    def running(self) -> Sequence[IngestFront]: ...

    @property
    def restarts(self) -> int: ...

    @property
    def planned(self) -> int: ...


class ControllerApp:
    def __init__(self, config: ControllerConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.store = Store(
            config.db,
            synchronous=config.db_synchronous,
            commit_interval_seconds=config.db_commit_interval_seconds,
        )
        self.holder = f"{socket.gethostname()}:{os.getpid()}"  # this replica, in the store's rows
        self.fleet = Fleet()
        # Agents connecting and leaving, as the log tells them: counted past a few a second
        self.connection_log = ConnectionLog(logging.getLogger("gpufleet.controller.stream"))
        # Every accepted Hello and stored frame, to the operator RPC Record's streams and, with
        # `record: FILE` (--record), to that file (controller/recording.py).
        self.recording = RecordHub()
        self.record_sink: FileSink | None = None
        if config.record:
            self.record_sink = FileSink(
                config.record,
                converter=Converter(config.record_workers),
                space=SpaceGuard(config.record, config.record_min_free_bytes),
            )
            self.record_sink.start()
            self.recording.add(self.record_sink)
        self.ingest = Ingest(
            self.fleet,
            self.store,
            clock,
            max_nodes=config.limits.max_nodes,
            max_clock_skew_seconds=config.limits.max_clock_skew_seconds,
            hub=self.recording,
            state_every_seconds=config.db_state_seconds,
        )
        self.connections: dict[str, int] = {}
        # replica_ingest (controller/replicas.py): this replica owns the nodes streaming to it, and
        # as the leader it takes in what the other replicas store.
        self.replicas: ReplicaFeed | None = None
        self.warm: WarmStandby | None = None  # a standby's fleet held while it waits (start())
        self.takeover = Takeover()
        if config.replica_ingest:
            self.store.owner, self.store.owner_clock = self.holder, clock
            self.replicas = ReplicaFeed(
                self.store,
                fleet=lambda: self.fleet,
                connections=self.connections,
                mirror=lambda: self.ingest.mirror,
                clock=clock,
                sync_seconds=config.replica_sync_seconds,
            )
        self.active: dict[FindingKey, StoredFinding] = {}
        self.finding_tracker = FindingTracker.for_config(config.detect)  # hysteresis: pending findings
        self.identity = NodeIdentities()  # streams' certificates: refusals, each node's transport
        self.detectors = config.detect.enabled(sorted(discover()))
        # The detectors in a process of their own (start_detection_process), or on the event loop.
        self.detection: DetectionPool | None = None
        self.fronts: IngestFronts | None = None  # relaying the agents' streams (server.py sets it)
        self.last_pass: PassReport | None = None
        self.last_pass_time: float | None = None  # the clock time the last successful pass judged
        self.lead_time: float | None = None  # the clock time this controller won the lead of its store
        self.pass_duration = SecondsHistogram(PASS_BUCKETS)  # wall seconds of successful passes
        self.failed_passes = 0
        self.collector = CollectorPolicy()  # serve() runs it (controller/gc_policy.py)
        self.loop_lag = LoopLag()  # serve() runs it too (controller/loop_lag.py)
        self.commands = CommandChannel(self.store, clock)
        self.probing = Probing(config, lambda: self.fleet, clock, self.commands)
        if self.replicas is not None:  # commands across replicas go through the store both ways
            self.replicas.commands = self.commands
            self.commands.elsewhere = self.replicas.streaming
            self.replicas.on_results = self.probing.commands.add_results
        # Operators' acks, silences and maintenance (controller/fleet/silencing.py; start() loads
        # them): silenced findings drive no action, nodes under maintenance are not probed.
        self.silencing = Silencing()
        self.probing.paused = lambda: self.silencing.maintenance.keys()  # noqa: PLW0108 - start() replaces it
        # Acting safely: every mutating request is audited before it acts; degrading actions
        # (retunes, drains) ask the breaker first: `await app.breaker.request(...)`.
        self.audit = Auditor(self.store, clock)
        self.breaker = Breaker(
            config.breaker,
            self.store,
            self.audit,
            fleet=lambda: self.fleet,
            clock=clock,
            stale_after_seconds=config.stale_after_seconds,
        )
        # Tuning: recommendations kept in step with the findings after each pass; applies go
        # through the breaker and the channel, and the channel's answers settle them.
        self.tuning = Tuner(
            config,
            self.store,
            fleet=lambda: self.fleet,
            active=lambda: self.silencing.unsilenced(self.active.values(), self.clock()),
            channel=self.commands,
            breaker=self.breaker,
            auditor=self.audit,
            clock=clock,
        )
        # Kubernetes (controller/kube/): cordon, drain and uncordon (audited, breaker-counted, one
        # action per node), and the fleet's health on the Node objects, on the cluster the config
        # names (none: node actions are refused, everything else works).
        self.cluster = find_cluster(config.kubernetes)
        self.kube = KubeActions(
            config.kubernetes,
            self.cluster,
            self.store,
            auditor=self.audit,
            breaker=self.breaker,
            channel=self.commands,
            clock=clock,
        )
        self.kube_health = HealthPublisher(config.kubernetes, self.cluster, clock=clock)
        self.tuning.node_guard = self.kube.tuning_blocked  # no retune under a drain or another's cordon
        # Drain recommendations' drains (kubernetes.policy: auto starts them), and the uncordon of
        # a node they drained once it is back within fleet normal after a re-probe.
        self.tuning.drains = DrainPolicy(self.kube, self.tuning, clock)
        # Recovery sees silenced findings too (a silence never makes a node look recovered, so it
        # never uncordons it) and leaves nodes under maintenance alone.
        self.recovery = Recovery(
            self.kube,
            recs=lambda: [r for r in self.tuning.recs.values() if r.node not in self.silencing.maintenance],
            fleet=lambda: self.fleet,
            active=lambda: self.active.values(),  # noqa: PLW0108 - start() replaces self.active
            clock=clock,
            reprobe=self.probing.recovery_probe,
        )

    async def _open_store(self) -> None:
        """store.open(); an error names the store (gpufleet controller prints it in one line)."""
        try:
            await self.store.open()
        except StoreUnavailable as exc:
            reason, where = str(exc).removeprefix("store unavailable: "), self.store.description
            text = reason if reason.startswith(where) else f"{where}: {reason}"
            raise StoreUnavailable(f"cannot open the store {text}") from exc

    async def start(
        self,
        on_standby: Callable[[], None] | None = None,
        standby_work: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Open the store, lead it (waiting as a standby while another leads: on_standby() then, and
        standby_work() runs until the lead is won: serving agents, with replica_ingest), load."""
        await self._open_store()
        # One controller leads a store; any other waits here, before it loads, listens or acts.
        description = self.store.description
        work: list[asyncio.Task[None]] = []

        # A standby with replica_ingest keeps the fleet while it waits (controller/warm_standby.py).
        warm = self.warm = None
        if self.replicas is not None and self.config.warm_standby:
            warm = self.warm = WarmStandby(self.store, self.clock)

        def standby() -> None:
            log.info("standby: another controller leads the store %s; waiting to take over", description)
            if on_standby is not None:
                on_standby()
            if standby_work is not None:
                work.append(asyncio.create_task(self._standby(standby_work)))
            if warm is not None:
                warm.start()

        holder = self.holder
        try:
            epoch = await self.store.lead(holder, self.clock(), standby, election=self._election(holder))
            won = self.lead_time = self.clock()
            self.takeover.won = True  # (before the standby's work ends: its port may serve on)
            log.info("leading the store %s: term %d", description, epoch)
        except BaseException:
            if warm is not None:
                await warm.stop()
            raise
        finally:
            # A standby's agents' port stops (they reconnect: to this replica again once it listens
            # as the leader) or serves on as the leader's (streams_kept: controller/server.py).
            for task in work:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._load_fleet(warm, won)
        self.store.loads_apart = self.takeover.streams_kept
        try:
            self.silencing = await self.store.load_silencing(self.clock())
            self.probing.adopt(await self.commands.load())  # sent again when their nodes connect
            await self.breaker.load()  # its window and tripped state survive a restart
            await self.tuning.load()  # applies a previous run left in flight: settled or awaited
            await self.kube.load()  # drains a previous run left running: resumed
        finally:
            self.store.loads_apart = False
        for node in self.fleet.nodes.values():  # the newest stored readings stand for the last frame
            newest = max([g.time for g in node.gpus.values()] + [node.host_time])
            if newest > 0:
                self.ingest.last_frame[node.name] = newest
        if self.replicas is not None:  # what the other replicas store from now is taken in
            if warm is not None and warm.fleet is self.fleet:  # from the warm standby's last look
                self.replicas.begin(warm.since, {n: s for n, s in warm.seen.items() if s[0] != holder})
            else:
                self.replicas.begin()
        log.info(
            "store %s: %d nodes, %d active findings",
            self.store.description,
            len(self.fleet.nodes),
            len(self.active),
        )

    async def _load_fleet(self, warm: WarmStandby | None, won: float) -> None:
        """The fleet and the active findings from the store: a warm standby's fleet (its own nodes
        caught up; the others' by ReplicaFeed.catch_up, before detection starts), or the whole store
        loaded; ingest moved to it. The nodes whose agents stream on (takeover.streams_kept) are not
        read again from the store but carried over from its ingest's fleet, which is newer
        (_carry_streams)."""
        standby_fleet, skipped = self.fleet, set(self.takeover.unflushed)

        def streams_on(name: str) -> bool:
            on = self.takeover.streams_kept and self.connections.get(name, 0) > 0
            if on:
                skipped.add(name)
            return on

        with collector_paused():  # the store's thread builds the fleet meanwhile
            await self._read_fleet(warm, streams_on)
        if self.takeover.streams_kept:
            await self._carry_streams(standby_fleet, skipped, won)
        self.ingest.fleet = self.fleet

    async def _read_fleet(self, warm: WarmStandby | None, skip: Callable[[str], bool]) -> None:
        fleet = None if warm is None else await warm.take_over(skip)
        if warm is None or fleet is None:
            self.fleet, findings = await self.store.load()
        else:
            self.fleet, findings = fleet, await self.store.active_findings(apart=True)
            log.info("warm standby: leading with the fleet held (%d looks at the store)", warm.looks)
        self.active = {f.finding.key: f for f in findings}

    def _streaming(self) -> set[str]:
        return {n for n, count in self.connections.items() if count > 0}

    async def _carry_streams(self, standby: Fleet, skipped: set[str], won: float) -> None:
        """The nodes this replica's agents stream on with through the lead, and those it heard from
        since the lead was won, did not store as a standby or skipped reading from the store: from
        its ingest's fleet (newer than the store: as a standby it writes their readings only every
        replica_sync_seconds) into the one it leads with, in the same turn of the loop as ingest
        moves to it (controller/fleet/adopt.py carry). Their stored probe history is read first
        where the fleet's may be behind (newer results here), and taken in once they are carried."""
        fleet = self.fleet
        read: set[str] = set()
        stored: dict[ProbeKey, Series] = {}
        for _ in range(CARRY_HISTORY_READS):  # agents keep connecting meanwhile
            due = self._to_carry(standby, skipped, won) - read
            if not due:
                break
            read |= due
            behind = sorted(
                {
                    r.node
                    for key, r in standby.probes.items()
                    if r.node in due and (key not in fleet.probes or fleet.probes[key].time < r.time)
                }
            )
            if behind:  # (read apart: the store's thread writes nothing of this fleet)
                stored.update(await self.store.read_history(behind, apart=True))
        carried = carry(fleet, standby, self._to_carry(standby, skipped, won))
        adopt_history(fleet, stored)  # (after carry: a node new to this fleet is held now)
        for name in carried:
            fleet.nodes[name].connected = self.connections.get(name, 0) > 0
        if carried:
            log.info("%d agents stream on through the lead: their nodes carried from memory", len(carried))

    def _to_carry(self, standby: Fleet, skipped: set[str], won: float) -> set[str]:
        heard = {n for n, node in standby.nodes.items() if node.last_heard >= won}
        return self._streaming() | skipped | heard

    async def _standby(self, work: Callable[[], Awaitable[None]]) -> None:
        """A standby's ingest: its nodes' readings stored every replica_sync_seconds at least, for the
        leader to take in (controller/replicas.py); what memory holds unsaved is stored when it ends."""
        self.ingest.state_every_seconds = min(self.config.db_state_seconds, self.config.replica_sync_seconds)
        try:
            await work()
        finally:
            self.ingest.state_every_seconds = self.config.db_state_seconds
            # Not those whose agents stream on (streams_kept): their nodes are carried from memory.
            unflushed = self.takeover.unflushed = self._streaming() if self.takeover.streams_kept else set()
            try:
                await self.ingest.flush_state(skip=unflushed)
            except Exception:  # a store error: the readings come again with the agents' next frames
                log.exception("storing a standby's latest readings failed")

    def _election(self, holder: str) -> KubeLease | None:
        """The Kubernetes Lease that elects the leader (kubernetes.leader_lease), or None: the store's
        lease alone. ConfigError when it is set but cannot be used."""
        name = self.config.kubernetes.leader_lease
        if name is None:
            return None
        namespace = os.environ.get(POD_NAMESPACE_ENV, "").strip()
        if not namespace:
            raise ConfigError(
                f"kubernetes.leader_lease: ${POD_NAMESPACE_ENV} must name the pod's namespace (the "
                "Lease is kept there; the chart sets it from the downward API)"
            )
        if self.cluster.api is None:
            raise ConfigError(f"kubernetes.leader_lease: no Kubernetes cluster: {self.cluster.why}")
        return KubeLease(self.cluster.api, namespace, name, holder)

    def close(self) -> None:
        self.connection_log.close()
        self.kube.cancel()  # a drain's row stays running: the next start resumes it
        self.cluster.close()
        self.store.close()
        if self.record_sink is not None:  # what it holds is written, then the file closed
            self.recording.remove(self.record_sink)
            self.record_sink.close()

    # Connections

    def connected(self, node: str) -> None:
        self.connections[node] = self.connections.get(node, 0) + 1
        self.fleet.nodes[node].connected = True
        if self.detection is not None:
            self.detection.connected(node, True)

    @property
    def connected_agents(self) -> int:
        """Nodes with at least one open telemetry stream."""
        return sum(1 for n in self.connections.values() if n > 0)

    def disconnected(self, node: str) -> None:
        left = self.connections.get(node, 1) - 1
        self.connections[node] = left
        if node in self.fleet.nodes:
            self.fleet.nodes[node].connected = left > 0
            if self.detection is not None:
                self.detection.connected(node, left > 0)

    async def probe_on_connect(self, hello: pb.Hello) -> pb.Command | None:
        """Ask a newly booted agent for a probe run, once per boot, when it can run probes; the
        command is queued on the node's stream (opened with commands.open_stream) and returned."""
        command = await self.probing.on_connect(hello)
        return None if command is None else pb.Command(id=command.id, run_probes=command.run)

    # Detection

    async def detection_pass(self) -> PassReport:
        started = time.perf_counter()
        now = self.clock()
        if self.detection is None:
            report = await run_detectors_yielding(
                DetectContext(self.fleet, self.config.detect, now), self.detectors
            )
        else:
            if not self.detection.running:  # none yet, or it died: a new one from the fleet as it is
                await self.detection.start(self.fleet)
            report = await self.detection.run_pass(now)
        upserts, resolved = self.finding_tracker.reconcile(self.active, report.findings, now)
        await self.store.save_findings(upserts, resolved)
        for stored in upserts:
            if stored.finding.key not in self.active:
                f = stored.finding
                log.info("finding: %s gpu %s %s (%s): %s", f.node, f.gpu, f.cause, f.severity, f.summary)
            self.active[stored.finding.key] = stored
        for stored in resolved:
            log.info("resolved: %s gpu %s %s", stored.finding.node, stored.finding.gpu, stored.finding.cause)
            del self.active[stored.finding.key]
        self.last_pass = report
        self.last_pass_time = now
        self.pass_duration.observe(time.perf_counter() - started)
        try:
            await self.tuning.after_pass()
        except Exception:  # tuning's trouble (a store error) is logged; detection goes on
            log.exception("tuning after the detection pass failed")
        try:
            await self.recovery.after_pass()
        except Exception:  # the uncordon of recovered nodes is tried again next pass
            log.exception("uncordoning recovered nodes after the detection pass failed")
        self.kube_health.after_pass(self.fleet, list(self.active.values()), self.config.stale_after_seconds)
        return report

    async def forget_gone(self) -> list[str]:
        """Forget the nodes gone longer than limits.forget_after_seconds (0: never): their state in
        memory, then their rows in the store (the audit log stays); each logged once. A node that
        comes back later is a new node (subject to limits.max_nodes)."""
        now = self.clock()
        after = self.config.limits.forget_after_seconds
        names = [n for n in gone_nodes(self.fleet, now, after) if self.connections.get(n, 0) == 0]
        if not names:
            return []
        for name in names:
            log.info(
                "forgetting node %r: not heard from for %.0f s (limits.forget_after_seconds %.0f)",
                name,
                silent_for(self.fleet.nodes[name], now),
                after,
            )
            self.connections.pop(name, None)
            self.ingest.forget(name)
            if self.replicas is not None:
                self.replicas.elsewhere.pop(name, None)
        forget(self.fleet, names)
        if self.detection is not None:
            self.detection.forget(names)
        gone = set(names)
        for key in [k for k in self.active if k[0] in gone]:
            del self.active[key]
        # Queued at once, before any Hello that could bring one back: its row is written after.
        await self.store.forget_nodes(names)
        return names

    async def start_detection_process(self) -> None:
        """Run the detectors in a process of their own from now on (`gpufleet controller` does,
        unless detect.process is false), fed every change this controller applies to its fleet."""
        self.detection = DetectionPool(self.config.detect, self.detectors, self.config.detect.processes)
        self.ingest.mirror = self.detection
        began = time.perf_counter()
        # Agents first: its slices wait while Hellos are taken in (a fleet moving here at a lead).
        await self.detection.start(self.fleet, busy=lambda: self.ingest.hellos_under_way > 0)
        log.info(
            "the detection process has the fleet: %d nodes, copied in %.1f s",
            len(self.fleet.nodes),
            time.perf_counter() - began,
        )

    async def detect_forever(self, stop: asyncio.Event, copying: asyncio.Task[None] | None = None) -> None:
        """A detection pass every detect.interval_seconds until stop; the first once `copying` (the
        detection process's copy of the fleet, controller/server.py _before_judging) is done. A copy
        that failed is stopped: the first pass starts the process again, with a new copy."""
        if copying is not None and not await self._copied(copying, stop):
            return
        last_prune = 0.0
        pruning: asyncio.Task[None] | None = None
        try:
            while not stop.is_set():
                try:
                    await self.detection_pass()
                    await self.forget_gone()
                except (DetectionUnavailable, StoreUnavailable) as exc:  # retried next interval; one line
                    self.failed_passes += 1  # (a detection process that died is started again then)
                    log.error("detection pass failed: %s", exc)
                except Exception:  # not foreseen: its traceback
                    self.failed_passes += 1
                    log.exception("detection pass failed")
                # Hourly, beside the passes: an old store's prune is many jobs (logged_history.py).
                if self.clock() - last_prune > 3600 and (pruning is None or pruning.done()):
                    last_prune = self.clock()
                    pruning = asyncio.create_task(self._prune(last_prune - PROBE_HISTORY_DAYS * 86400))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.config.detect.interval_seconds)
        finally:
            if pruning is not None:
                pruning.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pruning

    async def _copied(self, copying: asyncio.Task[None], stop: asyncio.Event) -> bool:
        """Wait for the copy; False when stop came first."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({copying, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not copying.done():
            return False
        failed = None if copying.cancelled() else copying.exception()
        if failed is not None and self.detection is not None:
            log.error("the detection process's copy of the fleet failed (a new one comes): %s", failed)
            await self.detection.stop()
        return True

    async def _prune(self, before: float) -> None:
        try:
            await self.store.prune_history(before)
            self.tuning.forget_finished(before)  # the rows the store just dropped, in memory too
        except StoreUnavailable as exc:
            log.warning("pruning the store's old rows failed (again in an hour): %s", exc)
        except Exception:  # (a task's error is not seen otherwise)
            log.exception("pruning the store's old rows failed (again in an hour)")
