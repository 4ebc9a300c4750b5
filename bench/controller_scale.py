"""How one controller process scales with the fleet: simulated agents over real gRPC streams.

Starts one real controller (`python -m controller controller`, plaintext on loopback, an SQLite
file in a temporary directory, or the PostgreSQL database --db names) and a load generator of K
worker processes, each an asyncio loop holding one real gRPC stream (and by default one connection)
per simulated node: a Hello, then a frame every --interval seconds (10, the agent's default) as the
agent sends it (8 H100 GPUs, host readings, the BMC every 60 s, a probe round in the first frame),
phases spread over the interval. The fleet grows in --steps; each step is held --hold seconds once
all its nodes are connected, and per step the bench prints: frames/s acked, the controller's CPU
(cores, per 1,000 nodes, per frame; psutil on its pid), p50/p99 ack latency (a frame's send to its
ack), the detection pass time (the controller's /metrics), one /metrics scrape and one full
ListNodes (every page) at the end of the step, the controller's RSS, the bytes it wrote to storage
per frame and the store's growth per frame. Then the growth curve and verdicts against issue 17's
targets. It stops at a step that saturates the controller. Figures only: it asserts nothing
(tests/bench/test_controller_scale.py runs a small step of it).

    .venv/bin/python bench/controller_scale.py [--steps 1000,2000,4000,8000,12500] [--hold 60]
        [--workers 2] [--interval 10] [--reconnect-storm] [--transport-floor] [--json] [--dir DIR]
        [--db postgresql://USER:PASSWORD@HOST:PORT/DATABASE]

The generator runs on the same machine: it shares the cores with the controller (the controller's
CPU and RSS are its process's and its children's, the detection process's included; the
generator's are shown beside them). `--detect-in-loop` runs the detectors on the controller's
event loop instead (detect.process: false). `--transport-floor` then runs the last step's load
against a bare gRPC server that only acks (controller_scale_load/floor.py): its CPU per frame is
what the transport alone costs, and the report shows the controller's own work above it. Progress
goes to stderr.

With --db the controller's store is that PostgreSQL database (best a fresh one), and "KB db/frame"
is the WAL the server generated per frame acked: the whole server's WAL, every database's, so give
the bench a server of its own. "KB wr/frame" stays the controller process's own writes
(/proc/PID/io), which on PostgreSQL are not the store's. The URL is only ever shown with its
password redacted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controller_scale_load import report, storms, target
from controller_scale_load.disk_writer import DiskWriter
from controller_scale_load.fleet import Fleet
from controller_scale_load.templates import SIM_CPUS, add_older_agent_options, build_archetype, frame_message
from controller_scale_load.worker import WorkerSpec

from controller.config import ControllerConfig, check_db
from controller.db_url import is_postgres_url, redact_url
from controller.event_loop import CHOICES

DEFAULT_STEPS = "1000,2000,4000,8000,12500"


def progress(message: str) -> None:
    print(f"[controller_scale] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", default=DEFAULT_STEPS, help="fleet sizes, comma separated, ascending")
    parser.add_argument("--hold", type=float, default=60.0, help="seconds each step is measured")
    parser.add_argument("--workers", type=int, default=2, help="load generator processes")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between a node's frames")
    parser.add_argument(
        "--ramp",
        type=float,
        default=None,
        help="seconds over which a step's new nodes connect (default: --interval)",
    )
    parser.add_argument(
        "--archetypes", type=int, default=16, help="simulated nodes the others borrow frames from"
    )
    parser.add_argument(
        "--cpus",
        type=int,
        default=SIM_CPUS,
        help=f"logical CPUs each simulated host has, counted per governor in its frames (default "
        f"{SIM_CPUS}; a DGX H100 has 224)",
    )
    add_older_agent_options(parser)
    parser.add_argument(
        "--shared-connection",
        action="store_true",
        help="one connection per worker for all its streams (default: one per node, as real agents)",
    )
    parser.add_argument(
        "--detect-interval",
        type=float,
        default=None,
        help="the controller's detect.interval_seconds (default 10)",
    )
    parser.add_argument(
        "--disable-detector",
        action="append",
        default=[],
        metavar="NAME",
        help="turn one of the controller's detectors off (repeatable), to see what else limits",
    )
    parser.add_argument(
        "--detect-in-loop",
        action="store_true",
        help="the detectors on the controller's event loop (detect.process: false), not in their process",
    )
    parser.add_argument(
        "--listeners",
        type=int,
        default=ControllerConfig().listeners,
        metavar="N",
        help="the controller's listeners: N gRPC servers share the agents' port (the floor gets as many)",
    )
    parser.add_argument(
        "--event-loop",
        choices=CHOICES,
        default="auto",
        help="the controller's event_loop (and the floor's): auto is uvloop where installed",
    )
    parser.add_argument(
        "--ingest-fronts",
        type=int,
        default=0,
        metavar="N",
        help="the controller's ingest_fronts: N processes serve the agents' port and relay to it",
    )
    parser.add_argument(
        "--detect-processes",
        type=int,
        default=1,
        metavar="K",
        help="the controller's detect.processes: K detection processes share out each pass's detectors",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="K",
        help=(
            "K controllers on the store with replica_ingest: the leader and K-1 standbys that ingest "
            "too; the generator's workers spread over them (worker i to replica i mod K)"
        ),
    )
    parser.add_argument(
        "--replica-sync",
        type=float,
        default=None,
        metavar="S",
        help="with --replicas: replica_sync_seconds, how often the leader takes in (default: --interval)",
    )
    parser.add_argument(
        "--reconnect-storm",
        action="store_true",
        help="at the last step, drop every stream and reconnect all at once",
    )
    parser.add_argument(
        "--failover",
        action="store_true",
        help=(
            "with --replicas 2, at the last step (after any storm): kill the leader; its agents go to "
            "the standby, which takes the lead (every node comes back to it)"
        ),
    )
    parser.add_argument(
        "--transport-floor",
        action="store_true",
        help=(
            "then the same load at the last step against a bare gRPC server that only acks "
            "(controller_scale_load/floor.py): the transport's CPU per frame, below any ingest work"
        ),
    )
    parser.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help=(
            "the controller's store: a postgresql://USER:PASSWORD@HOST:PORT/DATABASE URL, best a fresh "
            "database on a server of its own (default: an SQLite file in the run directory)"
        ),
    )
    parser.add_argument(
        "--disk-writer",
        type=float,
        default=None,
        metavar="MB_PER_S",
        help=(
            "meanwhile another process writes to the store's disk (the run directory) at this rate, "
            "syncing every 8 MiB; 0: as fast as the disk takes (controller_scale_load/disk_writer.py)"
        ),
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--dir", help="keep the controller's database, config and log here (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    _check(parser, args)
    return args


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse settings that cannot run (parser.error: exits); fill in the defaults that follow others."""
    try:
        args.step_sizes = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        parser.error("--steps must be integers, comma separated")
    if (
        not args.step_sizes
        or any(n < 1 for n in args.step_sizes)
        or args.step_sizes != sorted(args.step_sizes)
    ):
        parser.error("--steps must be ascending fleet sizes >= 1")
    if args.hold <= 0 or args.interval <= 0 or args.workers < 1 or args.archetypes < 1 or args.cpus < 1:
        parser.error("--hold and --interval must be > 0, --workers, --archetypes and --cpus >= 1")
    if not 1 <= args.replicas <= 8 or args.workers < args.replicas:
        parser.error("--replicas must be 1..8, with at least as many --workers")
    if args.failover and (args.replicas != 2 or args.shared_connection):
        parser.error("--failover needs --replicas 2 (and each node's own connection: no --shared-connection)")
    if args.disk_writer is not None and args.disk_writer < 0:
        parser.error("--disk-writer must be >= 0 MB/s (0: as fast as the disk takes)")
    if args.ramp is None:
        args.ramp = args.interval
    if args.replica_sync is None:  # the standbys write their readings at the frames' pace
        args.replica_sync = min(300.0, max(1.0, args.interval))
    if not 1 <= args.replica_sync <= 300:
        parser.error("--replica-sync must be 1..300 seconds")
    if args.db is not None:
        if not is_postgres_url(args.db):
            parser.error(f"--db {redact_url(args.db)}: give a postgresql:// URL (SQLite is the default)")
        try:
            check_db(args.db)
        except ValueError as error:
            parser.error(f"--{error}")


def store(args: argparse.Namespace) -> dict[str, Any]:
    """The store the controller runs on, for the report: never the URL's password."""
    if args.db is None:
        return {"backend": "sqlite", "db": None}
    return {"backend": "postgresql", "db": redact_url(args.db)}


def machine(args: argparse.Namespace) -> dict[str, Any]:
    """The machine and the frames sent."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    archetype = build_archetype(
        0,
        args.seed,
        time.time() - 100 * args.interval,
        args.interval,
        args.cpus,
        per_cpu=args.per_cpu,
        per_link=args.per_link,
    )
    now = time.time()
    sizes = [len(frame_message(archetype, "n", "b", seq=seq, floor=seq, now=now)) for seq in range(2, 8)]
    first = len(frame_message(archetype, "n", "b", seq=1, floor=1, now=now))
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "frame_bytes": statistics.mean(sizes),
        "first_frame_bytes": first,
    }


def wait_connected(fleet: Fleet, nodes: int, timeout: float) -> dict[str, Any]:
    """Poll the workers until all `nodes` are connected or `timeout` passes; the summed status."""
    deadline, last_said = time.monotonic() + timeout, 0.0
    while True:
        answers = fleet.ask("status")
        connected = sum(a["connected"] for a in answers)
        errors = sum(a["errors"] for a in answers)
        if connected >= nodes or time.monotonic() > deadline:
            kinds: collections.Counter[str] = collections.Counter()
            for answer in answers:
                kinds.update(answer.get("error_kinds", {}))
            return {
                "connected": connected,
                "errors": errors,
                "last_error": _last_error(answers),
                "error_kinds": kinds.most_common(),
            }
        if time.monotonic() - last_said > 5.0:
            progress(f"{nodes} nodes: {connected} connected, {errors} stream errors")
            last_said = time.monotonic()
        time.sleep(0.5)


def _last_error(answers: list[dict[str, Any]]) -> str:
    return next((a["last_error"] for a in answers if a.get("last_error")), "")


def step_figures(
    nodes: int,
    args: argparse.Namespace,
    *,
    before: target.Sample,
    after: target.Sample,
    windows: list[dict[str, Any]],
    generator_cpu: float,
) -> dict[str, Any]:
    """The step's figures from the controller's samples and the workers' windows."""
    seconds = after.time - before.time
    latencies = [x for w in windows for x in w["latencies"]]
    lags = [x for w in windows for x in w["lags"]]
    acked = sum(w["acked"] for w in windows)
    cpu = after.cpu_seconds - before.cpu_seconds
    main = after.main_cpu_seconds - before.main_cpu_seconds
    loop = after.loop_cpu_seconds - before.loop_cpu_seconds
    detection = after.detection_cpu_seconds - before.detection_cpu_seconds
    fronts = after.fronts_cpu_seconds - before.fronts_cpu_seconds
    replicas = after.replicas_cpu_seconds - before.replicas_cpu_seconds
    written = after.write_bytes - before.write_bytes if before.write_bytes >= 0 else None
    return {
        "nodes": nodes,
        "connected": sum(w["connected"] for w in windows),
        "hold_seconds": seconds,
        "frames_sent": sum(w["sent"] for w in windows),
        "frames_acked": acked,
        "frames_due": nodes * seconds / args.interval,
        "frames_per_second": acked / seconds,
        "outstanding": sum(w["outstanding"] for w in windows),
        "errors": sum(w["window_errors"] for w in windows),
        "commands": sum(w["commands"] for w in windows),
        "cpu_cores": cpu / seconds,
        "cpu_cores_per_1000_nodes": cpu / seconds / nodes * 1000.0,
        "cpu_ms_per_frame": cpu / acked * 1e3 if acked else None,
        "main_cpu_cores": main / seconds,
        "main_ms_per_frame": main / acked * 1e3 if acked else None,
        "loop_ms_per_frame": loop / acked * 1e3 if acked else None,
        "detection_ms_per_frame": detection / acked * 1e3 if acked else None,
        "fronts_ms_per_frame": fronts / acked * 1e3 if acked else None,
        "replicas_ms_per_frame": replicas / acked * 1e3 if acked else None,
        "ack_p50_s": report.percentile(latencies, 50),
        "ack_p99_s": report.percentile(latencies, 99),
        "ack_max_s": max(latencies) if latencies else None,
        "send_lag_p99_s": report.percentile(lags, 99),
        "rss_bytes": after.rss_bytes,
        "rss_mb": after.rss_bytes / 1e6,
        "written_kb_per_frame": written / acked / 1e3 if written is not None and acked else None,
        "db_bytes": after.db_bytes,
        "db_kb_per_frame": (after.db_bytes - before.db_bytes) / acked / 1e3 if acked else None,
        "generator_cpu_cores": generator_cpu / seconds,
    }


def measure_step(
    controller: target.Controller, fleet: Fleet, nodes: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Grow the fleet to `nodes`, let it settle, hold it for --hold seconds; the step's figures."""
    progress(f"{nodes} nodes: connecting (over {args.ramp:g} s)")
    fleet.ask("grow", nodes)
    status = wait_connected(fleet, nodes, timeout=max(60.0, 2 * args.ramp + nodes / 50.0))
    if status["connected"] < nodes:
        progress(f"{nodes} nodes: only {status['connected']} connected ({status['last_error']})")
    if status["errors"]:
        kinds = "; ".join(f"{count} x {kind}" for kind, count in status["error_kinds"][:5])
        progress(f"{nodes} nodes: {status['errors']} stream errors so far, by kind: {kinds}")
    time.sleep(1.2 * args.interval)  # every new node's first frame (with its probe round) is in
    fleet.ask("window")  # the measurements so far are left out
    first = target.scrape(controller)
    before, generator = target.sample(controller), fleet.cpu_seconds()
    progress(f"{nodes} nodes: holding {args.hold:g} s")
    time.sleep(args.hold)
    after, generator = target.sample(controller), fleet.cpu_seconds() - generator
    windows = fleet.ask("window")
    last = target.scrape(controller)
    list_seconds, listed, pages = target.list_nodes(controller)
    step = step_figures(nodes, args, before=before, after=after, windows=windows, generator_cpu=generator)
    passes = last.pass_count - first.pass_count
    step.update(
        {
            "detection_passes": int(passes),
            "pass_mean_s": (last.pass_sum - first.pass_sum) / passes if passes else _overall_pass(last),
            "pass_max_bound_s": report.pass_max_bound(first.pass_buckets, last.pass_buckets),
            "controller_frames_per_second": (last.frames - first.frames) / (after.time - before.time),
            "scrape_s": last.seconds,
            "scrape_bytes": last.size,
            "scrape_series": last.series,
            "list_nodes_s": list_seconds,
            "list_nodes_count": listed,
            "list_nodes_pages": pages,
            "findings": last.findings,
            "gc_cores": (last.gc_seconds - first.gc_seconds) / (after.time - before.time),
            "gc_longest_pause_s": last.gc_longest,
        }
    )
    step["saturated"] = report.saturation(step)
    return step


def _overall_pass(scrape: target.Scrape) -> float | None:
    """No pass within the hold: the mean of every pass so far."""
    return scrape.pass_sum / scrape.pass_count if scrape.pass_count else None


def transport_floor(nodes: int, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """The same load of `nodes` against floor.py (a server that only acks), held --hold seconds: its
    CPU per frame is what gRPC's asyncio server spends receiving a frame and sending its ack."""
    progress(f"transport floor: {nodes} nodes against a bare gRPC server that only acks")
    floor = target.start_floor(directory, args.listeners, args.event_loop)
    fleet: Fleet | None = None
    try:
        fleet = Fleet([_spec(i, args, floor.address) for i in range(args.workers)])
        fleet.ask("grow", nodes)
        status = wait_connected(fleet, nodes, timeout=max(60.0, 2 * args.ramp + nodes / 50.0))
        if status["connected"] < nodes:
            progress(f"transport floor: only {status['connected']} connected ({status['last_error']})")
        time.sleep(1.2 * args.interval)
        fleet.ask("window")
        before, generator = target.sample(floor), fleet.cpu_seconds()
        time.sleep(args.hold)
        after, generator = target.sample(floor), fleet.cpu_seconds() - generator
        windows = fleet.ask("window")
        # The same storm against it: how long the transport and the generator alone take to bring the
        # fleet back on this machine, below any Hello the controller handles.
        storm = storms.reconnect_storm(fleet, nodes, floor, progress) if args.reconnect_storm else None
    finally:
        if fleet is not None:
            fleet.stop()
        target.stop(floor.process)
    figures = step_figures(nodes, args, before=before, after=after, windows=windows, generator_cpu=generator)
    figures["storm"] = storm
    progress(f"transport floor: {_summary(figures)}")
    return figures


def run(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """Every step (until one saturates) and the optional storm; the report's document."""
    document: dict[str, Any] = {
        "bench": "controller_scale",
        "machine": machine(args),
        "settings": {
            key: getattr(args, key)
            for key in (
                "step_sizes",
                "hold",
                "workers",
                "interval",
                "ramp",
                "archetypes",
                "cpus",
                "per_cpu",
                "per_link",
                "shared_connection",
                "disable_detector",
                "detect_in_loop",
                "ingest_fronts",
                "listeners",
                "event_loop",
                "detect_processes",
                "replicas",
                "replica_sync",
                "disk_writer",
            )
        },
        "store": store(args),
        "steps": [],
        "storm": None,
        "failover": None,
        "floor": None,
        "disk_writer": None,
        "stopped_early": None,
    }
    progress(f"{os.cpu_count()} cores, shared by the controller and {args.workers} generator processes")
    if args.db is not None:
        progress(f"store: PostgreSQL {document['store']['db']}")
    controller = target.start(
        directory,
        max(args.step_sizes),
        args.detect_interval,
        args.disable_detector,
        args.db,
        detect_in_loop=args.detect_in_loop,
        fronts=args.ingest_fronts,
        detect_processes=args.detect_processes,
        replicas=args.replicas,
        replica_sync_seconds=args.replica_sync,
        listeners=args.listeners,
        event_loop=args.event_loop,
    )
    fleet: Fleet | None = None
    neighbour: DiskWriter | None = None
    try:
        if args.disk_writer is not None:
            neighbour = DiskWriter(directory, args.disk_writer)
            progress(f"another process writes to {directory} (the store's disk) from now")
        addresses = [controller.address, *controller.standby_addresses]
        specs = [_spec(i, args, addresses[i % len(addresses)]) for i in range(args.workers)]
        fleet = Fleet(specs)
        for nodes in args.step_sizes:
            step = measure_step(controller, fleet, nodes, args)
            document["steps"].append(step)
            progress(_summary(step))
            if step["saturated"]:
                document["stopped_early"] = f"the controller saturated at {nodes} nodes: {step['saturated']}"
                break
        if args.reconnect_storm and document["steps"]:
            nodes = document["steps"][-1]["nodes"]
            document["storm"] = storms.reconnect_storm(fleet, nodes, controller, progress)
        if args.failover and document["steps"]:
            targets = [spec.target for spec in specs]
            nodes = document["steps"][-1]["nodes"]
            document["failover"] = storms.failover(fleet, nodes, controller, targets, progress)
    finally:
        if neighbour is not None:
            document["disk_writer"] = neighbour.stop()
        if fleet is not None:
            fleet.stop()
        target.stop_all(controller)
    if args.transport_floor and document["steps"]:
        document["floor"] = transport_floor(document["steps"][-1]["nodes"], args, directory)
    document["growth"] = report.growth(document["steps"])
    document["verdicts"] = report.verdicts(
        document["steps"],
        document["storm"],
        document["store"]["backend"],
        disk_writer=args.disk_writer is not None,
        failover=document["failover"],
    )
    return document


def _spec(index: int, args: argparse.Namespace, address: str) -> WorkerSpec:
    return WorkerSpec(
        index=index,
        workers=args.workers,
        target=address,
        interval=args.interval,
        seed=args.seed,
        run=f"run{os.getpid()}t{int(time.time())}",
        archetypes=args.archetypes,
        ramp_seconds=args.ramp,
        shared_channel=args.shared_connection,
        cpus=args.cpus,
        per_cpu=args.per_cpu,
        per_link=args.per_link,
    )


def _summary(step: dict[str, Any]) -> str:
    p99 = step["ack_p99_s"]
    return (
        f"{step['nodes']} nodes: {step['frames_per_second']:.1f} frames/s, server "
        f"{step['cpu_cores']:.2f} cores, ack p99 {'n/a' if p99 is None else f'{p99:.3f}'} s, "
        f"RSS {step['rss_mb']:.0f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dir:
        directory = Path(args.dir)
        directory.mkdir(parents=True, exist_ok=True)
        document = run(args, directory)
    else:
        with tempfile.TemporaryDirectory(prefix="controller_scale-") as tmp:
            document = run(args, Path(tmp))
    print(json.dumps(document, indent=2) if args.json else report.text(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
