"""The agent's Prometheus exporter: a custom collector over the latest Snapshot.

The sampler hands each Snapshot to `observe`; a scrape renders what was observed last and never
touches hardware. Some of what the page shows outlives one snapshot, so the exporter keeps it:
the latest probe result per (probe, variant, gpu) (a snapshot carries only new results) and the
latest XID code per GPU (a reading carries only the XIDs since the previous one).

The page changes only when a snapshot is observed, so it is rendered once per snapshot and kept:
a second scraper (an HA pair of Prometheus servers, a curl) costs nothing. It is written by
agent.exporter.text, byte for byte what prometheus_client's generate_latest makes of `collect()`
(with dcgm-exporter's counters named as dcgm-exporter names them), several times faster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from agent.exporter import families
from agent.exporter.catalogue import Catalogue, load
from agent.exporter.stream_families import stream_families
from agent.exporter.text import log_lines_suppressed_text, render_page
from agent.exporter.view import ExportView, ProbeKey
from agent.probes.base import ProbeOutcome
from agent.snapshot import Snapshot
from agent.sources.gpu import Inventory
from agent.sources.host import HostFacts
from agent.stream.status import StreamStatus
from protos.logsafe import SUPPRESSED


class Exporter:
    """The /metrics page of one agent: native gpufleet_* families, and dcgm-exporter's with `dcgm_compat`.

    `observe` and `render` may run in different threads. Each exporter has its own registry (never
    prometheus_client's global one), so several can live in one process.
    """

    def __init__(
        self,
        node: str,
        inventory: Inventory,
        host_facts: HostFacts | None = None,
        *,
        dcgm_compat: bool = False,
        catalogue: Catalogue | None = None,
    ) -> None:
        self.node = node
        self.inventory = inventory
        self.host_facts = host_facts
        self.dcgm_compat = dcgm_compat
        self.catalogue = catalogue or load()
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._probes: dict[ProbeKey, ProbeOutcome] = {}
        self._xid_last: dict[str, int] = {}
        self._generation = 0  # observations so far: the kept page is for one of them
        self._page: tuple[int, bytes] | None = None
        # Where the stream to the controller stands, read at each scrape (set by the agent that
        # streams: agent/compose/metrics.py); None, or a None answer: no stream families.
        self.stream_status: Callable[[], StreamStatus | None] | None = None
        # The Collector contract, for anything that reads a registry (prometheus_client's own
        # exposition, a push gateway); the page itself is written by agent.exporter.text.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe(self, snapshot: Snapshot) -> None:
        """Take the sampler's latest snapshot; keep its probe results and XIDs beyond it."""
        with self._lock:
            self._generation += 1
            self._snapshot = snapshot
            for outcome in snapshot.probes:
                self._probes[(outcome.probe, outcome.variant, outcome.gpu)] = outcome
            for reading in snapshot.gpus:
                if reading.xid_events:  # in the order they happened
                    self._xid_last[reading.uuid] = reading.xid_events[-1].code

    def view(self) -> ExportView:
        with self._lock:
            return ExportView(
                node=self.node,
                inventory=self.inventory,
                host_facts=self.host_facts,
                snapshot=self._snapshot,
                probes=dict(self._probes),
                xid_last=dict(self._xid_last),
            )

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's Collector contract: the families of one consistent view."""
        view = self.view()
        yield from families.native(self.catalogue.metrics, view)
        if self.dcgm_compat:
            yield from families.dcgm(self.catalogue.dcgm, view)
        yield from self._stream()
        logs = families.log_lines_suppressed(SUPPRESSED.snapshot())
        if logs is not None:
            yield logs

    def render(self) -> bytes:
        """The page in the Prometheus text format 0.0.4 (kept until the next snapshot is observed),
        then the stream's families and the process's suppressed log lines (read as they are now, so
        never kept)."""
        return self._snapshot_page() + self._stream_text() + log_lines_suppressed_text(SUPPRESSED.snapshot())

    def _stream(self) -> Iterator[Metric]:
        status = self.stream_status() if self.stream_status is not None else None
        if status is not None:
            yield from stream_families(self.node, status)

    def _stream_text(self) -> bytes:
        """The stream's few families as prometheus_client writes them (a dozen lines: its own writer
        costs nothing here)."""
        if self.stream_status is None:
            return b""
        return generate_latest(_Families(list(self._stream())))

    def _snapshot_page(self) -> bytes:
        with self._lock:
            generation, kept = self._generation, self._page
        if kept is not None and kept[0] == generation:
            return kept[1]
        # The view may be of a newer snapshot than `generation`: then the page is kept for that one.
        page = render_page(
            self.catalogue.metrics, self.catalogue.dcgm if self.dcgm_compat else None, self.view()
        )
        with self._lock:
            if self._generation == generation:
                self._page = (generation, page)
        return page


class _Families:
    """Families already made, as a registry generate_latest can write."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)
