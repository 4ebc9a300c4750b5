"""What a replica's writes cost the controller per frame, the store alone: each frame's ack position
(its node's owner row checked, replica_ingest) and its latest readings (8 GPUs and the host, as a
standby writes them every frame at a 10 s cadence), B frames queued together (a busier replica's
batches are bigger). Per batch size: this process's CPU per frame (the store's thread and the event
loop), wall time per frame, statements per frame (counted on the store's connection) and batches
rolled back and run again (controller/store/writer.py). Prints a table; asserts nothing
(tests/bench/test_store_writes.py runs a small step).

    .venv/bin/python bench/store_writes.py [--db postgresql://...] [--batches 1,8,32] [--rounds 400] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.fleet.model import FrameWrite, GpuState, NodeState
from controller.store.sql import Conn
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb

OWNER = "bench:1"
GPUS = 8
LINKS = 18


def _hello(node: str) -> pb.Hello:
    hello = pb.Hello(node=node, boot_id="boot", agent_version="bench")
    for index in range(GPUS):
        hello.inventory.gpus.add(index=index, uuid=f"GPU-{node}-{index}", name="NVIDIA H100 80GB HBM3")
    return hello


def _node(name: str, time_s: float) -> NodeState:
    node = NodeState(name, _hello(name), time_s, time_s)
    for index in range(GPUS):
        sample = pb.GpuSample(index=index, power_watts=500.0, temperature_celsius=55.0, sm_clock_hz=1.98e9)
        for link in range(LINKS):
            sample.nvlinks.add(link=link)
        node.gpus[index] = GpuState(index, sample, time_s, {})
    node.host, node.host_time = pb.HostSample(load1=1.5), time_s
    return node


def _count(conn: Any, said: list[int]) -> None:
    """Every statement the store's connection runs from now on adds one to said[0]."""

    def counted(*_: Any) -> None:
        said[0] += 1

    if isinstance(conn, sqlite3.Connection):
        conn.set_trace_callback(counted)
        return
    execute, executemany = conn.execute, conn.executemany  # PostgreSQL: the store's PgConnection

    def execute_counted(sql: str, parameters: Any = (), /) -> Any:
        counted()
        return execute(sql, parameters)

    def executemany_counted(sql: str, parameters: Any, /) -> Any:
        counted()  # one pipeline: rows sent together
        return executemany(sql, parameters)

    conn.execute, conn.executemany = execute_counted, executemany_counted


async def measure(db: str, nodes: int, batch: int, rounds: int) -> dict[str, Any]:
    store = Store(db)
    store.owner = OWNER
    await store.open()
    try:
        names = [f"node-{n:05d}" for n in range(nodes)]
        for name in names:
            await store.claim_node(name)
            await store.save_hello(_hello(name), 100.0)
        states = {name: _node(name, 100.0) for name in names}
        said = [0]

        def count(conn: Conn) -> None:
            _count(conn, said)

        await store._call("bench", count)
        said[0] = 0
        cpu, began = time.process_time(), time.perf_counter()
        for r in range(rounds):
            chunk = [names[(r * batch + k) % nodes] for k in range(batch)]
            seq = 1 + (r * batch) // nodes
            writes = [store.save_frame(FrameWrite(n, "boot", seq, 100.0 + seq, state=False)) for n in chunk]
            await asyncio.gather(*writes, store.queue_latest([states[n] for n in chunk]))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - began
        frames = rounds * batch
        return {
            "batch": batch,
            "frames": frames,
            "cpu_ms_per_frame": 1e3 * cpu / frames,
            "wall_ms_per_frame": 1e3 * wall / frames,
            "statements_per_frame": said[0] / frames,
            "batches_run_again": store.batches_run_again,
        }
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="a postgresql:// URL of a fresh database (default: an SQLite file)")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--batches", default="1,8,32", help="frames queued together, comma separated")
    parser.add_argument("--rounds", type=int, default=400, help="batches written per batch size")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.rounds < 1 or args.nodes < max(batches) or min(batches) < 1:
        parser.error("--rounds must be at least 1, --batches at least 1 and at most --nodes")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-writes-") as tmp:
        for batch in batches:
            db = args.db or str(Path(tmp) / f"fleet-{batch}.db")
            rows.append(asyncio.run(measure(db, args.nodes, batch, args.rounds)))
    if args.json:
        print(json.dumps({"cores": os.cpu_count(), "rows": rows}))
        return
    print(f"store: {'PostgreSQL' if args.db else 'SQLite'}; {os.cpu_count()} cores")
    print("  ".join(f"{name:>20}" for name in rows[0]))
    for row in rows:
        print("  ".join(f"{v:>20.3f}" if isinstance(v, float) else f"{v:>20}" for v in row.values()))


if __name__ == "__main__":
    main()
