"""What one /metrics scrape of the agent costs, beside Debian's prometheus-node-exporter on this machine.

Builds a simulated 8-GPU node's agent in this process (simulated GPUs, host and BMC, one round of
modelled probe results so the probe series exist, dcgm-exporter compatibility on), serves it on
127.0.0.1 and scrapes /metrics N times over HTTP. Then starts prometheus-node-exporter on another
loopback port, scrapes it the same way and stops it. Prints seconds per scrape (median, p95), bytes
per page, series per page, and the ratios ours / node exporter per scrape and per series. Asserts
nothing.

    .venv/bin/python bench/exporter_scrape.py [--scrapes 200] [--gpus 8]
        [--node-exporter /usr/bin/prometheus-node-exporter]

Our page changes only when the sampler observes a snapshot, and is rendered once per snapshot. As
deployed (a snapshot every 10 s, a scrape every 15 s) nearly every scrape renders, so the figure
to compare is "render": before each timed scrape the snapshot is observed again. "cached" is a
second scrape of the same snapshot (an HA pair of Prometheus servers). Each scrape is a fresh HTTP
connection without compression, as with the node exporter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from agent.config import load
from agent.daemon import Agent
from agent.exporter import Exporter, MetricsServer
from agent.sources.sim import SimNode
from agent.sources.sim.bmc import SimBmc
from agent.sources.sim.host import SimHost
from agent.sources.sim.probes import ModelledProbes
from protos.gpufleet.v1 import telemetry_pb2 as pb

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
START_SECONDS = 10.0


@dataclass
class Figures:
    seconds: list[float]
    page_bytes: int
    series: int

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def p95(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def build_node(gpus: int) -> tuple[Agent, Exporter]:
    """The agent of a simulated node with its exporter, sampled twice around one probe round."""
    config = load(None, {"node": "bench-node", "source": "sim", "sim": {"gpus": gpus}})
    sim = SimNode(config.node, gpus=gpus, seed=config.sim.seed)
    agent = Agent(config, sim, SimHost(sim), ModelledProbes(sim), bmc=SimBmc(sim))
    exporter = Exporter(config.node, agent.inventory, agent.host_facts, dcgm_compat=True)
    agent.exporter = exporter
    assert agent.bmc is not None
    agent.bmc.poll_once()
    agent.sample()
    result = asyncio.run(agent.handle_command(pb.Command(id="bench", run_probes=pb.RunProbes())))
    if not result.ok:
        raise RuntimeError(f"probe round failed: {result.error}")
    agent.sample()
    return agent, exporter


def get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})
    with urllib.request.urlopen(request, timeout=30) as response:
        body: bytes = response.read()
        return body


def series_count(page: bytes) -> int:
    return sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))


def scrape(url: str, count: int, before: Callable[[], None] = lambda: None) -> Figures:
    """`count` timed scrapes after one warm-up; `before` runs untimed ahead of each."""
    page = get(url)
    seconds = []
    for _ in range(count):
        before()
        start = time.perf_counter()
        page = get(url)
        seconds.append(time.perf_counter() - start)
    return Figures(seconds, len(page), series_count(page))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_exporter(path: str, count: int) -> Figures:
    """Start the node exporter on a free loopback port, scrape it, stop it."""
    port = free_port()
    process = subprocess.Popen(
        [path, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + START_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{path} exited with status {process.returncode} at start")
            try:
                get(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{path} did not answer on {url} within {START_SECONDS:.0f} s"
                    ) from None
                time.sleep(0.05)
        return scrape(url, count)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def line(name: str, f: Figures) -> str:
    return (
        f"{name:<28} median {f.median * 1e3:8.3f} ms  p95 {f.p95 * 1e3:8.3f} ms  "
        f"{f.page_bytes:>9,d} bytes  {f.series:>6,d} series  "
        f"{f.median / f.series * 1e6:7.3f} us/series"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200, help="timed scrapes per exporter (default 200)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs in the simulated node (default 8)")
    parser.add_argument("--node-exporter", default=NODE_EXPORTER, metavar="PATH", help="node exporter binary")
    args = parser.parse_args(argv)
    if args.scrapes < 1 or not 1 <= args.gpus <= 64:
        print("exporter_scrape: need --scrapes >= 1 and --gpus within 1..64", file=sys.stderr)
        return 2
    exe = shutil.which(args.node_exporter)
    if exe is None or not os.access(exe, os.X_OK):
        print(
            f"exporter_scrape: {args.node_exporter} is not installed "
            "(Debian: apt-get install prometheus-node-exporter); it is the baseline this bench compares with",
            file=sys.stderr,
        )
        return 2
    agent, exporter = build_node(args.gpus)
    server = MetricsServer("127.0.0.1:0", exporter.render)
    server.start()
    latest = agent.latest
    assert latest is not None
    try:
        ours = scrape(server.url, args.scrapes, before=lambda: exporter.observe(latest))
        cached = scrape(server.url, args.scrapes)
    finally:
        server.stop()
        agent.close()
    theirs = node_exporter(exe, args.scrapes)
    print(
        f"exporter_scrape: {args.scrapes} scrapes each over HTTP on 127.0.0.1; simulated {args.gpus}-GPU "
        f"node with host, BMC, probes and dcgm-exporter compatibility; {os.cpu_count()} CPUs"
    )
    print(line("gpufleet agent (render)", ours))
    print(line("gpufleet agent (cached)", cached))
    print(line("prometheus-node-exporter", theirs))
    per_scrape = ours.median / theirs.median
    per_series = (ours.median / ours.series) / (theirs.median / theirs.series)
    print(
        f"ours / node exporter: {per_scrape:.2f}x per scrape, {per_series:.2f}x per series (medians, render)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
