"""Figures per step, the growth curve and the verdicts against issue 17's targets, as a document
(JSON-ready dicts) and as text. Figures only: nothing here asserts."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from controller_scale_load import disk_writer

# Issue 17's targets.
CPU_MS_PER_FRAME = 0.8
WRITTEN_KB_PER_FRAME = 20.0
ACK_P99_AT_2000_S = 0.25
ACK_P99_AT_12500_S = 1.0
PASS_AT_12500_S = 5.0
SCRAPE_AT_12500_S = 1.0
LIST_AT_12500_S = 1.0
STORM_P99_S = 5.0
FAILOVER_S = 30.0  # "a second replica takes over within 30 s"
FULL_FLEET = 12_500
# With PostgreSQL the store's writes are the server's, not the controller process's.
POSTGRES_STORAGE_NOTE = (
    "PostgreSQL: the server's WAL bytes (KB db/frame); the table and index pages it writes back come on top"
)
# A step saturates the controller when its p99 ack passes this, or it acks too few of the frames due.
SATURATED_P99_S = 5.0
MIN_ACKED_SHARE = 0.9


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100, nearest rank) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, math.ceil(q / 100.0 * len(ordered)) - 1)
    return ordered[rank]


def pass_max_bound(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The smallest histogram bound holding every detection pass between two scrapes (inf: beyond
    the last finite bound); None when no pass ran."""
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0.0) >= after[math.inf] - before.get(math.inf, 0.0) > 0:
            return bound
    return None


def saturation(step: dict[str, Any]) -> str | None:
    """Why the step shows a saturated controller, or None."""
    if step["connected"] < step["nodes"]:
        return f"only {step['connected']} of {step['nodes']} nodes connected"
    p99 = step["ack_p99_s"]
    if p99 is None or p99 > SATURATED_P99_S:
        return f"p99 ack {'none' if p99 is None else f'{p99:.2f} s'} (over {SATURATED_P99_S:.0f} s)"
    if step["frames_acked"] < MIN_ACKED_SHARE * step["frames_due"]:
        return (
            f"frames falling behind: {step['frames_acked']} acked of {step['frames_due']:.0f} due "
            f"(under {MIN_ACKED_SHARE:.0%})"
        )
    return None


def slope(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float] | None:
    """Least-squares line y = intercept + slope * x; None with fewer than two distinct xs."""
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return {"slope": b, "intercept": my - b * mx}


def growth(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Controller CPU (cores) and RSS (MB) fitted against thousands of nodes."""
    xs = [s["nodes"] / 1000.0 for s in steps]
    cpu = slope(xs, [s["cpu_cores"] for s in steps])
    rss = slope(xs, [s["rss_bytes"] / 1e6 for s in steps])
    projection: dict[str, float] = {}
    if cpu is not None and rss is not None:
        k = FULL_FLEET / 1000.0
        projection = {
            "cpu_cores": cpu["intercept"] + cpu["slope"] * k,
            "rss_mb": rss["intercept"] + rss["slope"] * k,
        }
    return {"cpu_cores_per_1000_nodes": cpu, "rss_mb_per_1000_nodes": rss, f"at_{FULL_FLEET}": projection}


def _verdict(
    target: str, value: float | None, limit: float, at: int | None, note: str = ""
) -> dict[str, Any]:
    verdict = "not measured" if value is None else "within" if value <= limit else "over"
    return {
        "target": target,
        "value": value,
        "limit": limit,
        "at_nodes": at,
        "verdict": verdict,
        "note": note,
    }


def _at_full_fleet(target: str, steps: Sequence[dict[str, Any]], key: str, limit: float) -> dict[str, Any]:
    """A one-host target for 12,500 nodes, judged on the largest step measured: within there only
    counts when that step had the full fleet (a smaller fleet that is already over is over)."""
    if not steps:
        return _verdict(target, None, limit, None)
    largest = max(steps, key=lambda s: s["nodes"])
    entry = _verdict(target, largest[key], limit, largest["nodes"])
    if largest["nodes"] < FULL_FLEET and entry["verdict"] == "within":
        entry["verdict"] = "not reached"
        entry["note"] = f"the largest step measured had {largest['nodes']} nodes"
    return entry


P99_AT_2000 = "p99 ack at 2,000 nodes (s)"
P99_AT_2000_NEIGHBOUR = "p99 ack at 2,000 nodes, another process writing to the same disk (s)"


def verdicts(
    steps: Sequence[dict[str, Any]],
    storm: dict[str, Any] | None,
    backend: str = "sqlite",
    *,
    disk_writer: bool = False,
    failover: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Each target's verdict. The storage target is judged on the controller's own writes with
    SQLite (the store is in its process), and on the server's WAL with PostgreSQL (`backend`).
    `disk_writer`: another process wrote to the store's disk meanwhile (the p99 target's second half)."""
    unsaturated = [s for s in steps if s["saturated"] is None] or list(steps)
    cpu = [s for s in unsaturated if s["cpu_ms_per_frame"] is not None]
    worst_cpu = max(cpu, key=lambda s: s["cpu_ms_per_frame"]) if cpu else None
    storage, storage_note = "written_kb_per_frame", ""
    if backend == "postgresql":
        storage, storage_note = "db_kb_per_frame", POSTGRES_STORAGE_NOTE
    written = [s for s in unsaturated if s[storage] is not None]
    worst_written = max(written, key=lambda s: s[storage]) if written else None
    at_2000 = next((s for s in steps if s["nodes"] == 2000), None)
    out = [
        _verdict(
            "controller CPU per frame (ms, worst unsaturated step)",
            worst_cpu["cpu_ms_per_frame"] if worst_cpu else None,
            CPU_MS_PER_FRAME,
            worst_cpu["nodes"] if worst_cpu else None,
        ),
        _verdict(
            "written to storage per frame (KB, worst unsaturated step)",
            worst_written[storage] if worst_written else None,
            WRITTEN_KB_PER_FRAME,
            worst_written["nodes"] if worst_written else None,
            storage_note,
        ),
        _verdict(
            P99_AT_2000_NEIGHBOUR if disk_writer else P99_AT_2000,
            at_2000["ack_p99_s"] if at_2000 else None,
            ACK_P99_AT_2000_S,
            2000 if at_2000 else None,
        ),
        _at_full_fleet("one host: p99 ack at 12,500 nodes (s)", steps, "ack_p99_s", ACK_P99_AT_12500_S),
        _at_full_fleet("one host: detection pass at 12,500 nodes (s)", steps, "pass_mean_s", PASS_AT_12500_S),
        _at_full_fleet("one host: /metrics scrape at 12,500 nodes (s)", steps, "scrape_s", SCRAPE_AT_12500_S),
        _at_full_fleet("one host: ListNodes at 12,500 nodes (s)", steps, "list_nodes_s", LIST_AT_12500_S),
    ]
    if storm is not None:
        out.append(
            _verdict(
                "reconnect storm: p99 ack of the first frames (s, from the drop)",
                storm["since_storm_p99_s"],
                STORM_P99_S,
                storm["nodes"],
            )
        )
    if failover is not None:
        out.append(
            _verdict(
                "failover: the standby leads and listens, the leader's agents' first frames are acked "
                "(p99 from the kill) and its own kept streams' frames (p99 from their send) (s)",
                takeover_seconds(failover),
                FAILOVER_S,
                failover["nodes"],
            )
        )
    return out


def takeover_seconds(failover: dict[str, Any]) -> float | None:
    """A failover's whole takeover: the latest of the heir listening as leader, the p99 of the
    moved nodes' first frames acked (from the kill) and the p99 of the kept streams' first frames'
    acks (from their send: a kept stream's next frame waits for its slot, up to --interval, which
    is no part of the takeover). None: it never listened, or a moved node never came back.
    A report from before the halves were told apart: the p99 of all first frames from the kill."""
    listening = failover["listening_s"]
    if "moved_p99_s" not in failover:
        back = failover["since_storm_p99_s"]
        return None if listening is None or back is None else max(listening, back)
    moved, kept = failover["moved_p99_s"], failover["kept_p99_s"]
    if listening is None or moved is None:
        return None
    return float(max(listening, moved, kept or 0.0))


# -- text ---------------------------------------------------------------------------------------

COLUMNS = (
    ("nodes", "nodes", "{:.0f}"),
    ("frames/s", "frames_per_second", "{:.1f}"),
    ("CPU cores", "cpu_cores", "{:.3f}"),
    ("/1k nodes", "cpu_cores_per_1000_nodes", "{:.3f}"),
    ("ms/frame", "cpu_ms_per_frame", "{:.2f}"),
    ("main ms/f", "main_ms_per_frame", "{:.2f}"),
    ("loop ms/f", "loop_ms_per_frame", "{:.2f}"),
    ("det ms/f", "detection_ms_per_frame", "{:.2f}"),
    ("fronts ms/f", "fronts_ms_per_frame", "{:.2f}"),
    ("standbys ms/f", "replicas_ms_per_frame", "{:.2f}"),
    ("ack p50", "ack_p50_s", "{:.3f}"),
    ("ack p99", "ack_p99_s", "{:.3f}"),
    ("pass s", "pass_mean_s", "{:.3f}"),
    ("scrape s", "scrape_s", "{:.3f}"),
    ("ListNodes s", "list_nodes_s", "{:.3f}"),
    ("RSS MB", "rss_mb", "{:.0f}"),
    ("KB wr/frame", "written_kb_per_frame", "{:.1f}"),
    ("KB db/frame", "db_kb_per_frame", "{:.1f}"),
    ("gen CPU", "generator_cpu_cores", "{:.2f}"),
)


def cell(value: Any, form: str) -> str:
    return "n/a" if value is None else form.format(value)


def table(steps: Sequence[dict[str, Any]]) -> list[str]:
    rows = [[title for title, _, _ in COLUMNS]]
    rows += [[cell(s[key], form) for _, key, form in COLUMNS] for s in steps]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]


def _fit(line: dict[str, float] | None, unit: str) -> str:
    if line is None:
        return "n/a (one step)"
    return f"{line['slope']:+.3f} {unit} per 1,000 nodes (intercept {line['intercept']:.3f})"


def store_line(store: dict[str, Any] | None) -> str:
    """What the storage columns mean for the store the run used (reports from before --db: SQLite)."""
    if store is None or store["backend"] == "sqlite":
        return (
            "store: SQLite, a file in the run directory (its growth, WAL included, as KB db/frame; "
            "the controller's own writes as KB wr/frame)"
        )
    return (
        f"store: PostgreSQL {store['db']} (WAL bytes of the server as KB db/frame: the whole server's, "
        "every database's, so a server of its own; the controller's own writes as KB wr/frame, "
        "which are not the store's)"
    )


def failover_lines(failover: dict[str, Any] | None) -> list[str]:
    if failover is None:
        return []
    f = failover
    return [
        "",
        f"failover at {f['nodes']} nodes (the leader killed, its agents sent to the standby): "
        f"{f['recovered']} back in {f['seconds']:.1f} s; first frame acked from the kill p50/p99 "
        f"{cell(f['since_storm_p50_s'], '{:.2f}')}/{cell(f['since_storm_p99_s'], '{:.2f}')} s",
        "  back: "
        + ", ".join(
            f"{w['back']} of {w['nodes']} ({'the leader' if w['leader'] else 'the standby'}'s worker)"
            for w in f.get("by_worker", [])
        ),
        f"  came back on new streams (the leader's agents): first frame acked from the kill p50/p99 "
        f"{cell(f.get('moved_p50_s'), '{:.2f}')}/{cell(f.get('moved_p99_s'), '{:.2f}')} s; "
        f"streams kept through it (the standby's): their next frame's ack p50/p99 "
        f"{cell(f.get('kept_p50_s'), '{:.2f}')}/{cell(f.get('kept_p99_s'), '{:.2f}')} s from its send",
        f"  the standby, from the kill: leading {cell(f['lead_s'], '{:.2f}')} s, caught up "
        f"{cell(f['caught_up_s'], '{:.2f}')} s, listening as leader {cell(f['listening_s'], '{:.2f}')} s, "
        f"its detection process given the fleet {cell(f.get('detecting_s'), '{:.2f}')} s",
        f"  reconnect p50/p99 {cell(f['reconnect_p50_s'], '{:.2f}')}/"
        f"{cell(f['reconnect_p99_s'], '{:.2f}')} s; "
        f"the standby used {cell(f['heir_cores'], '{:.2f}')} cores "
        f"({cell(f['heir_ms_per_node'], '{:.1f}')} ms of CPU per node back), the load generator "
        f"{cell(f['generator_cores'], '{:.2f}')} cores; attempts that failed before a node was back: "
        + (", ".join(f"{n} x {kind}" for kind, n in f["failed_attempts"]) or "none"),
    ]


def storm_lines(storm: dict[str, Any] | None, server: str = "the controller") -> list[str]:
    """A reconnect storm's report (`server`: who the fleet reconnected to)."""
    if storm is None:
        return []
    against = "" if server == "the controller" else f" against {server}"
    return [
        "",
        f"reconnect storm at {storm['nodes']} nodes{against}: {storm['recovered']} recovered in "
        f"{storm['seconds']:.1f} s; reconnect p50/p99 {cell(storm['reconnect_p50_s'], '{:.2f}')}/"
        f"{cell(storm['reconnect_p99_s'], '{:.2f}')} s; first frame ack p50/p99 "
        f"{cell(storm['first_ack_p50_s'], '{:.2f}')}/{cell(storm['first_ack_p99_s'], '{:.2f}')} s "
        f"(from the drop: {cell(storm['since_storm_p50_s'], '{:.2f}')}/"
        f"{cell(storm['since_storm_p99_s'], '{:.2f}')} s)",
        f"  during it {server} used {cell(storm.get('controller_cores'), '{:.2f}')} cores "
        f"({cell(storm.get('controller_ms_per_node'), '{:.1f}')} ms of CPU per node reconnected), "
        f"the load generator {cell(storm.get('generator_cores'), '{:.2f}')} cores",
        f"  of which on {server}'s event-loop thread {cell(storm.get('loop_cores'), '{:.2f}')} cores "
        f"({cell(storm.get('loop_ms_per_node'), '{:.1f}')} ms per node reconnected; one core at most), "
        f"garbage collection {cell(storm.get('gc_seconds'), '{:.2f}')} s of it "
        f"({cell(storm.get('gc_loop_share'), '{:.0%}')})",
        f"  the generator's processes had cancelled every old stream "
        f"{cell(storm.get('dropped_s'), '{:.2f}')} s after the drop began; attempts that failed "
        "before a node was back: "
        + (", ".join(f"{n} x {kind}" for kind, n in storm.get("failed_attempts", [])) or "none"),
        # Beside reconnect (from the drop): the answer alone, without the backoff of failed tries.
        f"  the attempt that got a node back waited p50/p99 {cell(storm.get('answer_p50_s'), '{:.2f}')}/"
        f"{cell(storm.get('answer_p99_s'), '{:.2f}')} s for {server} to accept its Hello",
        open_files_line(storm, server),
    ]


def open_files_line(storm: dict[str, Any], server: str) -> str:
    """Whether the storm ran into the server's open-file limit (its old and new connections together)."""
    limit = storm.get("open_files_limit")
    soft = "n/a" if not limit else f"{limit[0]} (hard {limit[1]})"
    times = storm.get("out_of_files", 0)
    found = "did not run out"
    if times:
        found = f"ran out of them {times} times (gRPC: 'File descriptor limit reached')"
    return f"  open files: {server}'s soft limit {soft}; it {found}"


def floor_lines(floor: dict[str, Any] | None, steps: Sequence[dict[str, Any]]) -> list[str]:
    """The transport's floor beside the controller's last step at the same load."""
    if floor is None:
        return []
    at = next((s for s in steps if s["nodes"] == floor["nodes"]), None)
    mine, own = floor["cpu_ms_per_frame"], None
    if at is not None and mine is not None and at["cpu_ms_per_frame"] is not None:
        own = at["cpu_ms_per_frame"] - mine
    return [
        "",
        f"transport floor at {floor['nodes']} nodes (the same load against a bare gRPC server that only "
        f"acks): {cell(mine, '{:.2f}')} ms of CPU per frame ({floor['cpu_cores']:.3f} cores, "
        f"{floor['frames_per_second']:.1f} frames/s, ack p99 {cell(floor['ack_p99_s'], '{:.3f}')} s, "
        f"stream errors {floor['errors']}); the controller's own work above it: "
        f"{cell(own, '{:.2f}')} ms per frame",
        f"  of which on the event loop's thread: the bare server "
        f"{cell(floor.get('loop_ms_per_frame'), '{:.2f}')} ms per frame, the controller "
        f"{cell(at.get('loop_ms_per_frame') if at else None, '{:.2f}')}",
        *storm_lines(floor.get("storm"), "the bare server"),
    ]


def text(document: dict[str, Any]) -> str:
    meta, steps, settings = document["machine"], document["steps"], document["settings"]
    lines = [
        f"controller_scale: {meta['cores']} cores ({meta['cpu']}); the load generator's "
        f"{document['settings']['workers']} processes share them (the controller's CPU and RSS: its "
        "process and its children, the detection process's included)",
        f"frames: {meta['frame_bytes']:.0f} bytes each on average ({meta['first_frame_bytes']} for a node's "
        f"first, with its probe round; {document['settings'].get('cpus', 32)} logical CPUs a host"
        f"{', each CPU read in each frame' if settings.get('per_cpu') else ''}"
        f"{', each NVLink with its traffic and peer' if settings.get('per_link') else ''}), one per "
        f"node every {document['settings']['interval']:g} s; "
        f"hold {document['settings']['hold']:g} s per step",
        store_line(document.get("store")),
        "",
        *table(steps),
        "",
    ]
    for s in steps:
        extra = (
            f"  {s['nodes']} nodes: {s['frames_acked']} frames acked of {s['frames_due']:.0f} due, "
            f"{'the leader' if document['settings'].get('replicas', 1) > 1 else 'controller'} counted "
            f"{s['controller_frames_per_second']:.1f}/s, send lag p99 "
            f"{cell(s['send_lag_p99_s'], '{:.3f}')} s, max ack {cell(s['ack_max_s'], '{:.3f}')} s, "
            f"{s['detection_passes']} passes (slowest <= {cell(s['pass_max_bound_s'], '{:g}')} s), "
            f"ListNodes {s['list_nodes_count']} nodes in {s['list_nodes_pages']} pages, scrape "
            f"{s['scrape_bytes'] / 1e6:.1f} MB / {s['scrape_series']} series, {s['findings']:.0f} findings, "
            f"stream errors {s['errors']}, garbage collection "
            f"{cell(s.get('gc_cores'), '{:.3f}')} cores (longest pause since start "
            f"{cell(s.get('gc_longest_pause_s'), '{:.3f}')} s)"
        )
        lines.append(extra)
        if s["saturated"]:
            lines.append(f"  -> saturated at {s['nodes']} nodes: {s['saturated']}")
    curve = document["growth"]
    lines += [
        "",
        "growth curve (least squares over the steps):",
        f"  controller CPU: {_fit(curve['cpu_cores_per_1000_nodes'], 'cores')}",
        f"  controller RSS: {_fit(curve['rss_mb_per_1000_nodes'], 'MB')}",
    ]
    projected = curve[f"at_{FULL_FLEET}"]
    if projected:
        lines.append(
            f"  projected at {FULL_FLEET} nodes: {projected['cpu_cores']:.2f} cores, "
            f"{projected['rss_mb']:.0f} MB"
        )
    lines += storm_lines(document["storm"])
    lines += failover_lines(document.get("failover"))
    lines += floor_lines(document.get("floor"), steps)
    lines += disk_writer.line(document.get("disk_writer"))
    if document["stopped_early"]:
        lines += ["", f"stopped early: {document['stopped_early']}"]
    lines += ["", "verdicts:"]
    for v in document["verdicts"]:
        value = cell(v["value"], "{:.3f}")
        at = f" at {v['at_nodes']} nodes" if v["at_nodes"] else ""
        note = f" ({v['note']})" if v["note"] else ""
        lines.append(f"  {v['verdict']:>12}: {v['target']}: {value}{at}, limit {v['limit']:g}{note}")
    return "\n".join(lines)


def print_row(row: Mapping[str, Any], *, as_json: bool, width: int, digits: int) -> None:
    """A bench's one row: as JSON, or its names over its values in columns `width` wide."""
    if as_json:
        print(json.dumps(row))
        return
    print("  ".join(f"{name:>{width}}" for name in row))
    cells = (f"{v:>{width}.{digits}f}" if isinstance(v, float) else f"{v:>{width}}" for v in row.values())
    print("  ".join(cells))
