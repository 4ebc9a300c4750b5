"""Controller metrics read through a real /metrics server on 127.0.0.1, from an app fed over ingest."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from controller import metrics_http
from controller.app import ControllerApp
from controller.detect.base import discover
from controller.errors import RefusedFrame
from controller.fleet.finding import SEVERITIES
from controller.metrics import controller_registry
from controller.metrics_http import MetricsServer
from controller.store.store import OPERATIONS
from protos.names import CAUSES
from tests.controller.harness import (
    FINDINGS,
    NO_HYSTERESIS,
    STALE_AFTER,
    T0,
    Clock,
    add_findings,
    config,
    frame,
    hello,
    populate,
    stored_finding,
)
from tests.support import free_port

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_FIRST = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)  # what Prometheus 2.42 sends
P = "gpufleet_controller_"


@dataclass(slots=True)
class Reply:
    status: int
    content_type: str
    body: str


class Page:
    """One parsed /metrics page: value(name, **labels) -> the sample's value, None when absent."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


def fetch(url: str, method: str = "GET", accept: str = "") -> Reply:
    request = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return Reply(response.status, response.headers["Content-Type"], response.read().decode())
    except urllib.error.HTTPError as exc:
        with exc:
            return Reply(exc.code, exc.headers["Content-Type"], exc.read().decode())


@dataclass(slots=True)
class Scraper:
    base: str

    async def get(self, path: str, method: str = "GET", accept: str = "") -> Reply:
        return await asyncio.to_thread(fetch, self.base + path, method, accept)

    async def page(self) -> Page:
        reply = await self.get("/metrics")
        assert reply.status == 200 and reply.content_type == TEXT_0_0_4, reply
        return Page(reply.body)


@contextlib.asynccontextmanager
async def scraped(
    clock: Clock | None = None, **overrides: object
) -> AsyncIterator[tuple[ControllerApp, Scraper]]:
    app = ControllerApp(config(**overrides), clock=clock or Clock())
    await app.start()
    server = MetricsServer(controller_registry(app))
    try:
        address = await server.start("127.0.0.1:0")
        yield app, Scraper(f"http://{address}")
    finally:
        await server.stop()
        app.close()


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until `condition()` holds (at most `timeout` s: then the test's own asserts say why)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


def test_frames_duplicates_non_finite_lag_and_store_latency() -> None:
    async def body() -> None:
        clock = Clock()
        async with scraped(clock) as (app, scrape):
            before = await scrape.page()
            assert before.value(P + "frames_ingested_total") == 0
            assert before.value(P + "ingest_lag_seconds_count") == 0
            assert before.value(P + "store_latency_seconds_count", operation="init") == 1
            assert before.value(P + "store_latency_seconds_count", operation="load") == 1
            assert before.value(P + "store_latency_seconds_count", operation="save_frame") == 0

            await app.ingest.hello(hello())
            assert await app.ingest.frame("n1", frame(1)) == 1  # stamped T0 - 9
            assert await app.ingest.frame("n1", frame(2)) == 2  # T0 - 8
            assert await app.ingest.frame("n1", frame(1)) == 2  # a resend: dropped, acked again
            bad = frame(3)
            bad.gpus[0].power_watts = math.nan
            assert await app.ingest.frame("n1", bad) == 3  # T0 - 7, one NaN
            forged = frame(4)
            forged.seq = 2**63 - 1  # refused for good: the agent sets it aside
            with pytest.raises(RefusedFrame):
                await app.ingest.frame("n1", forged)

            page = await scrape.page()
            assert page.types[P + "frames_ingested"] == "counter"
            assert page.value(P + "frames_ingested_total") == 3
            assert page.value(P + "duplicate_frames_total") == 1
            assert page.value(P + "refused_frames_total") == 1
            assert page.value(P + "non_finite_readings_total") == 1
            assert page.types[P + "ingest_lag_seconds"] == "histogram"
            assert page.value(P + "ingest_lag_seconds_count") == 3  # the duplicate is not ingested
            assert page.value(P + "ingest_lag_seconds_sum") == pytest.approx(9 + 8 + 7)
            assert page.value(P + "ingest_lag_seconds_bucket", le="5.0") == 0
            assert page.value(P + "ingest_lag_seconds_bucket", le="10.0") == 3
            assert page.value(P + "ingest_lag_seconds_bucket", le="+Inf") == 3
            counts = {op: page.value(P + "store_latency_seconds_count", operation=op) for op in OPERATIONS}
            assert counts == {
                "init": 1,
                "load": 1,
                "save_hello": 1,
                "save_frame": 3,
                "save_latest": 1,  # the first frame's readings; the next two are not due (db_state_seconds)
                "save_findings": 0,
                "list_findings": 0,
                "prune_history": 0,
                "save_command": 0,
                "list_commands": 0,
                "load_commands": 1,
                "audit": 0,
                "list_audit": 0,
                "breaker": 1,  # the breaker's state, loaded at start
                "recommendations": 1,  # the tuning recommendations, loaded at start
                "drains": 0,  # no cluster configured: no drains to resume
                "silences": 1,  # acks, silences and maintenance, loaded at start
                "leader": 1,  # the leader's term, begun at start (controller/store/lease.py)
                "owners": 0,  # no replica_ingest: no node claimed
            }
            assert (page.value(P + "store_latency_seconds_sum", operation="save_frame") or 0) > 0
            assert page.value(P + "node_last_frame_timestamp_seconds", node="n1") == T0 - 7

            await app.store.prune_history(T0)
            await app.store.list_findings()
            page = await scrape.page()
            assert page.value(P + "store_latency_seconds_count", operation="prune_history") == 1
            assert page.value(P + "store_latency_seconds_count", operation="list_findings") == 1

    run(body)


def test_a_clock_running_ahead_counts_as_no_lag() -> None:
    async def body() -> None:
        async with scraped() as (app, scrape):
            await app.ingest.hello(hello())
            # stamped ahead (within limits.max_clock_skew_seconds: further ahead is refused)
            await app.ingest.frame("n1", frame(1, t=T0 + 200))
            page = await scrape.page()
            assert page.value(P + "ingest_lag_seconds_count") == 1
            assert page.value(P + "ingest_lag_seconds_sum") == 0
            assert page.value(P + "ingest_lag_seconds_bucket", le="0.05") == 1

    run(body)


def test_findings_node_health_and_last_frames_of_a_populated_fleet() -> None:
    async def body() -> None:
        clock = Clock()
        async with scraped(clock, stale_after_seconds=STALE_AFTER) as (app, scrape):
            await populate(app, clock)
            slow = stored_finding("a-healthy", 1, "slow_unknown", "warning")
            slow.finding.detectors = ["probe_outlier"]
            await add_findings(app, [slow])
            page = await scrape.page()

            assert page.value(P + "nodes") == 5
            assert page.value(P + "connected_agents") == 3

            findings = page.series(P + "findings")
            assert len(findings) == len(CAUSES) * len(SEVERITIES)
            expected = {("power_cap", "warning"): 1, ("thermal_throttle", "warning"): 1}
            expected |= {("nvlink_down", "critical"): 1, ("ecc_row_remap_pending", "critical"): 2}
            expected |= {("hbm_degraded", "info"): 1, ("slow_unknown", "warning"): 1}
            for cause in CAUSES:
                for severity in SEVERITIES:
                    got = page.value(P + "findings", cause=cause, severity=severity)
                    assert got == expected.get((cause, severity), 0), (cause, severity)

            active = {
                dict(labels)["node"] + "/" + dict(labels)["gpu"]: dict(labels)
                for labels in page.series(P + "finding_active")
            }
            assert set(page.series(P + "finding_active").values()) == {1}
            want = [f.finding for f in FINDINGS if f.active] + [slow.finding]
            assert sorted(active) == sorted(f"{f.node}/{'' if f.gpu is None else f.gpu}" for f in want)
            assert active["c-critical/"] == {
                "node": "c-critical",
                "gpu": "",
                "cause": "nvlink_down",
                "severity": "critical",
                "slow": "false",
                "silenced": "false",
            }
            assert active["a-healthy/1"]["slow"] == "true"
            assert active["b-degraded/1"]["cause"] == "power_cap"

            health = {
                (labels["node"], labels["state"]): v
                for labels, v in ((dict(k), v) for k, v in page.series(P + "node_health").items())
            }
            current = {"a-healthy": "degraded", "b-degraded": "degraded", "c-critical": "critical"}
            current |= {"d-stale": "stale", "e-returned": "healthy"}
            states = ("healthy", "degraded", "critical", "stale")
            assert health == {(n, s): float(s == current[n]) for n in current for s in states}

            last = {
                dict(k)["node"]: v for k, v in page.series(P + "node_last_frame_timestamp_seconds").items()
            }
            assert last == {name: T0 - 9 for name in current}  # e-returned's later hello is no frame

    run(body)


def test_node_health_agrees_with_gpufleet_nodes() -> None:
    async def body() -> None:
        from controller.operator_api import OperatorServicer
        from protos.gpufleet.v1 import operator_pb2
        from protos.names import health_name

        clock = Clock()
        async with scraped(clock, stale_after_seconds=STALE_AFTER) as (app, scrape):
            await populate(app, clock)
            page = await scrape.page()
            listed = await OperatorServicer(app).ListNodes(operator_pb2.ListNodesRequest(), None)  # type: ignore[arg-type]
            for summary in listed.nodes:
                assert (
                    page.value(P + "node_health", node=summary.name, state=health_name(summary.health)) == 1
                )

    run(body)


def test_node_health_leaves_silenced_findings_out_as_gpufleet_nodes_does() -> None:
    async def body() -> None:
        from controller.fleet.silencing import Maintenance
        from controller.operator_api import OperatorServicer
        from protos.gpufleet.v1 import operator_pb2
        from protos.names import health_name

        clock = Clock()
        async with scraped(clock, stale_after_seconds=STALE_AFTER) as (app, scrape):
            await populate(app, clock)
            servicer = OperatorServicer(app)
            before = await servicer.ListNodes(operator_pb2.ListNodesRequest(), None)  # type: ignore[arg-type]
            flagged = [n for n in before.nodes if n.active_findings and n.connected]
            assert flagged
            name = flagged[0].name
            app.silencing.maintenance[name] = Maintenance(name, "alice", "PSU swap", clock.now)
            page = await scrape.page()
            after = await servicer.ListNodes(operator_pb2.ListNodesRequest(), None)  # type: ignore[arg-type]
            summary = next(n for n in after.nodes if n.name == name)
            assert summary.health != flagged[0].health and summary.active_findings == 0
            assert page.value(P + "node_health", node=name, state=health_name(summary.health)) == 1
            # Its findings stay on the page, marked silenced, which gpufleet's alerts leave out.
            marked = {dict(k)["node"]: dict(k)["silenced"] for k in page.series(P + "finding_active")}
            assert marked[name] == "true" and set(marked.values()) == {"true", "false"}

    run(body)


def test_connected_agents_follow_streams_opening_and_closing() -> None:
    async def body() -> None:
        async with scraped() as (app, scrape):
            for name in ("n1", "n2"):
                await app.ingest.hello(hello(name))

            async def connected() -> float | None:
                return (await scrape.page()).value(P + "connected_agents")

            assert await connected() == 0
            app.connected("n1")
            app.connected("n1")  # a reconnect racing the old stream's end
            assert await connected() == 1
            app.connected("n2")
            assert await connected() == 2
            app.disconnected("n1")
            assert await connected() == 2
            app.disconnected("n1")
            assert await connected() == 1
            app.disconnected("n2")
            assert await connected() == 0

    run(body)


def test_garbage_collections_are_timed_by_generation_once_the_policy_runs() -> None:
    async def body() -> None:
        async with scraped() as (app, scrape):
            page = await scrape.page()
            assert page.value(P + "gc_collections_total", generation="2") == 0  # not watching yet
            app.collector.watch()
            gc.disable()  # only the collections below: none an allocation would start
            try:
                gc.collect()
                app.collector.freeze()
            finally:
                gc.enable()
                app.collector.unwatch()
            page = await scrape.page()
            assert page.value(P + "gc_collections_total", generation="2") == 1
            assert page.value(P + "gc_collections_total", generation="1") == 1  # the freeze's young one
            full = page.value(P + "gc_seconds_total", generation="2")
            assert full is not None and full > 0
            longest = page.value(P + "gc_longest_pause_seconds")
            assert longest is not None and longest >= full
            frozen = page.value(P + "gc_frozen_objects")
            assert frozen is not None and frozen > 1000
            gc.unfreeze()

    run(body)


def test_a_detection_pass_is_timed_and_its_finding_exported_until_resolved() -> None:
    async def body() -> None:
        clock = Clock()
        async with scraped(clock, detect=NO_HYSTERESIS) as (app, scrape):
            page = await scrape.page()
            assert page.value(P + "detector_pass_duration_seconds_count") == 0
            assert page.series(P + "detector_pass_timestamp_seconds") == {}
            # No pass yet: the stall alert counts from the lead (GpufleetDetectionStalled).
            assert page.value(P + "leading_since_timestamp_seconds") == T0

            await app.ingest.hello(hello())
            pending = frame(1)
            pending.gpus[0].row_remap_pending = True
            await app.ingest.frame("n1", pending)
            await app.detection_pass()

            page = await scrape.page()
            assert page.value(P + "detector_pass_duration_seconds_count") == 1
            assert (page.value(P + "detector_pass_duration_seconds_sum") or 0) > 0
            assert page.value(P + "detector_pass_timestamp_seconds") == T0
            assert page.value(P + "store_latency_seconds_count", operation="save_findings") == 1
            assert {dict(k)["detector"] for k in page.series(P + "detector_success")} == set(app.detectors)
            assert set(page.series(P + "detector_success").values()) == {1}
            assert set(app.detectors) <= set(discover())
            assert page.value(P + "findings", cause="ecc_row_remap_pending", severity="critical") == 1
            labels = dict(
                node="n1",
                gpu="0",
                cause="ecc_row_remap_pending",
                severity="critical",
                slow="false",
                silenced="false",
            )
            assert page.value(P + "finding_active", **labels) == 1
            assert page.value(P + "node_health", node="n1", state="critical") == 1

            clock.now += 10
            await app.ingest.frame("n1", frame(2, t=clock.now))  # the reset happened: nothing pending
            await app.detection_pass()
            page = await scrape.page()
            assert page.value(P + "detector_pass_duration_seconds_count") == 2
            assert page.value(P + "detector_pass_timestamp_seconds") == T0 + 10
            assert page.value(P + "findings", cause="ecc_row_remap_pending", severity="critical") == 0
            assert page.series(P + "finding_active") == {}
            assert page.value(P + "node_health", node="n1", state="healthy") == 1

    run(body)


def test_the_detection_processes_backlog_and_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the detectors in a process: what it has not read yet (here the changes wait for the
    pass: COALESCE_SECONDS an hour), and the processes started, a killed one started again."""
    monkeypatch.setattr("controller.detection.process.COALESCE_SECONDS", 3600.0)

    async def body() -> None:
        async with scraped(Clock()) as (app, scrape):
            page = await scrape.page()
            assert page.value(P + "detection_waiting_bytes") is None  # the detectors on the loop
            await app.start_detection_process()
            assert app.detection is not None
            try:
                await app.ingest.hello(hello())
                await app.ingest.frame("n1", frame(1))
                page = await scrape.page()
                assert (page.value(P + "detection_waiting_bytes") or 0) > 0  # the Hello and the frame
                assert page.value(P + "detection_process_starts_total") == 1
                assert page.types[P + "detection_process_starts"] == "counter"
                await app.detection_pass()
                page = await scrape.page()
                assert page.value(P + "detection_waiting_bytes") == 0

                process = app.detection.processes[0]._process
                assert process is not None
                process.kill()
                await process.wait()
                assert not app.detection.running
                await app.detection_pass()  # starts a new one from the fleet
                page = await scrape.page()
                assert page.value(P + "detection_process_starts_total") == 2
            finally:
                await app.detection.stop()

    run(body)


def test_text_format_0_0_4_even_when_openmetrics_is_asked_for() -> None:
    async def body() -> None:
        async with scraped() as (_, scrape):
            reply = await scrape.get("/metrics", accept=OPENMETRICS_FIRST)
            assert reply.status == 200
            assert reply.content_type == TEXT_0_0_4
            assert "# EOF" not in reply.body  # OpenMetrics would end with it
            assert f"# TYPE {P}frames_ingested_total counter" in reply.body
            assert f"\n{P}frames_ingested_total 0.0\n" in reply.body

    run(body)


def test_index_head_404_and_405() -> None:
    async def body() -> None:
        async with scraped() as (_, scrape):
            index = await scrape.get("/")
            assert index.status == 200 and index.content_type.startswith("text/html")
            assert 'href="/metrics"' in index.body
            head = await scrape.get("/metrics", method="HEAD")
            assert head.status == 200 and head.content_type == TEXT_0_0_4 and head.body == ""
            for path in ("/metric", "/metrics/x", "/favicon.ico"):
                assert (await scrape.get(path)).status == 404, path
            assert (await scrape.get("/metrics?x=1")).status == 200
            assert (await scrape.get("/metrics", method="POST")).status == 405

    run(body)


def test_a_malformed_request_gets_400_and_the_server_goes_on() -> None:
    async def body() -> None:
        async with scraped() as (_, scrape):
            host, port = scrape.base.removeprefix("http://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"nonsense\r\n\r\n")
            status = await reader.readline()
            writer.close()
            await writer.wait_closed()
            assert status.startswith(b"HTTP/1.1 400")
            assert (await scrape.get("/metrics")).status == 200

    run(body)


def test_a_request_target_urllib_cannot_split_gets_400() -> None:
    async def body() -> None:
        async with scraped() as (_, scrape):
            host, port = scrape.base.removeprefix("http://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET http://[::1/metrics HTTP/1.1\r\n\r\n")  # "Invalid IPv6 URL"
            status = await asyncio.wait_for(reader.readline(), timeout=5)
            writer.close()
            await writer.wait_closed()
            assert status.startswith(b"HTTP/1.1 400"), status
            assert (await scrape.get("/metrics")).status == 200

    run(body)


class _BigPage:
    """A collector whose page is far larger than a socket buffers."""

    SIZE = 32 * 1024 * 1024

    def collect(self) -> Any:
        yield GaugeMetricFamily("big", "x" * self.SIZE, value=1)


def test_a_client_that_stops_reading_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "REQUEST_TIMEOUT_SECONDS", 0.3)

    def read_all(client: socket.socket) -> int:
        got = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := client.recv(1 << 20):
                got += len(chunk)
        return got

    async def body() -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_BigPage())
        server = MetricsServer(registry)
        host, port = (await server.start("127.0.0.1:0")).rsplit(":", 1)
        client = socket.socket()
        try:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.settimeout(5)
            await asyncio.to_thread(client.connect, (host, int(port)))
            client.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            # Reading nothing until the server is done with the connection: rendering the 32 MiB page
            # alone takes ~1 s on a loaded 2-core machine, so a fixed sleep can end before the timeout.
            await _until(lambda: bool(server._handlers))  # accepted
            await _until(lambda: not server._handlers)  # and given up on (or, wrongly, sent it all)
            # The server gave up on the connection: what the client reads now ends short of the page.
            assert await asyncio.to_thread(read_all, client) < _BigPage.SIZE
        finally:
            client.close()
            await server.stop()

    run(body)


def test_port_in_use_is_a_clear_error() -> None:
    async def body() -> None:
        port = free_port()
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", port))
            holder.listen()
            server = MetricsServer(controller_registry(ControllerApp(config())))
            with pytest.raises(OSError, match=rf"cannot serve metrics on 127\.0\.0\.1:{port}: .*in use"):
                await server.start(f"127.0.0.1:{port}")
            await server.stop()

    run(body)


def test_stop_closes_idle_connections() -> None:
    async def body() -> None:
        async with scraped() as (_, scrape):
            host, port = scrape.base.removeprefix("http://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /metr")  # a request that never finishes
            await writer.drain()
        # The server stopped with the connection open; the client sees it closed.
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        writer.close()
        await writer.wait_closed()

    run(body)


def test_many_controllers_in_one_process_keep_their_own_metrics() -> None:
    async def body() -> None:
        async with scraped() as (first, scrape_first), scraped() as (second, scrape_second):
            await first.ingest.hello(hello())
            await first.ingest.frame("n1", frame(1))
            assert (await scrape_first.page()).value(P + "frames_ingested_total") == 1
            assert (await scrape_second.page()).value(P + "frames_ingested_total") == 0
            assert second.ingest.counters.frames == 0

    run(body)


def test_a_standby_exports_its_ingest_and_process_families_not_the_leaders() -> None:
    app = ControllerApp(config())
    try:
        standby = {f.name: f for f in text_string_to_metric_families(generate_latest_text(app, True))}
        leader = {f.name: f for f in text_string_to_metric_families(generate_latest_text(app, False))}
    finally:
        app.close()
    assert standby[P + "leading"].samples[0].value == 0 and leader[P + "leading"].samples[0].value == 1
    for name in (
        "frames_ingested",
        "connected_agents",
        "nodes",
        "store_latency_seconds",
        "store_batches_run_again",
        "store_lock_waits",
        "store_wal_restarts_held_off",
        "gc_seconds",
    ):
        assert P + name in standby, name
    for name in ("replica_takeovers", "replica_claim_retries"):
        assert P + name in standby and P + name in leader, name
    # What detection, actions and operators make is the leader's: on a standby it would read 0.
    for name in (
        "findings",
        "node_health",
        "detector_pass_duration_seconds",
        "probes_in_flight",
        "leading_since_timestamp_seconds",
    ):
        assert P + name in leader and P + name not in standby, name
    assert set(standby) < set(leader)


def generate_latest_text(app: ControllerApp, standby: bool) -> str:
    return generate_latest(controller_registry(app, standby=standby)).decode()
