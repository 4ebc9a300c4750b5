"""The fleet coming back at once: a reconnect storm (every stream dropped and reopened together) and a
failover (the leader killed; its agents reconnect to the other replica, which takes the lead and
lets its own agents go to reconnect to it as the leader: the whole fleet comes back to the heir).

Each node's first frame acked after the event is timed from it, by the workers (worker.py Storm).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from controller_scale_load import report, target
from controller_scale_load.fleet import Fleet

STORM_TIMEOUT_S = 120.0
OUT_OF_FILES = b"File descriptor limit reached"  # gRPC's listener, when accept() finds no file left
SERIES = ("reconnect", "answer", "first_ack", "since_storm", "moved", "kept")
# The heir's log lines that mark its takeover (controller/app.py, replicas.py, server.py), in order.
TAKEOVER_LINES = {
    "lead_s": "leading the store",
    "caught_up_s": "caught up: took in",
    "listening_s": "controller listening on",
    "detecting_s": "the detection process has the fleet",  # its copy, made while it leads
}
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # controller logging's asctime

Say = Callable[[str], None]


def reconnect_storm(fleet: Fleet, nodes: int, controller: target.Controller, say: Say) -> dict[str, Any]:
    """Drop every stream and reconnect all at once; how long until each node's first frame is acked,
    and the CPU the controller and the load generator spent on it (which of them limited it). The
    controller's event-loop thread apart: near a whole core, the storm waited on that one thread
    (gRPC's asyncio layer and the Hellos run there), which more cores on the host do not speed up."""
    say(f"reconnect storm: dropping {nodes} streams")
    out_of_files = out_of_files_lines(controller.log)
    collected = _gc_seconds(controller)
    before, generator = target.sample(controller), fleet.cpu_seconds()
    fleet.ask("storm")
    answers, done, seconds = _await_fleet(fleet, nodes)
    after, generator = target.sample(controller), fleet.cpu_seconds() - generator
    if collected is not None:  # read after the CPU: the scrape's own work is not the storm's
        collected = (_gc_seconds(controller) or 0.0) - collected
    storm = _figures(answers, nodes, done, seconds)
    spent = after.cpu_seconds - before.cpu_seconds
    storm["controller_cores"] = spent / seconds
    storm["controller_ms_per_node"] = 1e3 * spent / max(done, 1)
    looped = after.loop_cpu_seconds - before.loop_cpu_seconds
    storm["loop_cores"] = looped / seconds
    storm["loop_ms_per_node"] = 1e3 * looped / max(done, 1)
    # The collector runs on the loop's thread: its share of that thread's CPU in the storm.
    storm["gc_seconds"] = collected
    storm["gc_loop_share"] = None if collected is None or looped <= 0 else collected / looped
    storm["generator_cores"] = generator / seconds
    storm["out_of_files"] = out_of_files_lines(controller.log) - out_of_files
    storm["open_files_limit"] = target.open_files_limit(controller)
    say(f"reconnect storm: {done} of {nodes} recovered in {seconds:.1f} s")
    return storm


def _gc_seconds(controller: target.Controller) -> float | None:
    """Seconds the controller's collector has run (its /metrics, gc_seconds_total), None without one
    (the bare server)."""
    return target.scrape(controller).gc_seconds if controller.metrics_url else None


def out_of_files_lines(log: Path | None) -> int:
    """How many times gRPC in the controller's processes has found no file to accept a connection
    with, as its log (`log`) says so far ("File descriptor limit reached. Retrying.", a second apart)."""
    if log is None or not log.exists():
        return 0
    with log.open("rb") as lines:
        return sum(line.count(OUT_OF_FILES) for line in lines)


def failover(
    fleet: Fleet, nodes: int, controller: target.Controller, targets: Sequence[str], say: Say
) -> dict[str, Any]:
    """SIGKILL the leader of two replicas. Its workers' nodes reconnect to the standby (as a Service
    in front of the replicas would send them), the standby's own come back to it once it leads. Each
    node's first frame acked after the kill is timed from the kill; the heir's log gives the times
    of its takeover (leading, caught up, listening); the heir's CPU meanwhile."""
    if len(controller.standbys) != 1:
        raise ValueError("a failover needs exactly two replicas (--replicas 2)")
    heir, heir_address = controller.standbys[0], controller.standby_addresses[0]
    tree = _tree(heir.pid)
    spent, generator = _cpu(tree), fleet.cpu_seconds()
    say(f"failover: killing the leader (pid {controller.pid}); {nodes} nodes to come back to the standby")
    fleet.ask_each([("failover", heir_address if t == controller.address else None) for t in targets])
    killed = time.time()
    controller.process.kill()
    controller.process.wait()
    answers, done, seconds = _await_fleet(fleet, nodes)
    # Its agents may be back before it listens as the leader (their streams kept through the lead).
    heir_log = controller.directory / "standby1.log"
    while None in takeover_times(heir_log, killed).values() and time.time() - killed < STORM_TIMEOUT_S:
        time.sleep(0.5)
    tree = _tree(heir.pid) or tree  # its detection process, started as it took the lead
    spent, generator = _cpu(tree) - spent, fleet.cpu_seconds() - generator
    elapsed = time.time() - killed
    figures = _figures(answers, nodes, done, seconds)
    # Back per worker, and whether it had been the leader's: the two halves of the fleet apart.
    figures["by_worker"] = [
        {"leader": t == controller.address, "nodes": a["nodes"], "back": a["done"]}
        for t, a in zip(targets, answers, strict=True)
    ]
    figures.update(takeover_times(heir_log, killed))
    figures["heir_cores"] = spent / elapsed
    figures["heir_ms_per_node"] = 1e3 * spent / max(done, 1)
    figures["generator_cores"] = generator / elapsed
    back = figures["since_storm_p99_s"]
    say(
        f"failover: {done} of {nodes} back in {seconds:.1f} s (p99 {report.cell(back, '{:.1f}')} s); "
        f"the standby listened as leader {report.cell(figures['listening_s'], '{:.1f}')} s after the kill"
    )
    return figures


def takeover_times(log: Path, since: float) -> dict[str, float | None]:
    """Seconds from `since` (unix time) to the first line of each TAKEOVER_LINES after it in `log`."""
    found: dict[str, float | None] = dict.fromkeys(TAKEOVER_LINES)
    for line in log.read_text(errors="replace").splitlines():
        try:
            at = datetime.strptime(line[:23], LOG_TIME).timestamp()
        except ValueError:
            continue  # a traceback's lines, or a line from before logging was set up
        if at < since - 0.001:  # the log's times are to the millisecond
            continue
        for key, phrase in TAKEOVER_LINES.items():
            if found[key] is None and phrase in line:
                found[key] = max(0.0, at - since)
    return found


def _await_fleet(fleet: Fleet, nodes: int) -> tuple[list[dict[str, Any]], int, float]:
    """Poll the workers until every node's first frame since the event is acked, or STORM_TIMEOUT_S."""
    began = time.monotonic()
    while True:
        answers = fleet.ask("storm_status")
        done = sum(a["done"] for a in answers)
        if done >= nodes or time.monotonic() - began > STORM_TIMEOUT_S:
            return answers, done, time.monotonic() - began
        time.sleep(0.5)


def _figures(answers: list[dict[str, Any]], nodes: int, done: int, seconds: float) -> dict[str, Any]:
    failed: collections.Counter[str] = collections.Counter()
    for answer in answers:
        failed.update(answer["failed"])
    figures: dict[str, Any] = {
        "nodes": nodes,
        "recovered": done,
        "seconds": seconds,
        "failed_attempts": failed.most_common(),  # tries that ended in an error before a node was back
        # how long the generator took to cancel every old stream (its own cost, not the controller's)
        "dropped_s": max((a["dropped"] for a in answers if a["dropped"] is not None), default=None),
    }
    for key in SERIES:
        values = [x for a in answers for x in a[key]]
        figures[f"{key}_p50_s"] = report.percentile(values, 50)
        figures[f"{key}_p99_s"] = report.percentile(values, 99) if done >= nodes else None
    if done < nodes:  # some nodes never recovered: their p99 is at least the time waited
        figures["since_storm_p99_s"] = figures["moved_p99_s"] = seconds
    return figures


def _tree(pid: int) -> list[psutil.Process]:
    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total
