"""The node tables: Hellos, ack positions, the latest GPU/host/BMC readings, probe results and their
history, findings; and loading them all into a Fleet at start. Portable SQL (controller/store/sql.py):
the same statements run on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec

from controller.fleet.finding import Finding
from controller.fleet.findings import StoredFinding
from controller.fleet.model import HISTORY_POINTS, Fleet, FrameWrite, GpuState, NodeState, ProbeRecord
from controller.store.sql import Conn, placeholders, upsert
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb


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


def save_frame(conn: Conn, w: FrameWrite) -> None:
    """The frame's ack position and probe results always; its latest readings when w.state says so
    (Ingest writes a node's readings at most every db_state_seconds: the next frame replaces them)."""
    conn.execute(
        "INSERT INTO boots (node, boot_id, acked_seq, updated) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (node, boot_id) DO UPDATE SET acked_seq = excluded.acked_seq, updated = "
        "CASE WHEN excluded.updated > boots.updated THEN excluded.updated ELSE boots.updated END",
        (w.node, w.boot_id, w.seq, w.time),
    )
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
        [(*row, p.unit, p.result.SerializeToString()) for row, p in zip(rows, w.probes, strict=True)],
    )
    conn.executemany(
        "INSERT INTO probe_history (node, gpu, probe, variant, time, value) VALUES (?, ?, ?, ?, ?, ?)", rows
    )


def save_latest(
    conn: Conn,
    node: str,
    gpus: Sequence[GpuState],
    host: pb.HostSample | None,
    host_time: float,
) -> None:
    """A node's latest GPU and host readings (nodes.last_seen is not touched: boots.updated says when
    its newest frame was, and load() takes the later of the two)."""
    conn.executemany(
        upsert("gpu_state", "node, gpu, time, sample, held", "node, gpu"),
        [(node, g.index, g.time, g.sample.SerializeToString(), json.dumps(g.held)) for g in gpus],
    )
    if host is not None:
        conn.execute(
            upsert("host_state", "node, time, sample", "node"),
            (node, host_time, host.SerializeToString()),
        )


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


def load_history(conn: Conn, fleet: Fleet) -> None:
    """The newest HISTORY_POINTS results of each probe key into fleet.history, oldest first (one query)."""
    rows = conn.execute(
        "SELECT node, gpu, probe, variant, time, value FROM ("
        " SELECT *, row_number() OVER (PARTITION BY node, gpu, probe, variant ORDER BY time DESC) AS newest"
        " FROM probe_history) AS h WHERE newest <= ? ORDER BY node, gpu, probe, variant, time",
        (HISTORY_POINTS,),
    )
    for node, gpu, probe, variant, time, value in rows:
        key = (node, None if gpu < 0 else gpu, probe, variant)
        series = fleet.history.get(key)
        if series is None:
            series = fleet.history[key] = deque(maxlen=HISTORY_POINTS)
        series.append((time, value))


def load(conn: Conn) -> tuple[Fleet, list[StoredFinding]]:
    fleet = load_nodes(conn, None)
    load_history(conn, fleet)
    active = list_findings(conn, "", False, 1_000_000)
    return fleet, active


NAMES_PER_QUERY = 500  # nodes named in one IN (...) list


def load_nodes(conn: Conn, names: Sequence[str] | None) -> Fleet:
    """The named nodes (None: all) as stored: Hellos, ack positions, latest readings and probe
    results (not their history, nor findings)."""
    fleet = Fleet()
    if names is None:
        _load_into(fleet, conn, "", ())
    for start in range(0, 0 if names is None else len(names), NAMES_PER_QUERY):
        chunk = tuple(names[start : start + NAMES_PER_QUERY]) if names is not None else ()
        _load_into(fleet, conn, f" WHERE {{}} IN ({placeholders(chunk)})", chunk)
    return fleet


def _load_into(fleet: Fleet, conn: Conn, where: str, args: tuple[str, ...]) -> None:
    """The rows `where` selects (formatted with each table's node column), into fleet."""
    nodes = fleet.nodes
    for name, hello_bytes, first_seen, last_seen in conn.execute(
        "SELECT name, hello, first_seen, last_seen FROM nodes" + where.format("name"), args
    ):
        nodes[name] = NodeState(name, pb.Hello.FromString(hello_bytes), first_seen, last_seen)
    node_where = where.format("node")
    for node, boot_id, acked, updated in conn.execute(
        "SELECT node, boot_id, acked_seq, updated FROM boots" + node_where, args
    ):
        fleet.acked[(node, boot_id)] = int(acked)
        if node in nodes:  # a frame's time moves boots.updated, not nodes.last_seen
            nodes[node].last_seen = max(nodes[node].last_seen, updated)
    for node, gpu, time, sample, held in conn.execute(
        "SELECT node, gpu, time, sample, held FROM gpu_state" + node_where, args
    ):
        if node in nodes:
            nodes[node].gpus[gpu] = GpuState(gpu, pb.GpuSample.FromString(sample), time, json.loads(held))
    for node, time, sample in conn.execute("SELECT node, time, sample FROM host_state" + node_where, args):
        if node in nodes:
            nodes[node].host = pb.HostSample.FromString(sample)
            nodes[node].host_time = time
    for node, time, sample in conn.execute("SELECT node, time, sample FROM bmc_state" + node_where, args):
        if node in nodes:
            nodes[node].bmc = bmc_pb2.BmcSample.FromString(sample)
            nodes[node].bmc_time = time
    for node, gpu, probe, variant, time, value, unit, result in conn.execute(
        "SELECT node, gpu, probe, variant, time, value, unit, result FROM probe_results" + node_where, args
    ):
        record = ProbeRecord(
            node,
            None if gpu < 0 else gpu,
            probe,
            variant,
            value,
            unit,
            time,
            pb.ProbeResult.FromString(result),
        )
        fleet.probes[record.key] = record
