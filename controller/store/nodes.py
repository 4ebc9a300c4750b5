"""The node tables: Hellos, ack positions, the latest GPU/host/BMC readings, probe results and each
key's newest results (probe_series), findings; and loading them all into a Fleet at start. Portable
SQL (controller/store/sql.py): the same statements run on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter
from sys import intern
from typing import Any

import msgspec

from controller.fleet.finding import Finding
from controller.fleet.findings import StoredFinding
from controller.fleet.model import Fleet, FrameWrite, GpuState
from controller.fleet.series import HISTORY_POINTS, Series
from controller.store.sql import Conn, placeholders, stream, upsert
from controller.store.stored_nodes import NAMES_PER_QUERY, fetch_nodes
from protos.gpufleet.v1 import telemetry_pb2 as pb

# A node's latest readings to write: name, GPU readings, host reading (or None), its time.
LatestRow = tuple[str, Sequence[GpuState], pb.HostSample | None, float]


def save_hello(conn: Conn, hello: pb.Hello, now: float) -> int:
    conn.execute(
        "INSERT INTO nodes (name, hello, first_seen, last_seen) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET hello = excluded.hello, last_seen = excluded.last_seen",
        (hello.node, hello.SerializeToString(), now, now),
    )
    row = conn.execute(
        "SELECT acked_seq FROM boots WHERE node = ? AND boot_id = ?", (hello.node, hello.boot_id)
    ).fetchone()
    return int(row[0]) if row else 0


def save_hellos(conn: Conn, hellos: Sequence[tuple[pb.Hello, float]]) -> list[int]:
    """save_hello for many (Hello, now): the Hellos in one executemany, their boots' ack positions
    read in one statement (per NAMES_PER_QUERY); in the order given. A node named twice ends as one
    after the other would leave it (the later Hello kept, the first first_seen)."""
    conn.executemany(
        "INSERT INTO nodes (name, hello, first_seen, last_seen) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET hello = excluded.hello, last_seen = excluded.last_seen",
        [(hello.node, hello.SerializeToString(), now, now) for hello, now in hellos],
    )
    names = [hello.node for hello, _ in hellos]
    acked: dict[tuple[str, str], int] = {}
    for start in range(0, len(names), NAMES_PER_QUERY):
        chunk = names[start : start + NAMES_PER_QUERY]
        sql = f"SELECT node, boot_id, acked_seq FROM boots WHERE node IN ({placeholders(chunk)})"
        acked.update(((str(n), str(b)), int(a)) for n, b, a in conn.execute(sql, tuple(chunk)).fetchall())
    return [acked.get((hello.node, hello.boot_id), 0) for hello, _ in hellos]


SAVE_ACK = (
    "INSERT INTO boots (node, boot_id, acked_seq, updated) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (node, boot_id) DO UPDATE SET acked_seq = excluded.acked_seq, updated = "
    "CASE WHEN excluded.updated > boots.updated THEN excluded.updated ELSE boots.updated END"
)


def save_acks(conn: Conn, writes: Sequence[FrameWrite]) -> None:
    """The ack positions of frames that carry nothing else to store (save_frame's first statement
    for each), in one statement."""
    conn.executemany(SAVE_ACK, [(w.node, w.boot_id, w.seq, w.time) for w in writes])


def save_frame(conn: Conn, w: FrameWrite) -> None:
    """The frame's ack position and probe results always; its latest readings when w.state says so
    (Ingest writes a node's readings at most every db_state_seconds: the next frame replaces them).
    A probe result goes into probe_results (its key's newest) and probe_series (its key's newest
    HISTORY_POINTS), not into probe_history: nothing read that log but a start, and probe_series
    holds what a start reads. Kept 30 days (PROBE_HISTORY_DAYS), it grew by a row per result: about
    34 million rows a day at 12,500 nodes probed every half hour, and the hourly prune scanned them
    all in the store's one writing thread."""
    conn.execute(SAVE_ACK, (w.node, w.boot_id, w.seq, w.time))
    if w.state:
        save_latest(conn, w.node, w.gpus, w.host, w.time)
    if w.bmc is not None:
        conn.execute(
            upsert("bmc_state", "node, time, sample", "node"),
            (w.node, w.bmc_time, w.bmc.SerializeToString()),
        )
    if not w.probes:
        return
    rows = [(p.node, -1 if p.gpu is None else p.gpu, p.probe, p.variant, p.time, p.value) for p in w.probes]
    conn.executemany(
        upsert(
            "probe_results",
            "node, gpu, probe, variant, time, value, unit, result",
            "node, gpu, probe, variant",
        ),
        [(*row, p.unit, p.data) for row, p in zip(rows, w.probes, strict=True)],
    )
    save_series(conn, w.node, rows)


SeriesKey = tuple[int, str, str]  # gpu (-1: node-level), probe, variant: a probe_series row's, within a node


def save_series(conn: Conn, node: str, rows: Sequence[tuple[str, int, str, str, float, float]]) -> int:
    """Add results (node, gpu, probe, variant, time, value) to their keys' rows in probe_series, as
    Fleet.history adds them (fleet/state.py remember): what a start loads, one row a key. How many
    keys it wrote."""
    held: dict[SeriesKey, Series] = {
        (int(g), str(p), str(v)): Series.from_bytes(bytes(b))
        for g, p, v, b in conn.execute(
            "SELECT gpu, probe, variant, points FROM probe_series WHERE node = ?", (node,)
        ).fetchall()
    }
    changed: dict[SeriesKey, Series] = {}
    for _, gpu, probe, variant, time, value in rows:
        key = (int(gpu), str(probe), str(variant))
        series = held.get(key)
        if series is None:
            series = held[key] = Series()
        series.add(time, value)
        changed[key] = series
    conn.executemany(
        upsert("probe_series", "node, gpu, probe, variant, points", "node, gpu, probe, variant"),
        [(node, *key, series.to_bytes()) for key, series in changed.items()],
    )
    return len(changed)


def save_latest(
    conn: Conn,
    node: str,
    gpus: Sequence[GpuState],
    host: pb.HostSample | None,
    host_time: float,
) -> None:
    """A node's latest GPU and host readings (nodes.last_seen is not touched: boots.updated says when
    its newest frame was, and load() takes the later of the two)."""
    save_latest_of(conn, [(node, gpus, host, host_time)])


def save_latest_of(conn: Conn, nodes: Sequence[LatestRow]) -> None:
    """Several nodes' latest readings (as save_latest), in one statement for their GPUs and one for
    their hosts."""
    gpu_rows = [
        (node, g.index, g.time, g.sample.SerializeToString(), json.dumps(g.held))
        for node, gpus, _, _ in nodes
        for g in gpus
    ]
    if gpu_rows:
        conn.executemany(upsert("gpu_state", "node, gpu, time, sample, held", "node, gpu"), gpu_rows)
    host_rows = [(node, t, host.SerializeToString()) for node, _, host, t in nodes if host is not None]
    if host_rows:
        conn.executemany(upsert("host_state", "node, time, sample", "node"), host_rows)


def finding_row(s: StoredFinding) -> tuple[object, ...]:
    f = s.finding
    return (
        s.id,
        f.node,
        f.gpu,
        f.cause,
        f.severity,
        s.first_seen,
        s.last_seen,
        int(s.active),
        msgspec.json.encode(f),
    )


def save_findings(conn: Conn, findings: list[StoredFinding]) -> None:
    conn.executemany(
        upsert("findings", "id, node, gpu, cause, severity, first_seen, last_seen, active, body", "id"),
        [finding_row(s) for s in findings],
    )


def stored(row: tuple[Any, ...]) -> StoredFinding:
    fid, first_seen, last_seen, active, body = row
    finding = msgspec.json.decode(body, type=Finding)
    return StoredFinding(str(fid), finding, float(first_seen), float(last_seen), bool(active))


def list_findings(conn: Conn, node: str, include_resolved: bool, limit: int) -> list[StoredFinding]:
    sql = "SELECT id, first_seen, last_seen, active, body FROM findings WHERE 1 = 1"
    args: list[object] = []
    if node:
        sql += " AND node = ?"
        args.append(node)
    if not include_resolved:
        sql += " AND active = 1"
    sql += " ORDER BY last_seen DESC, id LIMIT ?"
    args.append(limit)
    return [stored(r) for r in conn.execute(sql, args)]


def load_history(conn: Conn, fleet: Fleet, nodes: Sequence[str] | None = None) -> None:
    """Each probe key's newest results (at most HISTORY_POINTS, oldest first) into fleet.history:
    every key's, or (`nodes`) those of these nodes, replacing what it held for them."""
    names = {name: name for name in fleet.nodes}  # the keys' strings shared, not one copy a row
    sql = "SELECT node, gpu, probe, variant, points FROM probe_series"
    chunks = [()] if nodes is None else [nodes[i : i + FILL_NODES] for i in range(0, len(nodes), FILL_NODES)]
    for chunk in chunks:
        where = f" WHERE node IN ({placeholders(chunk)})" if nodes is not None else ""
        # 730 MB of points at 12,500 nodes: each row made a Series as read, not all fetched first
        for node, gpu, probe, variant, points in stream(conn, sql + where, tuple(chunk)):
            key = (names.get(node, str(node)), None if gpu < 0 else int(gpu), intern(probe), intern(variant))
            fleet.history[key] = Series.from_bytes(bytes(points))


FILL_NODES = 200  # nodes whose history fill_series reads at a time: its memory stays bounded


def fill_series(conn: Conn) -> int:
    """probe_series from probe_history, once, in a store written before probe_series was (it is
    empty while probe_history is not): the newest HISTORY_POINTS results of each key; how many keys.
    probe_history is not written since; its rows age out through Store.prune_history (a controller
    of before, rolled back to, still finds them).
    Before it, every start read each key's history from probe_history (at 2,000 nodes with 64 probe
    rounds, 7.3 million rows: a start took 59 s)."""
    if conn.execute("SELECT 1 FROM probe_series LIMIT 1").fetchone() is not None:
        return 0
    names = [str(n) for (n,) in conn.execute("SELECT DISTINCT node FROM probe_history").fetchall()]
    filled = 0
    for start in range(0, len(names), FILL_NODES):
        chunk = tuple(names[start : start + FILL_NODES])
        rows = conn.execute(
            "SELECT node, gpu, probe, variant, time, value FROM ("
            " SELECT *, row_number() OVER (PARTITION BY node, gpu, probe, variant ORDER BY time DESC)"
            f" AS newest FROM probe_history WHERE node IN ({placeholders(chunk)})) AS h"
            " WHERE newest <= ? ORDER BY node, gpu, probe, variant, time",
            (*chunk, HISTORY_POINTS),
        ).fetchall()
        for node, results in groupby(rows, key=itemgetter(0)):
            filled += save_series(conn, str(node), list(results))
    return filled


def load(conn: Conn) -> tuple[Fleet, list[StoredFinding]]:
    """Every node as stored, with its probe history; the active findings."""
    fleet = load_nodes(conn, None)
    load_history(conn, fleet)
    return fleet, active_findings(conn)


def active_findings(conn: Conn) -> list[StoredFinding]:
    return list_findings(conn, "", False, 1_000_000)


def node_names(conn: Conn) -> set[str]:
    return {str(name) for (name,) in stream(conn, "SELECT name FROM nodes")}


def load_nodes(conn: Conn, names: Sequence[str] | None) -> Fleet:
    """The named nodes (None: all) as stored: Hellos, ack positions, latest readings and probe
    results (not their history, nor findings)."""
    return fetch_nodes(conn, names).fleet()
