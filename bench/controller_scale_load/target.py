"""The controller under test: one real `gpufleet controller` process on loopback, and what the bench
reads of it from outside (CPU, RSS and storage writes of its pid; its /metrics; ListNodes; its
store's growth: the SQLite file's size, or a PostgreSQL server's WAL position)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
import psycopg
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.db_url import is_postgres_url
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc

START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 10
PREFIX = "gpufleet_controller_"
PASS = PREFIX + "detector_pass_duration_seconds"
SQLITE_FILE = "scale.db"  # in the run directory, when no --db URL is given
STANDBY_INGESTING = re.compile(r"standby: ingesting the agents that connect to (\S+) ")
WAL_POSITION = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"


@dataclass
class Controller:
    process: subprocess.Popen[bytes]
    address: str  # agents (plaintext, loopback)
    metrics_url: str
    directory: Path
    db: Path | str  # the SQLite file, or a postgresql:// URL (with its password: never print it)
    operator_address: str = ""  # operators, when not `address` (the controller's ingest fronts)
    # With replicas: the standbys (replica_ingest), each serving agents on its own address.
    standbys: list[subprocess.Popen[bytes]] = field(default_factory=list)
    standby_addresses: list[str] = field(default_factory=list)
    log: Path | None = None  # its output, its children's included (the fronts, the detection process)

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class Sample:
    """The controller process at one moment."""

    time: float
    cpu_seconds: float  # user + system, every thread, its children's too
    main_cpu_seconds: float  # the controller's own process alone (its event loop, store and gRPC threads)
    # Its main thread alone: the event loop, where the servicer, ingest and gRPC's asyncio layer run
    # (the leader's with replicas); what one core has to hold, whatever other threads and processes do.
    loop_cpu_seconds: float
    detection_cpu_seconds: float  # its detection process (controller/detection/)
    fronts_cpu_seconds: float  # its ingest fronts together (controller/fronts/)
    replicas_cpu_seconds: float  # the standbys ingesting beside it (replica_ingest), with their children
    rss_bytes: int
    write_bytes: int  # bytes the process caused to be written to storage (/proc/PID/io); -1: unreadable
    # SQLite: the file, its WAL and shared memory together. PostgreSQL: the server's WAL position
    # (bytes of WAL it has generated, every database's): the difference between samples is the WAL
    # written in between.
    db_bytes: int


@dataclass(frozen=True)
class Scrape:
    seconds: float
    size: int  # bytes of the page
    series: int
    pass_sum: float  # detector_pass_duration_seconds: sum, count, cumulative buckets (le -> n)
    pass_count: float
    pass_buckets: dict[float, float]
    frames: float  # frames_ingested_total
    findings: float  # active findings, all causes
    gc_seconds: float  # gc_seconds_total, every generation (controller/gc_policy.py)
    gc_longest: float  # gc_longest_pause_seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_postgres(db: Path | str) -> bool:
    return isinstance(db, str) and is_postgres_url(db)


def config(
    directory: Path,
    nodes: int,
    detect_interval: float | None,
    disabled: Sequence[str] = (),
    db: str | None = None,
    *,
    detect_in_loop: bool = False,
    fronts: int = 0,
    detect_processes: int = 1,
    replica_ingest: bool = False,
    replica_sync_seconds: float = 10.0,
    listeners: int | None = None,
    event_loop: str = "auto",
) -> dict[str, object]:
    """The controller's config: loopback ports, a store (an SQLite file in `directory`, or the
    postgresql:// URL `db`), room for `nodes`, no Kubernetes; the detection interval and the
    detectors turned off where given; the detectors on the event loop with detect_in_loop (the
    controller's detect.process: false), else in their process; with `fronts`, that many ingest
    fronts serve the agents' port and operators get a port of their own; detect_processes share out
    the detectors (detect.processes); `listeners` servers on the agents' port (None: the
    controller's default); `event_loop` the controller's (auto, uvloop, asyncio)."""
    document: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "metrics_address": f"127.0.0.1:{free_port()}",
        "db": db if db is not None else str(directory / SQLITE_FILE),
        "limits": {"max_nodes": max(20_000, 2 * nodes)},
        "kubernetes": {"enabled": False},
        "event_loop": event_loop,
    }
    detect: dict[str, object] = {}
    if detect_interval is not None:
        detect["interval_seconds"] = detect_interval
    if disabled:
        detect["detectors"] = {name: {"enabled": False} for name in disabled}
    if detect_in_loop:
        detect["process"] = False
    if detect_processes > 1:
        detect["processes"] = detect_processes
    if listeners is not None:
        document["listeners"] = listeners
    if fronts:
        document["ingest_fronts"] = fronts
        document["operator_listen"] = "127.0.0.1:0"
    if detect:
        document["detect"] = detect
    if replica_ingest:
        document["replica_ingest"] = True
        document["replica_sync_seconds"] = replica_sync_seconds
    return document


def start(
    directory: Path,
    nodes: int,
    detect_interval: float | None = None,
    disabled: Sequence[str] = (),
    db: str | None = None,
    *,
    detect_in_loop: bool = False,
    fronts: int = 0,
    detect_processes: int = 1,
    replicas: int = 1,
    replica_sync_seconds: float = 10.0,
    listeners: int | None = None,
    event_loop: str = "auto",
) -> Controller:
    """`python -m controller controller` with its config, log and ready file in `directory`; its
    store an SQLite file there, or the postgresql:// URL `db`. With `replicas`, that many
    controllers on the store with replica_ingest: the leader, then standbys that ingest too."""
    settings = config(
        directory,
        nodes,
        detect_interval,
        disabled,
        db,
        detect_in_loop=detect_in_loop,
        fronts=fronts,
        detect_processes=detect_processes,
        replica_ingest=replicas > 1,
        replica_sync_seconds=replica_sync_seconds,
        listeners=listeners,
        event_loop=event_loop,
    )
    path, ready, log = (
        directory / "controller.yaml",
        directory / "controller.ready",
        directory / "controller.log",
    )
    if db is not None:  # the config holds the URL's password: readable by its owner only
        path.touch(mode=0o600)
        path.chmod(0o600)
    path.write_text(yaml.safe_dump(settings))
    command = [
        sys.executable,
        "-m",
        "controller",
        "controller",
        "--config",
        str(path),
        "--ready-file",
        str(ready),
    ]
    process, address, operators = _launch(command, ready, log, "the controller")
    metrics = f"http://{settings['metrics_address']}/metrics"
    store: Path | str = db if db is not None else Path(str(settings["db"]))
    controller = Controller(process, address, metrics, directory, store, operators, log=log)
    try:
        for index in range(1, replicas):
            standby, bound = _start_standby(directory, index, settings)
            controller.standbys.append(standby)
            controller.standby_addresses.append(bound)
    except BaseException:
        stop_all(controller)
        raise
    return controller


def _start_standby(
    directory: Path, index: int, leader: dict[str, object]
) -> tuple[subprocess.Popen[bytes], str]:
    """A standby with the leader's settings, its own ports: ingesting once its log says so."""
    settings = {**leader, "listen": f"127.0.0.1:{free_port()}", "metrics_address": None}
    if "ingest_fronts" in settings:  # its own fronts, as the leader's; an operators' port if it leads
        settings["operator_listen"] = "127.0.0.1:0"
    path, log = directory / f"standby{index}.yaml", directory / f"standby{index}.log"
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(settings))
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "controller", "controller", "--config", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while (found := STANDBY_INGESTING.search(log.read_text())) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"standby {index} did not start ingesting:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    return process, found.group(1)


def stop_all(controller: Controller) -> None:
    """The standbys, then the leader (none takes over: they go first)."""
    for standby in controller.standbys:
        stop(standby)
    stop(controller.process)


def start_floor(directory: Path, listeners: int = 1, event_loop: str = "auto") -> Controller:
    """The transport's floor (floor.py): a bare Telemetry server under the same load, `listeners`
    of them on its port as the controller has, on its event loop. It has no /metrics and no store
    (its db names no file: 0 bytes)."""
    ready, log = directory / "floor.ready", directory / "floor.log"
    floor = str(Path(__file__).with_name("floor.py"))
    command = [sys.executable, floor, "--ready-file", str(ready), "--listeners", str(listeners)]
    command += ["--event-loop", event_loop]
    process, address, _ = _launch(command, ready, log, "the floor server")
    return Controller(process, address, "", directory, directory / "floor-has-no-store", log=log)


def open_files_limit(controller: Controller) -> tuple[int, int] | None:
    """The controller's open-file limit (soft, hard) as it runs: it raises its soft one at start."""
    try:
        soft, hard = psutil.Process(controller.pid).rlimit(psutil.RLIMIT_NOFILE)
    except (psutil.Error, OSError):
        return None
    return soft, hard


def _launch(
    command: list[str], ready: Path, log: Path, what: str
) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start `command` (output to `log`); once it writes `ready`, the process and the addresses
    there (agents', operators': the agents' when it names none)."""
    ready.unlink(missing_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists() or not ready.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"{what} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    document = json.loads(ready.read_text())
    return process, str(document["address"]), str(document.get("operator_address") or document["address"])


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (after SIGCONT), SIGKILL after 10 s; returns once it has ended."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def sample(controller: Controller) -> Sample:
    """The controller's CPU, RSS and writes, its children's included (the detection process)."""
    parent = psutil.Process(controller.pid)
    cpu, rss, written, loop = 0.0, 0, 0, 0.0
    own = {"main": 0.0, "detection": 0.0, "fronts": 0.0, "replicas": 0.0}
    standbys = []
    for standby in controller.standbys:
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(standby.pid)
            standbys += [top, *top.children(recursive=True)]
    for proc in [parent, *parent.children(recursive=True), *standbys]:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                role = "replicas" if proc in standbys else _role(proc, parent)
                own[role] += times.user + times.system
                if proc.pid == parent.pid:
                    loop = main_thread_seconds(proc)
                rss += proc.memory_info().rss
                try:
                    written = written + int(proc.io_counters().write_bytes) if written >= 0 else -1
                except (psutil.AccessDenied, AttributeError):
                    written = -1
        except psutil.NoSuchProcess:  # a child that ended between the listing and the reading
            continue
    return Sample(
        time.perf_counter(),
        cpu,
        own["main"],
        loop,
        own["detection"],
        own["fronts"],
        own["replicas"],
        rss,
        written,
        db_bytes(controller.db),
    )


def main_thread_seconds(proc: psutil.Process) -> float:
    """User + system seconds of the process's main thread (its thread id is the pid)."""
    return next((t.user_time + t.system_time for t in proc.threads() if t.id == proc.pid), 0.0)


def _role(proc: psutil.Process, parent: psutil.Process) -> str:
    """main (the controller's process), detection, fronts, or another child counted with main."""
    if proc.pid == parent.pid:
        return "main"
    command = " ".join(proc.cmdline())
    if "controller.detection.worker" in command:
        return "detection"
    return "fronts" if "controller.fronts.front" in command else "main"


def db_bytes(db: Path | str) -> int:
    """SQLite: the file's size with its WAL and shared memory. PostgreSQL: the server's WAL
    position in bytes, over one short connection."""
    if is_postgres(db):
        with psycopg.connect(str(db), connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
            row = conn.execute(WAL_POSITION).fetchone()
        assert row is not None
        return int(row[0])
    files = [Path(db), Path(f"{db}-wal"), Path(f"{db}-shm")]
    return sum(f.stat().st_size for f in files if f.exists())


def scrape(controller: Controller) -> Scrape:
    """One GET of /metrics, timed, and the figures the bench reads from it."""
    began = time.perf_counter()
    with urllib.request.urlopen(controller.metrics_url, timeout=CALL_TIMEOUT_S) as answer:
        body = answer.read()
    seconds = time.perf_counter() - began
    series, pass_sum, pass_count, frames, findings, gc_seconds, gc_longest = 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        series += len(family.samples)
        for s in family.samples:
            if s.name == PASS + "_sum":
                pass_sum = s.value
            elif s.name == PASS + "_count":
                pass_count = s.value
            elif s.name == PASS + "_bucket":
                buckets[float(s.labels["le"])] = s.value
            elif s.name == PREFIX + "frames_ingested_total":
                frames = s.value
            elif s.name == PREFIX + "findings":
                findings += s.value
            elif s.name == PREFIX + "gc_seconds_total":
                gc_seconds += s.value
            elif s.name == PREFIX + "gc_longest_pause_seconds":
                gc_longest = s.value
    return Scrape(
        seconds, len(body), series, pass_sum, pass_count, buckets, frames, findings, gc_seconds, gc_longest
    )


def list_nodes(controller: Controller) -> tuple[float, int, int]:
    """Every page of ListNodes over a fresh channel, timed: (seconds, nodes, pages)."""
    with grpc.insecure_channel(controller.operator_address or controller.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)  # the connection is not timed
        stub = operator_pb2_grpc.OperatorStub(channel)
        began = time.perf_counter()
        nodes, pages, token = 0, 0, ""
        while True:
            page = stub.ListNodes(operator_pb2.ListNodesRequest(page_token=token), timeout=CALL_TIMEOUT_S)
            nodes, pages, token = nodes + len(page.nodes), pages + 1, page.next_page_token
            if not token:
                return time.perf_counter() - began, nodes, pages
