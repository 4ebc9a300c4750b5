"""How much a controller's store grows per probe round, through the store's own save_frame: N nodes
of the scale bench's first archetype (8 GPUs, 57 probe keys), their probe rounds written one after
another, the store's size taken at two rounds. Also the store thread's time per probe frame. Prints
a table; asserts nothing (tests/bench/test_store_growth.py runs a small step of it).

    .venv/bin/python bench/store_growth.py [--nodes 200] [--rounds 70,110] [--db URL] [--json]

Past fleet/series.py's HISTORY_POINTS (64) rounds, each key's series is full and rewritten in place:
what grows after that grows with time, kept for PROBE_HISTORY_DAYS (30) at one round every half
hour (probes.interval_seconds), 1,440 rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controller_scale_load.report import print_row
from controller_scale_load.templates import build_archetype, frame_message, hello_message

from controller.fleet.model import Fleet, FrameWrite, ProbeRecord
from controller.fleet.state import apply_hello, plan_frame
from controller.store.sql import Conn
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb

ROUND_SECONDS = 1800.0  # probes.interval_seconds' default
KEPT_ROUNDS = 1440  # 30 days (controller/app.py PROBE_HISTORY_DAYS) of rounds every half hour
FLEET_NODES = 12_500  # issue 17's fleet


def _sqlite_bytes(conn: Conn) -> int:
    """SQLite's pages in use (the WAL's included), less its free ones."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    return int((pages - free) * conn.execute("PRAGMA page_size").fetchone()[0])


def _postgres_bytes(conn: Conn) -> int:
    return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])


async def measure(db: str, nodes: int, rounds: tuple[int, int]) -> dict[str, Any]:
    stored_bytes = _postgres_bytes if db.startswith("postgresql://") else _sqlite_bytes
    archetype = build_archetype(0, 1, 1e9, 10.0)
    store = Store(db, synchronous="off")
    await store.open()
    try:
        probes: dict[str, list[ProbeRecord]] = {}
        for n in range(nodes):
            name = f"node-{n:05d}"
            fleet = Fleet()
            hello = pb.AgentMessage.FromString(hello_message(archetype, name, "boot", 1e9)).hello
            apply_hello(fleet, hello, 0, 1e9)
            await store.save_hello(hello, 1e9)
            message = frame_message(archetype, name, "boot", seq=1, floor=0, now=1e9 + 10)
            frame = pb.AgentMessage.FromString(message).frame
            probes[name] = plan_frame(fleet.nodes[name], frame, 1e9 + 11)[0].probes
        sizes: dict[int, int] = {}
        spent = {r: 0.0 for r in rounds}
        for r in range(1, rounds[1] + 1):
            began = time.perf_counter()
            at = 1e9 + ROUND_SECONDS * r
            for name, records in probes.items():
                again = [
                    dataclasses.replace(p, time=at, value=p.value * (1 + 0.001 * (r % 7))) for p in records
                ]
                await store.save_frame(FrameWrite(name, "boot", r, at, probes=again))
            if r > rounds[0]:
                spent[rounds[1]] += time.perf_counter() - began
            if r in rounds:
                sizes[r] = await store._call("size", stored_bytes)
                print(f"[store_growth] round {r}: {sizes[r] / 2**20:.1f} MB", file=sys.stderr, flush=True)
    finally:
        store.close()
    low, high = rounds
    per_round = (sizes[high] - sizes[low]) / (high - low) / nodes
    return {
        "nodes": nodes,
        "probe_keys": sum(len(p) for p in probes.values()),
        "rounds": f"{low}-{high}",
        "mb_at_low": sizes[low] / 2**20,
        "mb_at_high": sizes[high] / 2**20,
        "kb_per_node_round": per_round / 1024,
        "gib_30_days_12500_nodes": per_round * KEPT_ROUNDS * FLEET_NODES / 2**30,
        "ms_per_probe_frame": 1000 * spent[high] / ((high - low) * nodes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--rounds", default="70,110", help="the two rounds whose store sizes are compared")
    parser.add_argument("--db", help="a postgresql:// URL of a fresh database (default: an SQLite file)")
    parser.add_argument("--json", action="store_true", help="print the row as JSON")
    args = parser.parse_args()
    try:
        low, high = (int(r) for r in args.rounds.split(","))
    except ValueError:
        parser.error("--rounds takes two round numbers, e.g. 70,110")
    if args.nodes < 1 or not 1 <= low < high:
        parser.error("--nodes must be at least 1 and --rounds two rounds, the first the lower")
    with tempfile.TemporaryDirectory(prefix="gpufleet-growth-") as tmp:
        row = asyncio.run(measure(args.db or str(Path(tmp) / "fleet.db"), args.nodes, (low, high)))
    row.update(cores=os.cpu_count(), store="postgresql" if args.db else "sqlite")
    print_row(row, as_json=args.json, width=23, digits=2)


if __name__ == "__main__":
    main()
