"""How long the hourly prune of an old store's probe_history holds the store's writing thread.

A store written before probe_series holds up to PROBE_HISTORY_DAYS (30) of logged probe results in
probe_history until they age out; nothing writes there since. This fills probe_history as such a
store held it (N nodes of 57 probe keys, R rounds every half hour; each node's Hello in `nodes`),
then prunes one round of it twice: as before (one `DELETE ... WHERE time < ?`: one job, no index on
time to serve it) and through Store.prune_history (controller/store/logged_history.py: a few nodes
a job). For each: the longest job (what every ack queued meanwhile waits behind), the total and the
rows removed; and those scaled to --fleet nodes (a scan grows with the table, a job of a few nodes
does not). Prints a table; asserts nothing (tests/bench/test_history_prune.py runs a small step).

    .venv/bin/python bench/history_prune.py [--nodes 100] [--rounds 1440] [--fleet 2000] [--db URL] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from controller_scale_load.report import print_row

from controller.store import logged_history
from controller.store.sql import Conn
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb

T = TypeVar("T")
ROUND_SECONDS = 1800.0  # probes.interval_seconds' default
KEYS = [
    (gpu, probe)
    for gpu in range(8)
    for probe in ("gemm", "hbm", "pcie_h2d", "pcie_d2h", "nvlink", "l2", "sm")
]
KEYS.append((-1, "nccl"))  # 57: the scale bench's first archetype's count


def _log_rows(conn: Conn, node: str, start: float, rounds: int) -> None:
    rows = [
        (node, gpu, probe, "v", start + r * ROUND_SECONDS, 700.0 + r % 7)
        for r in range(rounds)
        for gpu, probe in KEYS
    ]
    raw = getattr(conn, "raw", None)
    if raw is None:
        conn.executemany(
            "INSERT INTO probe_history (node, gpu, probe, variant, time, value) VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        return
    with raw.cursor().copy("COPY probe_history (node, gpu, probe, variant, time, value) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


async def fill(store: Store, nodes: int, rounds: int, start: float) -> None:
    for n in range(nodes):
        name = f"node-{n:05d}"
        await store.save_hello(pb.Hello(node=name, boot_id="boot"), start)
        await store._call("fill", partial(_log_rows, node=name, start=start, rounds=rounds))


def _timed(fn: Callable[..., T], spent: list[float]) -> Callable[..., T]:
    def timed(*args: Any, **kwargs: Any) -> T:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - began)

    return timed


async def measure(db: str, nodes: int, rounds: int) -> dict[str, Any]:
    start = time.time() - rounds * ROUND_SECONDS
    store = Store(db, synchronous="off")
    await store.open()
    try:
        began = time.perf_counter()
        await fill(store, nodes, rounds, start)
        fill_s = time.perf_counter() - began

        def one_delete(conn: Conn) -> tuple[int, float]:  # the prune as it was
            began = time.perf_counter()
            removed = conn.execute(
                "DELETE FROM probe_history WHERE time < ?", (start + ROUND_SECONDS,)
            ).rowcount
            return int(removed), time.perf_counter() - began

        before_removed, before_s = await store._call("prune_history", one_delete)

        jobs: list[float] = []
        look, prune = logged_history.nodes_logged, logged_history.prune
        logged_history.nodes_logged = _timed(look, jobs)
        logged_history.prune = _timed(prune, jobs)
        try:
            began = time.perf_counter()
            after_removed = await store.prune_history(start + 2 * ROUND_SECONDS)
            after_total_s = time.perf_counter() - began
        finally:
            logged_history.nodes_logged, logged_history.prune = look, prune
    finally:
        store.close()
    return {
        "nodes": nodes,
        "rounds": rounds,
        "rows": nodes * rounds * len(KEYS),
        "fill_s": fill_s,
        "before_removed": before_removed,
        "before_job_s": before_s,
        "after_removed": after_removed,
        "after_jobs": len(jobs),
        "after_longest_job_s": max(jobs),
        "after_jobs_s": sum(jobs),
        "after_total_s": after_total_s,
    }


def scaled(row: dict[str, Any], fleet: int) -> dict[str, Any]:
    """The figures at `fleet` nodes: the one DELETE's scan and the jobs' sum grow with the nodes."""
    grow = fleet / row["nodes"]
    return {
        "fleet": fleet,
        "fleet_before_job_s": row["before_job_s"] * grow,
        "fleet_after_longest_job_s": row["after_longest_job_s"],
        "fleet_after_jobs_s": row["after_jobs_s"] * grow,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1440, help="half-hourly probe rounds logged per key")
    parser.add_argument("--fleet", type=int, default=2000, help="nodes to scale the figures to")
    parser.add_argument("--db", help="a postgresql:// URL of a fresh database (default: an SQLite file)")
    parser.add_argument("--json", action="store_true", help="print the row as JSON")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.rounds < 3:
        parser.error("--nodes must be at least 1 and --rounds at least 3")
    with tempfile.TemporaryDirectory(prefix="gpufleet-prune-") as tmp:
        row = asyncio.run(measure(args.db or str(Path(tmp) / "fleet.db"), args.nodes, args.rounds))
    row |= scaled(row, args.fleet) | {"cores": os.cpu_count()}
    print_row(row, as_json=args.json, width=24, digits=3)


if __name__ == "__main__":
    main()
