"""What a fleet of N nodes costs a controller's event loop beside ingest, on an idle machine: the
operators' views, a /metrics scrape (over HTTP from the controller's MetricsServer), a full
ListNodes (every page, over gRPC from its server) and a GetNode, and a probe scheduling pass. All run on the
event loop, so each is also how long its acks wait meanwhile. The fleet is built in-process from
the scale bench's frames (built_fleet.py), with active findings on --finding-share of its nodes,
every node connected and offering probes; the memory the fleet holds per node is the process's RSS
before and after building it, the objects the garbage collector tracks of it per node and a full
collection's time (the hourly-to-daily stop of controller/gc_policy.py). Prints a table; asserts nothing
(tests/bench/test_controller_views.py runs a small step of it).

    .venv/bin/python bench/controller_views.py [--nodes 12500] [--repeat 5] [--finding-share 0.02]

"page s" is the page as the controller writes it (controller/metrics_text.py); "generate_latest s"
is prometheus_client's exposition of the same registry, for comparison (how the controller wrote
its page before; the two are checked to be the same bytes). controller_scale.py times the same
views under a streaming load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import time
import urllib.request
from typing import Any

import grpc
import psutil
from controller_scale_load.built_fleet import build
from prometheus_client.exposition import generate_latest

from controller.app import ControllerApp
from controller.config import ControllerConfig
from controller.fleet.finding import Evidence, Finding
from controller.fleet.findings import StoredFinding, finding_id
from controller.fleet.model import FrameWrite, ProbeRecord
from controller.fleet.probe_schedule import CAPABILITY, plan_probes
from controller.fleet.state import apply_frame
from controller.metrics import controller_registry
from controller.metrics_http import MetricsServer
from controller.metrics_text import page
from controller.server import build_server
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb

CAUSES = ("power_cap", "thermal_throttle", "nvlink_down", "ecc_row_remap_pending")
PROBES = ("gemm", "membw", "pcie", "nccl")


def add_findings(app: ControllerApp, share: float, now: float) -> int:
    """Active findings on every 1/share-th node (one per GPU 0 and one node-level), as a pass leaves
    them in memory; how many."""
    names = sorted(app.fleet.nodes)
    step = max(1, round(1 / share)) if share > 0 else 0
    chosen = names[::step] if step else []
    evidence = Evidence("enforced_power_limit_watts", 400.0, 700.0, -0.43, "W", ("sw_power_cap",), 7, "bench")
    for i, name in enumerate(chosen):
        for gpu, severity in ((0, "warning"), (None, "critical")):
            cause = CAUSES[i % len(CAUSES)]
            finding = Finding(
                name, gpu, cause, severity, f"{cause} on {name}", evidence, detectors=["throttle"]
            )
            first = now - 600
            app.active[finding.key] = StoredFinding(finding_id(finding.key, first), finding, first, now, True)
    return len(app.active)


def probe_ready(app: ControllerApp) -> None:
    """Every node connected and offering probes, as real agents do (the scale bench's Hellos offer
    none, so its scheduler has nothing to plan)."""
    for node in app.fleet.nodes.values():
        node.connected = True
        node.hello.capabilities.append(CAPABILITY)
        node.hello.probes.extend(PROBES)


def probe_pass(app: ControllerApp, now: float, tick: int) -> float:
    """Seconds of one scheduling pass's planning (Probing.schedule_pass, on the loop every
    probes.check_every_seconds) after one node's probe result came in, as one does every few
    seconds in a fleet probed every half hour."""
    fleet, node = app.fleet, sorted(app.fleet.nodes)[tick % len(app.fleet.nodes)]
    write = FrameWrite(node, "boot", 1_000_000 + tick, now)
    result = pb.ProbeResult(probe="gemm", variant="bf16", gpu=0, value=700.0, unit="TFLOP/s")
    write.probes = [ProbeRecord(node, 0, "gemm", "bf16", 700.0, "TFLOP/s", now, result.SerializeToString())]
    apply_frame(fleet, write)
    commands = app.probing.commands
    began = time.perf_counter()
    plan_probes(
        fleet,
        in_flight=commands.in_flight.keys(),
        attempts=commands.attempts,
        now=now,
        config=app.config.probes,
        max_reading_age=app.config.stale_after_seconds,
    )
    return time.perf_counter() - began


def _full_collection() -> float:
    """Seconds of a full collection of everything the process holds (the fleet most of it): the
    event loop's stop when the controller's collector policy runs one (controller/gc_policy.py)."""
    start = time.perf_counter()
    gc.collect()
    return time.perf_counter() - start


def _scrape(url: str) -> tuple[float, bytes]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return time.perf_counter() - began, body


def _list_nodes(address: str) -> tuple[float, float, int, int]:
    """Seconds for every page, the longest page, pages and nodes."""
    with grpc.insecure_channel(address) as channel:
        stub = operator_pb2_grpc.OperatorStub(channel)
        began, longest, pages, nodes, token = time.perf_counter(), 0.0, 0, 0, ""
        while True:
            start = time.perf_counter()
            reply = stub.ListNodes(operator_pb2.ListNodesRequest(page_token=token), timeout=60)
            longest = max(longest, time.perf_counter() - start)
            pages, nodes, token = pages + 1, nodes + len(reply.nodes), reply.next_page_token
            if not token:
                return time.perf_counter() - began, longest, pages, nodes


def _get_node(address: str, name: str) -> tuple[float, int]:
    """Seconds for `gpufleet node NAME`'s call on a connected channel, and the probe results it
    returned."""
    with grpc.insecure_channel(address) as channel:
        stub = operator_pb2_grpc.OperatorStub(channel)
        grpc.channel_ready_future(channel).result(timeout=60)
        began = time.perf_counter()
        reply = stub.GetNode(operator_pb2.GetNodeRequest(name=name), timeout=60)
        return time.perf_counter() - began, len(reply.probes)


async def timed(nodes: int, repeat: int, share: float) -> dict[str, Any]:
    gc.collect()
    tracked = len(gc.get_objects())
    rss, began = psutil.Process().memory_info().rss, time.perf_counter()
    fleet, now = build(nodes)
    built = time.perf_counter() - began
    gc.collect()
    held = psutil.Process().memory_info().rss - rss  # what the fleet itself holds (upb's arenas too)
    tracked = len(gc.get_objects()) - tracked  # what a full collection walks of it
    full = min(_full_collection() for _ in range(3))
    gc.freeze()  # out of the automatic collections, as a running controller's fleet is (gc_policy.py)
    app = ControllerApp(ControllerConfig(listen="127.0.0.1:0", db=":memory:"), clock=lambda: now)
    await app.start()
    metrics = MetricsServer(controller_registry(app))
    server = None
    try:
        app.fleet = app.ingest.fleet = fleet
        app.ingest.last_frame = {name: now - 1 for name in fleet.nodes}
        findings = add_findings(app, share, now)
        probe_ready(app)
        passes = [probe_pass(app, now, tick) for tick in range(repeat + 1)][1:]  # the first: cold
        registry = controller_registry(app)
        url = f"http://{await metrics.start('127.0.0.1:0')}/metrics"
        server, address = await build_server(app)
        scrapes, pages, prometheus, listings, details = [], [], [], [], []
        body = b""
        for _ in range(repeat):
            seconds, body = await asyncio.to_thread(_scrape, url)
            scrapes.append(seconds)
            start = time.perf_counter()
            mine = page(registry)
            pages.append(time.perf_counter() - start)
            start = time.perf_counter()
            theirs = generate_latest(registry)
            prometheus.append(time.perf_counter() - start)
            if mine != theirs:
                raise SystemExit("controller_views: the page differs from generate_latest's")
            listings.append(await asyncio.to_thread(_list_nodes, address))
        names = sorted(fleet.nodes)
        for tick in range(repeat):  # each after a probe result came in somewhere, as in a live fleet
            probe_pass(app, now, repeat + 1 + tick)
            name = names[(tick * 7919) % len(names)]
            details.append(await asyncio.to_thread(_get_node, address, name))
        series = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
        return {
            "nodes": nodes,
            "cores": os.cpu_count(),
            "built_s": built,
            "fleet_kb_per_node": held / 1024 / nodes,
            "tracked_objects_per_node": tracked / nodes,
            "full_collection_s": full,
            "findings": findings,
            "scrape_s": statistics.median(scrapes),
            "scrape_max_s": max(scrapes),
            "page_s": statistics.median(pages),
            "generate_latest_s": statistics.median(prometheus),
            "page_bytes": len(body),
            "series": series,
            "list_nodes_s": statistics.median(x[0] for x in listings),
            "list_nodes_longest_page_s": max(x[1] for x in listings),
            "list_nodes_pages": listings[-1][2],
            "list_nodes_nodes": listings[-1][3],
            "probe_pass_s": statistics.median(passes),
            "get_node_s": statistics.median(x[0] for x in details),
            "get_node_probes": details[-1][1],
        }
    finally:
        if server is not None:
            await server.stop(None)
        await metrics.stop()
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12500)
    parser.add_argument(
        "--repeat", type=int, default=5, help="scrapes and listings timed (the median is shown)"
    )
    parser.add_argument(
        "--finding-share", type=float, default=0.02, help="share of nodes with active findings"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.nodes < 1 or args.repeat < 1 or not 0 <= args.finding_share <= 1:
        parser.error("--nodes and --repeat must be >= 1, --finding-share within 0..1")
    row = asyncio.run(timed(args.nodes, args.repeat, args.finding_share))
    if args.json:
        print(json.dumps(row))
        return
    print(
        f"controller_views: {row['nodes']} nodes (built in {row['built_s']:.0f} s, holding "
        f"{row['fleet_kb_per_node']:.0f} KB of memory each), {row['findings']} active findings, "
        f"{row['cores']} cores, median of {args.repeat}"
    )
    print(
        f"garbage collector: {row['tracked_objects_per_node']:.0f} objects tracked a node; a full "
        f"collection {row['full_collection_s']:.3f} s (the fastest of 3)"
    )
    print(
        f"/metrics scrape: {row['scrape_s']:.3f} s (max {row['scrape_max_s']:.3f}), "
        f"{row['page_bytes'] / 1e6:.1f} MB, "
        f"{row['series']} series; the page written {row['page_s']:.3f} s, by generate_latest "
        f"{row['generate_latest_s']:.3f} s"
    )
    print(
        f"ListNodes: {row['list_nodes_s']:.3f} s for {row['list_nodes_nodes']} nodes in "
        f"{row['list_nodes_pages']} pages (longest page {row['list_nodes_longest_page_s']:.3f} s)"
    )
    print(f"probe scheduling pass: {row['probe_pass_s']:.3f} s, a result having come in since the last")
    print(
        f"GetNode: {row['get_node_s']:.4f} s ({row['get_node_probes']} probe results), a result having "
        "come in since the last"
    )


if __name__ == "__main__":
    main()
