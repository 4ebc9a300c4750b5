"""`gpufleet record` (the controller's stream of accepted Hellos and frames, to a file) and
`gpufleet analyze` (the detectors, offline, over such a file).

A recording is JSON Lines: one operator RecordedMessage per line in the protobuf JSON mapping
(controller/recording.py); `controller --record FILE` writes the same format.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from types import FrameType
from typing import Any

import grpc

from controller.cli.output import DOCUMENT_FORMATS, OUTPUT_FORMATS, add_operator_arguments, print_document
from controller.cli.record_writer import RecordWriter
from controller.record_lines import Converter
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc

PROGRESS_SECONDS = 5.0  # how often `gpufleet record` reports on stderr
PARSE_WORKERS = 8  # processes gpufleet analyze parses a recording's lines in, at most
PARSE_BATCH = 512  # lines parsed at once
_RECEIVED_THEN_LINE = itemgetter(0, 1)
ERRORS_SHOWN = 10  # malformed lines named one by one; the rest only counted


def add_record_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rec = sub.add_parser(
        "record",
        help="write the fleet's stream (accepted Hellos and frames) to a file, for gpufleet analyze",
        description="Record what the controller ingests: first the current Hello of every node, then "
        "every Hello and frame it accepts, appended to FILE as JSON Lines (one RecordedMessage per "
        "line, protobuf JSON mapping, with the controller's receive time). Progress on stderr; ends "
        "after --duration or Ctrl-C with a summary line (exit 0; 1: no controller, or it went away).",
    )
    rec.add_argument(
        "--out", default="", metavar="FILE", help="the recording (appended; made if absent); required"
    )
    rec.add_argument(
        "--duration", type=float, default=0.0, metavar="S", help="stop after S seconds (default: Ctrl-C)"
    )
    rec.add_argument("--node", default="", help="only this node")
    add_operator_arguments(rec)

    ana = sub.add_parser(
        "analyze",
        help="run the detectors offline over a recording and print the findings",
        description="Feed a recording (gpufleet record, controller --record) in order of receive time "
        "to the controller's detectors, passes at detect.interval_seconds as the controller would run "
        "them, and print every finding, resolved ones included, in the schema of `gpufleet findings`. "
        "Malformed lines are named on stderr and skipped. Exit status: 0 done, 2 an unreadable file "
        "or config.",
    )
    ana.add_argument("file", metavar="FILE", help="a recording (JSON Lines)")
    ana.add_argument("--config", metavar="FILE", help="controller config whose detect section to use")
    ana.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default="table",
        help="table (default), wide (more columns), json or yaml (as gpufleet findings prints them)",
    )


# gpufleet record


@dataclass(slots=True)
class Tally:
    started: float = field(default_factory=time.monotonic)
    hellos: int = 0
    frames: int = 0
    dropped: int = 0
    nodes: set[str] = field(default_factory=set)

    @property
    def messages(self) -> int:
        return self.hellos + self.frames

    def add(self, msg: operator_pb2.RecordedMessage) -> None:
        if msg.message.WhichOneof("msg") == "hello":
            self.hellos += 1
        else:
            self.frames += 1
        self.dropped += msg.dropped_before
        self.nodes.add(msg.node)

    def seconds(self) -> float:
        return time.monotonic() - self.started


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM set `stop` (the watcher ends the stream) instead of raising mid-read."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _watch(
    stop: threading.Event, ended: threading.Event, cancel: Callable[[], Any], tally: Tally, duration: float
) -> None:
    """Until the stream ends: progress every PROGRESS_SECONDS; cancel the call on `stop` or when
    `duration` (0: none) has passed."""
    deadline = tally.started + duration if duration > 0 else None
    next_report = tally.started + PROGRESS_SECONDS
    while not ended.is_set():
        now = time.monotonic()
        wake = min(next_report, deadline) if deadline is not None else next_report
        if stop.wait(max(0.0, wake - now)) or (deadline is not None and time.monotonic() >= deadline):
            stop.set()
            cancel()
            return
        if time.monotonic() >= next_report:
            print(
                f"gpufleet record: {tally.messages} messages written, {tally.dropped} dropped, "
                f"{tally.seconds():.0f} s",
                file=sys.stderr,
            )
            next_report += PROGRESS_SECONDS


def _record_summary(out: str, output: str, tally: Tally) -> None:
    """The closing line on stderr and, with -o json|yaml, the same as a document on stdout."""
    seconds = tally.seconds()
    print(
        f"gpufleet record: wrote {tally.messages} messages ({tally.hellos} hellos, {tally.frames} frames, "
        f"{len(tally.nodes)} nodes) to {out} in {seconds:.1f} s; {tally.dropped} dropped "
        "(read too slowly: the controller's queue for this reader overflowed)",
        file=sys.stderr,
    )
    if output in DOCUMENT_FORMATS:
        doc = {
            "file": out,
            "messages": tally.messages,
            "hellos": tally.hellos,
            "frames": tally.frames,
            "nodes": len(tally.nodes),
            "dropped": tally.dropped,
            "seconds": round(seconds, 3),
        }
        print_document(doc, output)


def record(target: str, out: str, output: str, *, duration: float = 0.0, node: str = "") -> int:
    """Append the controller's Record stream to `out` until `duration` passes or Ctrl-C."""
    from controller.cli.operator import OperatorError, call_operator

    if not out:
        print("gpufleet record: --out FILE is required", file=sys.stderr)
        return 2
    try:
        sink = open(out, "ab")  # noqa: SIM115 - UTF-8 lines, flushed after each batch
    except OSError as exc:
        print(f"gpufleet: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    tally = Tally()
    stop, ended = threading.Event(), threading.Event()

    def stream(stub: operator_pb2_grpc.OperatorStub) -> None:
        call = stub.Record(operator_pb2.RecordRequest(node=node))
        watcher = threading.Thread(
            target=_watch, args=(stop, ended, call.cancel, tally, duration), name="record-watch", daemon=True
        )
        watcher.start()
        cancel: Callable[[], Any] = call.cancel
        writer = RecordWriter(sink, tally.add, failed=stop.set)  # lines made and written on its own thread
        writer.start()
        try:
            for msg in call:
                if not writer.put(msg):  # the file cannot be written: the recording ends
                    cancel()
                    break
        except grpc.RpcError:
            if not stop.is_set() and writer.error is None:  # not our own cancel: the controller went away
                raise
        finally:
            writer.finish()
            ended.set()
            watcher.join()
        if writer.error is not None:
            raise writer.error

    status = 0
    with _stop_on_signals(stop):
        try:
            call_operator(target, stream)
        except OperatorError as exc:
            print(f"gpufleet: {exc}", file=sys.stderr)
            status = 1
        except OSError as exc:
            print(f"gpufleet: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
            status = 1
        finally:
            with contextlib.suppress(OSError):  # after a write error: what it could not write is lost
                sink.close()
    _record_summary(out, output, tally)
    return status


# gpufleet analyze


@dataclass(slots=True)
class Recording:
    """A recording's well-formed messages, kept serialised (~10 KB an 8-GPU frame against ~54 KB of
    RSS parsed; analyze of a 324 MB recording peaked at 207 MB rather than 414) with their receive
    times, and what the summary says of them."""

    kept: list[tuple[float, int, bytes]] = field(default_factory=list)  # (received, line, message)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    dropped: int = 0  # messages the recorder lost (dropped_before)
    hellos: int = 0
    frames: int = 0
    nodes: set[str] = field(default_factory=set)

    @property
    def messages(self) -> Iterator[operator_pb2.RecordedMessage]:
        """The messages in order of receive time (file order among equal times), each parsed as it
        is reached."""
        return (operator_pb2.RecordedMessage.FromString(data) for _, _, data in self.kept)

    def span(self) -> float:
        """Seconds from the first message received to the last."""
        return self.kept[-1][0] - self.kept[0][0] if self.kept else 0.0


def received_seconds(msg: operator_pb2.RecordedMessage) -> float:
    return msg.received.seconds + msg.received.nanos / 1e9


def read_recording(path: str, converter: Converter | None = None) -> Recording:
    """Every well-formed line, in order of receive time (file order among equal times); raises
    OSError when the file cannot be read. The lines are parsed by the converter's worker processes
    (by default one a core, up to PARSE_WORKERS): the JSON mapping is ~6 ms of pure Python an 8-GPU
    frame, an hour of a 1,000-node fleet 40 minutes on one core."""
    out = Recording()
    converter = converter or Converter(min(PARSE_WORKERS, os.cpu_count() or 1))
    try:
        with open(path, "rb") as f:
            batch: list[tuple[int, bytes]] = []
            for number, line in enumerate(f, start=1):
                if line.strip():
                    batch.append((number, line))
                if len(batch) >= PARSE_BATCH:
                    _take(out, batch, converter.parse([text for _, text in batch]))
                    batch = []
            _take(out, batch, converter.parse([text for _, text in batch]))
    finally:
        converter.close()
    out.kept.sort(key=_RECEIVED_THEN_LINE)
    return out


def _take(out: Recording, batch: list[tuple[int, bytes]], parsed: list[tuple[bool, bytes]]) -> None:
    for (number, _), (ok, data) in zip(batch, parsed, strict=True):
        if not ok:
            out.bad.append((number, data.decode("utf-8", errors="replace")))
            continue
        msg = operator_pb2.RecordedMessage.FromString(data)
        if msg.message.WhichOneof("msg") not in ("hello", "frame"):
            out.bad.append((number, "the message is neither a hello nor a frame"))
            continue
        if not msg.HasField("received"):
            out.bad.append((number, "no received time"))
            continue
        out.dropped += msg.dropped_before
        if msg.message.HasField("hello"):
            out.hellos += 1
        else:
            out.frames += 1
        out.nodes.add(msg.node)
        out.kept.append((received_seconds(msg), number, data))


def analyze(path: str, output: str, *, config: str | None = None) -> int:
    from controller.cli import tables
    from controller.cli.jsonify import finding_to_dict
    from controller.cli.layout import show
    from controller.config import ConfigError, DetectConfig, load
    from controller.detect.offline import OfflineDetector
    from controller.operator.wire import finding_to_proto
    from controller.paging import finding_key

    try:
        detect = load(config).detect if config else DetectConfig()
        detector = OfflineDetector(config=detect)
    except ConfigError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2
    try:
        rec = read_recording(path)
    except OSError as exc:
        print(f"gpufleet: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for number, why in rec.bad[:ERRORS_SHOWN]:
        print(f"gpufleet analyze: {path}:{number}: not a recorded message, skipped: {why}", file=sys.stderr)
    if len(rec.bad) > ERRORS_SHOWN:
        print(
            f"gpufleet analyze: ... and {len(rec.bad) - ERRORS_SHOWN} more malformed lines", file=sys.stderr
        )
    for msg in rec.messages:
        detector.message(msg.message, received_seconds(msg))
    detector.finish()
    stored = sorted(detector.findings.values(), key=finding_key)
    found = [finding_to_proto(s) for s in stored]
    print(_summary(path, rec, detector.skipped, len(detector.passes), stored), file=sys.stderr)
    if output in DOCUMENT_FORMATS:
        print_document({"findings": [finding_to_dict(f) for f in found]}, output)
    else:
        show(tables.findings_table(found, title=f"Findings in {path}", wide=output == "wide"))
    return 0


def _summary(path: str, rec: Recording, skipped: int, passes: int, stored: list[Any]) -> str:
    active = sum(1 for s in stored if s.active)
    parts = [
        f"gpufleet analyze: {path}: {len(rec.kept)} messages ({rec.hellos} hellos, "
        f"{rec.frames} frames) from {len(rec.nodes)} nodes over {rec.span():.0f} s",
        f"{passes} detection passes",
        f"{len(stored)} findings ({active} active at the end)",
    ]
    if rec.bad:
        parts.append(f"{len(rec.bad)} malformed lines skipped")
    if skipped:
        parts.append(f"{skipped} frames skipped (no Hello of their node before them)")
    if rec.dropped:
        parts.append(f"{rec.dropped} messages lost while recording (the recorder fell behind)")
    return "; ".join(parts)


__all__ = ["add_record_parsers", "analyze", "read_recording", "record"]
