"""The controller's Prometheus metrics: a custom Collector that reads ControllerApp state at scrape time.

Each app gets its own CollectorRegistry (`controller_registry`), never the process-wide one, so
several controllers can live in one process (tests do). Names are fixed by the dashboards and
alert rules (dashboards/): add new ones freely, never rename these.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from controller.app import ControllerApp
from controller.detection.process import MAX_BUFFERED_BYTES
from controller.fleet.finding import SEVERITIES
from controller.fleet.findings import by_node
from controller.fleet.health import node_health
from controller.fleet.node_order import node_names
from controller.metrics_actions import breaker_families
from controller.metrics_record import SecondsHistogram
from controller.metrics_text import OneHotGauge, TextGauge
from controller.open_files import open_files, soft_limit
from controller.store.checkpoint import INTERVAL_SECONDS, RESTART_WAIT_MS
from controller.store.sqlite import BUSY_TIMEOUT_MS
from controller.store.writer import LOCK_WAIT_SECONDS
from protos.gpufleet.v1 import operator_pb2
from protos.logsafe import SUPPRESSED
from protos.names import CAUSES, enum_names, health_name

PREFIX = "gpufleet_controller_"
HEALTH_STATES: tuple[str, ...] = tuple(enum_names(operator_pb2.NodeHealth))  # healthy, degraded, ...
SLOW_DETECTOR = "probe_outlier"  # a finding it raised says the GPU measured slow, not only misconfigured


def controller_registry(app: ControllerApp, *, standby: bool = False) -> CollectorRegistry:
    """A fresh registry holding only this app's collector (`standby`: a replica that ingests while
    another leads, replica_ingest: its own ingest, store and process families only)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(app, standby=standby))
    return registry


class ControllerCollector(Collector):
    """Reads the app as it is at scrape time; keeps nothing between scrapes but text already written
    (node_health's lines of a node in a state)."""

    def __init__(self, app: ControllerApp, *, standby: bool = False) -> None:
        self.app = app
        self.standby = standby
        # node_health's lines of each node in each state, from scrape to scrape (OneHotGauge)
        self._health_lines: dict[tuple[str, str], str] = {}
        # `gpufleet nodes` decides a node's health here; the metric must never disagree with it.

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            PREFIX + "leading",
            "1 on the leader (detection, actions, operators); 0 on a standby replica that ingests "
            "its agents' frames (replica_ingest), whose nodes the leader's families include.",
            value=0 if self.standby else 1,
        )
        if self.standby:  # no findings, detection, probes or node health here: the leader's
            yield from self._standby()
            return
        yield from self._fleet()
        yield from self._ingest()
        yield from self._store()
        yield from self._findings()
        yield from self._nodes()
        yield from self._detection()
        yield from self._probes()
        yield from self._collector()
        yield _log_lines_suppressed()
        yield from self._identity()
        yield from breaker_families(self.app.breaker, self.app.breaker.clock())
        yield from self._fronts()
        yield from self._open_files()
        yield from self._replicas()
        yield from self._warm_standby()

    def _standby(self) -> Iterator[Metric]:
        yield from self._fleet()
        yield from self._ingest()
        yield from self._store()
        yield from self._collector()
        yield _log_lines_suppressed()
        yield from self._identity()
        yield from self._ownership()
        yield from self._fronts()
        yield from self._open_files()
        yield from self._warm_standby()

    def _warm_standby(self) -> Iterator[Metric]:
        warm = self.app.warm
        fleet = None if warm is None else warm.fleet
        held = 0 if fleet is None or fleet is self.app.fleet else len(fleet.nodes)  # (leading with it)
        yield GaugeMetricFamily(
            PREFIX + "standby_fleet_nodes",
            "Nodes a warm standby holds while it waits for the lead (controller/warm_standby.py); 0 on "
            "the leader, and before the standby's load.",
            value=held,
        )
        yield CounterMetricFamily(
            PREFIX + "standby_fleet_looks",
            "Looks a warm standby took at what the replicas stored since its load (every 60 s).",
            value=0 if warm is None else warm.looks,
        )
        yield CounterMetricFamily(
            PREFIX + "standby_fleet_failures",
            "A warm standby's loads and looks that failed (the store unavailable): tried again.",
            value=0 if warm is None else warm.failures,
        )

    def _store(self) -> Iterator[Metric]:
        yield _histogram(
            "store_latency_seconds",
            "Seconds from a store call to its commit, queueing and group commit included.",
            {op: h for op, h in sorted(self.app.store.latency.by_label.items())},
            label="operation",
        )
        yield CounterMetricFamily(
            PREFIX + "store_batches_run_again",
            "Batches of writes committed together without a savepoint each (frames, latest readings) "
            "in which one write failed (a node another replica took): rolled back and run again, "
            "each write in its savepoint.",
            value=self.app.store.batches_run_again,
        )
        yield CounterMetricFamily(
            PREFIX + "store_lock_waits",
            f"Write transactions that found the store's file held past the busy timeout "
            f"({BUSY_TIMEOUT_MS / 1000:g} s) by another writer (a replica beside this one on the SQLite "
            f"file) and waited again for it ({LOCK_WAIT_SECONDS:g} s at most a batch, then it fails).",
            value=self.app.store.lock_waits,
        )
        checkpointer = self.app.store.checkpointer
        yield CounterMetricFamily(
            PREFIX + "store_wal_restarts_held_off",
            f"SQLite WAL restarts given up after {RESTART_WAIT_MS} ms because a read of an older "
            f"snapshot was still open (tried again in {INTERVAL_SECONDS:g} s; the WAL grows meanwhile). "
            "0 on PostgreSQL.",
            value=0 if checkpointer is None else checkpointer.restarts_held_off,
        )

    def _ownership(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            PREFIX + "replica_takeovers",
            "Nodes this replica took over from another when their agents connected here.",
            value=self.app.ingest.counters.taken_over,
        )
        yield CounterMetricFamily(
            PREFIX + "replica_claim_retries",
            "Claims of a node whose row another replica's open transaction held (agents crossing "
            "between replicas): each let its own batch commit without it and came again.",
            value=self.app.store.claim_retries,
        )
        yield CounterMetricFamily(
            PREFIX + "replica_busy_writes",
            "Writes of a node whose owner row another replica's open transaction held (that replica "
            "taking the node): each failed at once (a frame: not acked) rather than wait for it.",
            value=self.app.store.busy_writes,
        )

    def _replicas(self) -> Iterator[Metric]:
        feed = self.app.replicas
        yield GaugeMetricFamily(
            PREFIX + "replica_nodes_elsewhere",
            "Nodes whose agents stream to another replica (replica_ingest: it wrote them lately).",
            value=0 if feed is None else feed.elsewhere_streaming(),
        )
        yield CounterMetricFamily(
            PREFIX + "replica_nodes_taken_in",
            "Nodes taken in as other replicas stored them (replica_ingest, every replica_sync_seconds).",
            value=0 if feed is None else feed.taken,
        )
        yield CounterMetricFamily(
            PREFIX + "replica_take_in_failures",
            "Looks at what other replicas stored that failed (the store unavailable): taken again next time.",
            value=0 if feed is None else feed.failures,
        )
        yield from self._ownership()

    def _open_files(self) -> Iterator[Metric]:
        counts = GaugeMetricFamily(
            PREFIX + "open_files",
            "Files open in the controller's process and in each ingest front's: its agents' "
            "connections among them, one a node and two while a node reconnects (controller/open_files.py).",
            labels=["process"],
        )
        own = open_files()
        if own is not None:  # not where /proc cannot be read
            counts.add_metric(["controller"], own)
        for front in [] if self.app.fronts is None else self.app.fronts.running:
            pid = front.pid if front.alive else None
            held = None if pid is None else open_files(pid)
            if held is not None:
                counts.add_metric([f"front-{front.index}"], held)
        yield counts
        yield GaugeMetricFamily(
            PREFIX + "open_files_limit",
            "The controller's soft open-file limit, raised to the hard one at start; its ingest fronts "
            "inherit it. Past it no agent's connection is accepted until another closes.",
            value=soft_limit(),
        )

    def _fronts(self) -> Iterator[Metric]:
        fronts = self.app.fronts
        running = [] if fronts is None else fronts.running
        yield GaugeMetricFamily(
            PREFIX + "ingest_fronts",
            "Ingest front processes serving the agents' port (ingest_fronts; 0: the controller serves it).",
            value=sum(1 for front in running if front.alive),
        )
        yield CounterMetricFamily(
            PREFIX + "ingest_front_restarts",
            "Ingest fronts started again after one ended (their agents reconnected).",
            value=0 if fronts is None else fronts.restarts,
        )
        yield CounterMetricFamily(
            PREFIX + "ingest_front_planned_frames",
            "Frames an ingest front checked and planned (the controller planned the others itself).",
            value=0 if fronts is None else fronts.planned,
        )
        streams = GaugeMetricFamily(
            PREFIX + "ingest_front_streams", "Agent streams each ingest front relays.", labels=["front"]
        )
        for front in running:
            streams.add_metric([str(front.index)], len(front.streams))
        yield streams

    def _identity(self) -> Iterator[Metric]:
        refusals = CounterMetricFamily(
            PREFIX + "identity_refusals",
            "Telemetry streams refused because the client certificate does not prove the Hello's node "
            "(other_node: another node's certificate; no_certificate; no_node_name: no DNS SAN).",
            labels=["reason"],
        )
        for reason, count in sorted(self.app.identity.refusals.items()):
            refusals.add_metric([reason], count)
        yield refusals

    def _fleet(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            PREFIX + "connected_agents",
            "Nodes with an open telemetry stream.",
            value=self.app.connected_agents,
        )
        yield GaugeMetricFamily(
            PREFIX + "nodes", "Nodes known to the controller.", value=len(self.app.fleet.nodes)
        )

    def _ingest(self) -> Iterator[Metric]:
        counters = self.app.ingest.counters
        yield CounterMetricFamily(
            PREFIX + "frames_ingested_total", "Telemetry frames stored and acked.", value=counters.frames
        )
        yield CounterMetricFamily(
            PREFIX + "duplicate_frames_total",
            "Frames dropped as already stored (an agent resending after a lost ack).",
            value=counters.duplicates,
        )
        yield CounterMetricFamily(
            PREFIX + "refused_frames_total",
            "Frames refused for good (another node's, a bad seq or time): the agent sets them aside.",
            value=counters.refused,
        )
        yield CounterMetricFamily(
            PREFIX + "non_finite_readings_total",
            "NaN or infinite readings received and stored as missing.",
            value=counters.non_finite,
        )
        implausible = CounterMetricFamily(
            PREFIX + "readings_implausible_total",
            "Physically impossible readings received and stored as missing (controller/fleet/plausible.py), "
            "by field; a probe result with an impossible value is dropped (field ProbeResult.value).",
            labels=["field"],
        )
        for name, count in sorted(self.app.fleet.implausible.items()):
            implausible.add_metric([name], count)
        yield implausible
        yield _histogram(
            "ingest_lag_seconds",
            "Seconds from a frame's time on the agent to its ingest here (clock skew included).",
            {"": self.app.ingest.lag},
        )
        sink = self.app.record_sink
        yield CounterMetricFamily(
            PREFIX + "record_written_total",
            "Accepted messages written to the --record file (flushed to it).",
            value=0 if sink is None else sink.written,
        )
        yield CounterMetricFamily(
            PREFIX + "record_dropped_total",
            "Accepted messages the --record file lost: its writer fell behind, or a write failed "
            "(a full disk); telemetry ingest is never held back.",
            value=0 if sink is None else sink.dropped,
        )
        yield GaugeMetricFamily(
            PREFIX + "record_paused",
            "1 while the --record file is not written for want of room: its filesystem has less than "
            "record_min_free_bytes free (the store beside it needs it).",
            value=int(sink is not None and sink.space is not None and sink.space.paused),
        )

    def _findings(self) -> Iterator[Metric]:
        active = [s.finding for s in self.app.active.values()]
        counts = {(cause, severity): 0 for cause in CAUSES for severity in SEVERITIES}
        for f in active:
            counts[(f.cause, f.severity)] = counts.get((f.cause, f.severity), 0) + 1
        by_kind = GaugeMetricFamily(
            PREFIX + "findings", "Active findings by cause and severity.", labels=["cause", "severity"]
        )
        for (cause, severity), n in sorted(counts.items()):
            by_kind.add_metric([cause, severity], n)
        yield by_kind
        each = TextGauge(
            PREFIX + "finding_active",
            "1 per active finding; gpu empty: node-level; slow true: a probe measured it slow; silenced "
            "true: a silence or maintenance covers it (gpufleet silence, gpufleet maintenance), so "
            "gpufleet's alerts leave it out.",
            labels=["node", "gpu", "cause", "severity", "slow", "silenced"],
        )
        silenced_by, now = self.app.silencing.silenced_by, self.app.clock()
        for f in sorted(active, key=lambda f: (f.node, -1 if f.gpu is None else f.gpu, f.cause)):
            gpu = "" if f.gpu is None else str(f.gpu)
            slow = "true" if SLOW_DETECTOR in f.detectors else "false"
            silenced = "true" if silenced_by(f.node, f.cause, now) else "false"
            each.add_metric([f.node, gpu, f.cause, f.severity, slow, silenced], 1)
        yield each

    def _nodes(self) -> Iterator[Metric]:
        health = OneHotGauge(
            PREFIX + "node_health",
            f"1 on the node's current state ({', '.join(HEALTH_STATES)}), as `gpufleet nodes` shows it.",
            ("node", "state"),
            HEALTH_STATES,
            self._health_lines,
        )
        last_frame = TextGauge(
            PREFIX + "node_last_frame_timestamp_seconds",
            "Unix time of the newest frame stored for the node.",
            labels=["node"],
        )
        grouped, now = by_node(self.app.active), self.app.clock()
        nodes, stale = self.app.fleet.nodes, self.app.config.stale_after_seconds
        unsilenced, heard = self.app.silencing.unsilenced, self.app.ingest.last_frame
        names = {value: health_name(value) for value in operator_pb2.NodeHealth.values()}
        stamps = last_frame.series  # as add_metric keeps them, one label value: 12,500 at 12,500 nodes
        for name in node_names(self.app.fleet):
            # As `gpufleet nodes` shows it: silenced findings (a node under maintenance) left out.
            mine = grouped.get(name)
            findings = unsilenced(mine, now) if mine else []
            health.add_current(name, names[node_health(nodes[name], findings, now, stale)])
            seen = heard.get(name)
            if seen is not None:
                stamps.append(((name,), seen))
        yield health
        yield last_frame

    def _detection(self) -> Iterator[Metric]:
        yield _histogram(
            "detector_pass_duration_seconds",
            "Wall seconds of a detection pass: every detector, then storing what changed.",
            {"": self.app.pass_duration},
        )
        stamp = GaugeMetricFamily(
            PREFIX + "detector_pass_timestamp_seconds", "Unix time of the last successful detection pass."
        )
        if self.app.last_pass_time is not None:
            stamp.add_metric([], self.app.last_pass_time)
        yield stamp
        # GpufleetDetectionStalled counts from here while no pass has finished: a leader whose passes
        # never finish (its detection process failing from the start) has no pass time to go stale.
        led = GaugeMetricFamily(
            PREFIX + "leading_since_timestamp_seconds",
            "Unix time this controller won the lead of its store (before loading the fleet).",
        )
        if self.app.lead_time is not None:
            led.add_metric([], self.app.lead_time)
        yield led
        yield CounterMetricFamily(
            PREFIX + "detector_pass_failures_total",
            "Detection passes that failed (the store unavailable, for one).",
            value=self.app.failed_passes,
        )
        took = GaugeMetricFamily(
            PREFIX + "detector_duration_seconds",
            "Seconds each detector took in the last pass.",
            labels=["detector"],
        )
        ok = GaugeMetricFamily(
            PREFIX + "detector_success",
            "1 when the detector ran without error in the last pass.",
            labels=["detector"],
        )
        report = self.app.last_pass
        if report is not None:
            for name in sorted(report.durations):
                took.add_metric([name], report.durations[name])
                ok.add_metric([name], 0 if name in report.failed else 1)
        yield took
        yield ok
        pool = self.app.detection
        if pool is not None:  # the detectors in processes of their own (detect.process)
            yield GaugeMetricFamily(
                PREFIX + "detection_waiting_bytes",
                "Bytes of fleet changes sent to the detection processes that they have not read yet "
                f"(a process that reads nothing past {MAX_BUFFERED_BYTES >> 20} MiB is stopped and started "
                "again).",
                value=pool.waiting_bytes(),
            )
            yield CounterMetricFamily(
                PREFIX + "detection_process_starts",
                "Detection processes started: beyond detect.processes, ones that died or were stopped.",
                value=pool.starts,
            )

    def _collector(self) -> Iterator[Metric]:
        policy = self.app.collector
        took = CounterMetricFamily(
            PREFIX + "gc_seconds",
            "Seconds in Python's cyclic garbage collector, by generation (2: full collections; "
            "controller/gc_policy.py freezes the fleet out of them).",
            labels=["generation"],
        )
        runs = CounterMetricFamily(
            PREFIX + "gc_collections",
            "Collections by Python's cyclic garbage collector, by generation.",
            labels=["generation"],
        )
        for generation in range(3):
            took.add_metric([str(generation)], policy.seconds[generation])
            runs.add_metric([str(generation)], policy.collections[generation])
        yield took
        yield runs
        yield GaugeMetricFamily(
            PREFIX + "gc_longest_pause_seconds",
            "The longest collection since the controller started: the event loop waits for it.",
            value=policy.longest,
        )
        yield _histogram(
            "event_loop_lag_seconds",
            "How much later than due the event loop woke a task asking to wake every 0.25 s: what "
            "acks and every other callback wait behind (a scrape, a scheduling pass, a collection).",
            {"": self.app.loop_lag.lag},
        )
        yield GaugeMetricFamily(
            PREFIX + "gc_frozen_objects",
            "Objects frozen out of the automatic collections, as counted at the first freeze and at "
            "the last full collection (hourly, up to daily while they free next to nothing): counting "
            "them more often costs a walk of them all.",
            value=policy.frozen,
        )

    def _probes(self) -> Iterator[Metric]:
        commands = self.app.probing.commands
        yield GaugeMetricFamily(
            PREFIX + "probes_in_flight",
            "Nodes with a probe command sent and not yet answered (nor timed out).",
            value=len(commands.in_flight),
        )
        yield GaugeMetricFamily(
            PREFIX + "probes_waiting",
            "Nodes whose probe on connect waits for a slot (probes.max_fleet_share of connected nodes).",
            value=len(self.app.probing.waiting),
        )
        sent = CounterMetricFamily(
            PREFIX + "probe_commands",
            "Probe commands sent to agents, by why: periodic (the scheduler), on_connect, operator, recovery "
            "(a drained node whose findings cleared).",
            labels=["reason"],
        )
        for reason, n in sorted(commands.sent.items()):
            sent.add_metric([reason], n)
        yield sent
        failed = CounterMetricFamily(
            PREFIX + "probe_command_failures",
            "Probe commands that failed: the agent answered an error, no answer in time (timeout), "
            "or the agent restarted first without command memory (restarted).",
            labels=["reason", "failure"],
        )
        for (reason, failure), n in sorted(commands.failed.items()):
            failed.add_metric([reason, failure], n)
        yield failed


def _log_lines_suppressed() -> CounterMetricFamily:
    """The process's log lines held back by the rate limit (protos/logsafe.py), per logger."""
    family = CounterMetricFamily(
        PREFIX + "log_lines_suppressed",
        "Log lines not written: more than the limit per (logger, message, first argument) a minute.",
        labels=["logger"],
    )
    for logger, n in sorted(SUPPRESSED.snapshot().items()):
        family.add_metric([logger], n)
    return family


def _histogram(
    name: str, documentation: str, histograms: dict[str, SecondsHistogram], label: str = ""
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, documentation, labels=[label] if label else None)
    for value, h in histograms.items():
        buckets = [("+Inf" if math.isinf(bound) else repr(bound), float(n)) for bound, n in h.cumulative()]
        family.add_metric([value] if label else [], buckets, h.sum)
    return family
