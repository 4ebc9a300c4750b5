"""How many nodes one controller keeps up with: ingest throughput, store latency, detection time.

Builds a simulated fleet (8-GPU H100 nodes, frames with probe results as the agent sends them),
then feeds every node's frames concurrently into the controller's real ingest path (validation,
dedupe, SQLite group commit with synchronous=full on a real file, fleet state) and times it, and
finally times one detection pass over the whole fleet. Prints figures; asserts nothing.

    .venv/bin/python bench/controller_ingest.py [--nodes 256] [--frames 20] [--db PATH]

A node sends one frame per 10 s, so N nodes need N/10 frames/s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from agent.snapshot import Snapshot
from agent.sources.sim import SimNode
from agent.sources.sim.probes import ModelledProbes
from agent.stream import frames
from controller.app import ControllerApp
from controller.config import ControllerConfig
from protos.gpufleet.v1 import telemetry_pb2 as pb

SAMPLE_INTERVAL_S = 10.0


def build(nodes: int, count: int) -> tuple[list[pb.Hello], dict[str, list[pb.TelemetryFrame]]]:
    # Frames end now: the controller refuses times before 2000 or ahead of its clock.
    now = [time.time() - (count + 1) * SAMPLE_INTERVAL_S]
    hellos, streams = [], {}
    for i in range(nodes):
        name = f"bench-{i:04d}"
        sim = SimNode(name, seed=i, clock=lambda: now[0])
        hellos.append(
            frames.hello(name, f"boot-{i}", "bench", sim.inventory(), host=None, probes=[], started_at=now[0])
        )
        out = []
        for seq in range(1, count + 1):
            snapshot = Snapshot(node=name, time=now[0] + seq * SAMPLE_INTERVAL_S, gpus=sim.read())
            if seq == 1:
                snapshot.probes = ModelledProbes(sim).run([])
            out.append(frames.frame(snapshot, f"boot-{i}", seq))
        streams[name] = out
    return hellos, streams


async def feed(
    app: ControllerApp, name: str, stream: list[pb.TelemetryFrame], latencies: list[float]
) -> None:
    for frame in stream:
        start = time.perf_counter()
        await app.ingest.frame(name, frame)
        latencies.append(time.perf_counter() - start)


async def run(nodes: int, count: int, db: str) -> None:
    t0 = time.perf_counter()
    hellos, streams = build(nodes, count)
    size = statistics.mean(len(f.SerializeToString()) for f in streams[hellos[0].node][1:])
    print(
        f"fleet: {nodes} nodes x 8 GPUs, {count} frames each, {size / 1024:.1f} KiB per frame "
        f"(built in {time.perf_counter() - t0:.1f}s)"
    )
    app = ControllerApp(ControllerConfig(db=db))
    await app.start()
    try:
        for hello in hellos:
            await app.ingest.hello(hello)
        latencies: list[float] = []
        start = time.perf_counter()
        await asyncio.gather(*(feed(app, h.node, streams[h.node], latencies) for h in hellos))
        wall = time.perf_counter() - start
        total = nodes * count
        latencies.sort()
        print(
            f"ingest: {total} frames in {wall:.2f}s = {total / wall:.0f} frames/s "
            f"(enough for {total / wall * SAMPLE_INTERVAL_S:.0f} nodes at a 10 s interval)"
        )
        print(
            f"ingest latency per frame (with the SQLite commit): "
            f"p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms, "
            f"p99 {latencies[int(len(latencies) * 0.99)] * 1e3:.1f} ms"
        )
        passes = []
        for _ in range(3):
            start = time.perf_counter()
            report = await app.detection_pass()
            passes.append(time.perf_counter() - start)
        print(
            f"detection pass over {nodes * 8} GPUs: best {min(passes) * 1e3:.0f} ms, "
            f"{len(report.findings)} findings"
        )
    finally:
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--frames", type=int, default=20, help="frames per node")
    parser.add_argument("--db", help="SQLite file (default: a temporary file)")
    args = parser.parse_args()
    if args.db:
        asyncio.run(run(args.nodes, args.frames, args.db))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.nodes, args.frames, str(Path(tmp) / "bench.db")))


if __name__ == "__main__":
    main()
