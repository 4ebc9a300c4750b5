"""How long a controller takes to start on a store holding N nodes, each with R probe rounds of
history, and what it then holds: the time a restarted controller, or a standby taking the lead,
spends before it serves (issue 17: a second replica takes over within 30 s).

The store is filled first (not timed): each node's Hello and first frames as the scale bench sends
them (built_fleet.py), and before them R-1 older probe rounds (every probes.interval_seconds, the
values a little apart) written through the store's own functions. Then a ControllerApp starts on
it as `gpufleet controller` does (store opened, lead taken, fleet loaded, its detection process
started and given the fleet), timed in those parts. Prints a table; asserts nothing
(tests/bench/test_controller_startup.py runs a small step of it).

With --warm the controller is a warm standby (replica_ingest, controller/warm_standby.py): another
holder leads the store while it loads (warm_load_s); then every node is written again, as every
replica_sync_seconds, and the leader lets go of the lead (as the server does 15 s into a hung
leader's silence). start_s is then the takeover: from the lead let go to serving, its wait for the
lead (lead_wait_s, up to the lease's 2 s poll) included; first_take_in_s the new leader's first
take-in of the nodes written since the standby's last look (all of them here), which brings its
fleet up to the store's (timed after start_s, not part of it: the leader serves meanwhile).

    .venv/bin/python bench/controller_startup.py [--nodes 2000] [--rounds 64] [--db URL] [--warm] [--json]

R = 64 (fleet/series.py HISTORY_POINTS) is a fleet probed every half hour for 32 hours or more.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from controller_scale_load.built_fleet import ARCHETYPES, FRAMES
from controller_scale_load.templates import build_archetype, frame_message, hello_message

from controller.app import ControllerApp
from controller.config import ControllerConfig
from controller.fleet.model import Fleet
from controller.fleet.state import apply_hello, plan_frame
from controller.store import nodes as node_rows
from controller.store.lease import POLL_SECONDS
from controller.store.sql import Conn
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb

ROUND_SECONDS = 1800.0  # probes.interval_seconds' default
NODES_PER_CALL = 50  # nodes filled in one transaction


def _fill_node(conn: Conn, archetype: Any, name: str, rounds: int, start: float) -> None:
    """One node's rows: R-1 older probe rounds, then its Hello and first FRAMES frames."""
    fleet = Fleet()
    hello = pb.AgentMessage.FromString(hello_message(archetype, name, "boot", start)).hello
    apply_hello(fleet, hello, 0, start)
    writes = []
    for seq in range(1, FRAMES + 1):
        now = start + 10 * seq
        frame = pb.AgentMessage.FromString(
            frame_message(archetype, name, "boot", seq=seq, floor=0, now=now)
        ).frame
        writes.append(plan_frame(fleet.nodes[name], frame, now + 1)[0])
    probes = [p for w in writes for p in w.probes]
    older = [
        (
            p.node,
            -1 if p.gpu is None else p.gpu,
            p.probe,
            p.variant,
            p.time - r * ROUND_SECONDS,
            p.value * (1 + 0.002 * (r % 5)),
        )
        for r in range(rounds - 1, 0, -1)
        for p in probes
    ]
    node_rows.save_series(conn, name, older)  # as save_frame keeps them, round by round
    node_rows.save_hello(conn, hello, start)
    for write in writes:
        node_rows.save_frame(conn, write)


async def fill(db: str, nodes: int, rounds: int, start: float) -> float:
    archetypes = [build_archetype(i, 1, start, 10.0) for i in range(ARCHETYPES)]
    store = Store(db, synchronous="off")
    await store.open()
    began = time.perf_counter()
    try:
        for low in range(0, nodes, NODES_PER_CALL):
            names = range(low, min(nodes, low + NODES_PER_CALL))

            def job(conn: Conn, names: range = names) -> None:
                for n in names:
                    _fill_node(conn, archetypes[n % ARCHETYPES], f"node-{n:05d}", rounds, start)

            await store._call("fill", job)
            if low and low % (20 * NODES_PER_CALL) == 0:
                print(f"[controller_startup] filled {low} of {nodes} nodes", file=sys.stderr, flush=True)
    finally:
        store.close()
    return time.perf_counter() - began


async def started(db: str, now: float, *, warm: bool = False) -> dict[str, Any]:
    """A controller's start on the store, timed in parts, and what its processes then hold."""
    gc.collect()
    me = psutil.Process()
    rss = me.memory_info().rss
    config = ControllerConfig(listen="127.0.0.1:0", db=db, replica_ingest=warm)
    app = ControllerApp(config, clock=lambda: now)
    more: dict[str, Any] = {}
    try:
        if warm:
            began, loaded, more = await _warm_standby(app, db, now)
            peak_reset = False
        else:
            peak_reset = _reset_peak_rss()
            began = time.perf_counter()
            await app.start()
            loaded = time.perf_counter()
        peak = _peak_rss() if peak_reset else None
        await app.start_detection_process()
        given = time.perf_counter()
        gc.collect()
        children = sum(c.memory_info().rss for c in me.children(recursive=True))
        fleet = app.fleet
        return {
            "nodes": len(fleet.nodes),
            "probe_keys": len(fleet.history),
            "history_points": sum(len(s) for s in fleet.history.values()),
            "start_s": loaded - began,
            "detection_s": given - loaded,
            "total_s": given - began,
            "controller_kb_per_node": (me.memory_info().rss - rss) / 1024 / max(1, len(fleet.nodes)),
            # The load's high-water mark above what the process held before: rows fetched beside
            # the fleet they become. None where the kernel cannot reset the mark (not Linux).
            "load_peak_mb": None if peak is None else (peak - rss) / 2**20,
            "detection_mb": children / 2**20,
            **more,
        }
    finally:
        if app.detection is not None:
            await app.detection.stop()
        app.close()


async def _warm_standby(app: ControllerApp, db: str, now: float) -> tuple[float, float, dict[str, Any]]:
    """app started as a standby while another holder leads; its load timed; every node then
    written again by that holder, which lets go of the lead; when it did, when app served, and the
    warm load's and first take-in's figures."""
    leader = Store(db)
    await leader.open()
    await leader.lead("bench-leader", now, lambda: None)

    async def keep_leading() -> None:  # its lease pinged, as a leader's is (a silent one is let go)
        while await leader.still_leading():
            await asyncio.sleep(POLL_SECONDS)
        raise RuntimeError("the bench's leader lost its lease")

    keeping = asyncio.create_task(keep_leading())

    def owned(conn: Conn) -> None:
        conn.execute(
            "INSERT INTO node_owners (node, holder, since, written)"
            " SELECT name, ?, ?, ? FROM nodes WHERE true ON CONFLICT (node)"
            " DO UPDATE SET holder = excluded.holder, written = excluded.written",
            ("bench-leader", now, now),
        )

    await leader._call("owners", owned)
    begun = time.perf_counter()

    async def ingesting() -> None:  # (no agents here)
        await asyncio.Event().wait()

    starting = asyncio.create_task(app.start(standby_work=ingesting))
    while app.warm is None or app.warm.fleet is None:
        for task in (starting, keeping):
            if task.done():
                task.result()
                raise RuntimeError("the controller led before its warm load")
        await asyncio.sleep(0.05)
    warm_load_s = time.perf_counter() - begun
    await leader._call("owners", lambda c: c.execute("UPDATE node_owners SET written = ?", (now + 1,)))
    keeping.cancel()
    if app.store.epoch is not None:
        raise RuntimeError("the controller led before the bench's leader let go")
    leader.close()  # the lease let go
    let_go = time.perf_counter()
    while app.store.epoch is None and not starting.done():  # waiting for the lead: the lease's poll
        await asyncio.sleep(0.01)
    led = time.perf_counter()
    await starting
    started_at = time.perf_counter()
    assert app.replicas is not None
    taken = await app.replicas.take_in()  # the leader's first, at once: the others' nodes since
    return (
        let_go,
        started_at,
        {
            "warm_load_s": warm_load_s,
            "lead_wait_s": led - let_go,
            "led_to_serving_s": started_at - led,
            "first_take_in_s": time.perf_counter() - started_at,
            "taken_in_nodes": len(taken),
        },
    )


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its RSS now (Linux: /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=64, help="probe rounds of history per node")
    parser.add_argument("--db", help="a postgresql:// URL of a fresh database (default: an SQLite file)")
    parser.add_argument(
        "--dir",
        help="keep the SQLite store here (with --db: a note that the database is filled) and start "
        "on it again next time (filled once for the same --nodes, --rounds and --db; default: a "
        "temporary directory)",
    )
    parser.add_argument(
        "--warm", action="store_true", help="time a warm standby's takeover (replica_ingest), not a start"
    )
    parser.add_argument("--json", action="store_true", help="print the row as JSON")
    args = parser.parse_args()
    if args.nodes < 1 or args.rounds < 1:
        parser.error("--nodes and --rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gpufleet-startup-") as tmp:
        row = _run(args, Path(args.dir or tmp))
    row.update(cores=os.cpu_count())
    if args.json:
        print(json.dumps(row))
        return
    cols = ("nodes", "rounds", "probe_keys", "history_points", "start_s", "detection_s", "total_s")
    more: tuple[str, ...] = ("controller_kb_per_node", "load_peak_mb", "detection_mb", "store_mb", "fill_s")
    if args.warm:
        more += ("warm_load_s", "lead_wait_s", "led_to_serving_s", "first_take_in_s", "taken_in_nodes")
    print("  ".join(f"{c:>15}" for c in cols + more))
    print("  ".join(_cell(row.get(c)) for c in cols + more))


def _run(args: argparse.Namespace, where: Path) -> dict[str, Any]:
    """Fill the store (unless --dir holds one filled the same way) and start on it."""
    db = args.db or str(where / "fleet.db")
    marker = where / "filled.json"
    wanted = {"nodes": args.nodes, "rounds": args.rounds, "db": hashlib.sha256(db.encode()).hexdigest()}
    filled = json.loads(marker.read_text()) if marker.exists() else None
    if filled is not None and {k: filled.get(k) for k in wanted} != wanted:
        raise SystemExit(f"controller_startup: {where} says its store was filled otherwise: {filled}")
    if filled is None:
        start = time.time() - args.rounds * ROUND_SECONDS
        where.mkdir(parents=True, exist_ok=True)
        filled = {**wanted, "start": start, "fill_s": asyncio.run(fill(db, args.nodes, args.rounds, start))}
        marker.write_text(json.dumps(filled))
    row = asyncio.run(started(db, filled["start"] + 10 * FRAMES + 1, warm=args.warm))
    if not args.db:
        row["store_mb"] = sum(p.stat().st_size for p in where.glob("fleet.db*")) / 2**20
    return {**row, "rounds": args.rounds, "fill_s": filled["fill_s"]}


def _cell(value: object) -> str:
    return f"{value:>15.2f}" if isinstance(value, float) else f"{'-' if value is None else value:>15}"


if __name__ == "__main__":
    main()
