"""The controller under test: one real `gpufleet controller` process on loopback, and what the bench
reads of it from outside (CPU, RSS and storage writes of its pid; its /metrics; ListNodes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc

START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 120.0
PREFIX = "gpufleet_controller_"
PASS = PREFIX + "detector_pass_duration_seconds"


@dataclass
class Controller:
    process: subprocess.Popen[bytes]
    address: str  # agents and operators (plaintext, loopback)
    metrics_url: str
    directory: Path
    db: Path

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class Sample:
    """The controller process at one moment."""

    time: float
    cpu_seconds: float  # user + system, every thread
    rss_bytes: int
    write_bytes: int  # bytes the process caused to be written to storage (/proc/PID/io); -1: unreadable
    db_bytes: int  # the SQLite file, its WAL and shared memory together


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(
    directory: Path, nodes: int, detect_interval: float | None, disabled: Sequence[str] = ()
) -> dict[str, object]:
    """The controller's config: loopback ports, a file store, room for `nodes`, no Kubernetes; the
    detection interval and the detectors turned off where given."""
    document: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "metrics_address": f"127.0.0.1:{free_port()}",
        "db": str(directory / "scale.db"),
        "limits": {"max_nodes": max(20_000, 2 * nodes)},
        "kubernetes": {"enabled": False},
    }
    detect: dict[str, object] = {}
    if detect_interval is not None:
        detect["interval_seconds"] = detect_interval
    if disabled:
        detect["detectors"] = {name: {"enabled": False} for name in disabled}
    if detect:
        document["detect"] = detect
    return document


def start(
    directory: Path, nodes: int, detect_interval: float | None = None, disabled: Sequence[str] = ()
) -> Controller:
    """`python -m controller controller` with its config, log and ready file in `directory`."""
    settings = config(directory, nodes, detect_interval, disabled)
    path, ready, log = (
        directory / "controller.yaml",
        directory / "controller.ready",
        directory / "controller.log",
    )
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
    with log.open("ab") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"the controller did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    address = str(json.loads(ready.read_text())["address"])
    metrics = f"http://{settings['metrics_address']}/metrics"
    return Controller(process, address, metrics, directory, Path(str(settings["db"])))


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
    proc = psutil.Process(controller.pid)
    with proc.oneshot():
        times = proc.cpu_times()
        rss = proc.memory_info().rss
        try:
            written = int(proc.io_counters().write_bytes)
        except (psutil.AccessDenied, AttributeError):
            written = -1
    files = [controller.db, Path(f"{controller.db}-wal"), Path(f"{controller.db}-shm")]
    size = sum(f.stat().st_size for f in files if f.exists())
    return Sample(time.perf_counter(), times.user + times.system, rss, written, size)


def scrape(controller: Controller) -> Scrape:
    """One GET of /metrics, timed, and the figures the bench reads from it."""
    began = time.perf_counter()
    with urllib.request.urlopen(controller.metrics_url, timeout=CALL_TIMEOUT_S) as answer:
        body = answer.read()
    seconds = time.perf_counter() - began
    series, pass_sum, pass_count, frames, findings = 0, 0.0, 0.0, 0.0, 0.0
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
    return Scrape(seconds, len(body), series, pass_sum, pass_count, buckets, frames, findings)


def list_nodes(controller: Controller) -> tuple[float, int, int]:
    """Every page of ListNodes over a fresh channel, timed: (seconds, nodes, pages)."""
    with grpc.insecure_channel(controller.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)  # the connection is not timed
        stub = operator_pb2_grpc.OperatorStub(channel)
        began = time.perf_counter()
        nodes, pages, token = 0, 0, ""
        while True:
            page = stub.ListNodes(operator_pb2.ListNodesRequest(page_token=token), timeout=CALL_TIMEOUT_S)
            nodes, pages, token = nodes + len(page.nodes), pages + 1, page.next_page_token
            if not token:
                return time.perf_counter() - began, nodes, pages
