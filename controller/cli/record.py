"""`gpufleet record` (the controller's stream of accepted Hellos and frames, to a file) and
`gpufleet analyze` (the detectors, offline, over such a file).

A recording is JSON Lines: one operator RecordedMessage per line in the protobuf JSON mapping
(controller/recording.py); `controller --record FILE` writes the same format.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import grpc

from controller.cli.output import DOCUMENT_FORMATS, OUTPUT_FORMATS, add_operator_arguments, print_document
from controller.cli.record_writer import RecordWriter
from controller.config import MAX_RECORD_WORKERS
from controller.record_lines import WORKERS, Converter
from controller.recording import compressed, open_recording
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc

PROGRESS_SECONDS = 5.0  # how often `gpufleet record` reports on stderr


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
        "--out",
        default="",
        metavar="FILE",
        help="the recording (appended; made if absent; gzip-compressed if FILE ends .gz); required",
    )
    rec.add_argument(
        "--duration", type=float, default=0.0, metavar="S", help="stop after S seconds (default: Ctrl-C)"
    )
    rec.add_argument("--node", default="", help="only this node")
    rec.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        metavar="N",
        help=f"processes making the lines (default {WORKERS}; each ~1,000 frames a second at most: "
        "12,500 nodes at a 10 s cadence send 1,250)",
    )
    add_operator_arguments(rec)

    ana = sub.add_parser(
        "analyze",
        help="run the detectors offline over a recording and print the findings",
        description="Feed a recording (gpufleet record, controller --record) in order of receive time "
        "to the controller's detectors, passes at detect.interval_seconds as the controller would run "
        "them, and print every finding, resolved ones included, in the schema of `gpufleet findings`. "
        "Malformed lines are named on stderr and skipped; progress on stderr every 5 s. The file is "
        "read as a stream (lines more than 4,096 messages out of receive order: read again and sorted "
        "whole, with a note). Exit status: 0 done, 2 an unreadable file "
        "or config.",
    )
    ana.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="a recording (JSON Lines, or gzip-compressed); several (each replica's, say) are merged in "
        "order of receive time",
    )
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
    why = " (read too slowly: the controller's queue for this reader overflowed)" if tally.dropped else ""
    print(
        f"gpufleet record: wrote {tally.messages} messages ({tally.hellos} hellos, {tally.frames} frames, "
        f"{len(tally.nodes)} nodes) to {out} in {seconds:.1f} s; {tally.dropped} dropped{why}",
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


def _refused(out: str, duration: float, workers: int) -> str:
    """Why these arguments cannot be used ('' when they can)."""
    if not out:
        return "--out FILE is required"
    if not duration >= 0:  # NaN too
        return f"--duration must be a number of seconds >= 0 (0: until Ctrl-C), not {duration}"
    if not 1 <= workers <= MAX_RECORD_WORKERS:
        return f"--workers must be between 1 and {MAX_RECORD_WORKERS}"
    return ""


def record(
    target: str, out: str, output: str, *, duration: float = 0.0, node: str = "", workers: int = WORKERS
) -> int:
    """Append the controller's Record stream to `out` until `duration` passes or Ctrl-C."""
    from controller.cli.operator import OperatorError, call_operator

    refused = _refused(out, duration, workers)
    if refused:
        print(f"gpufleet record: {refused}", file=sys.stderr)
        return 2
    try:
        sink = open_recording(out)  # UTF-8 lines, flushed after each batch; this writer's alone
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
        writer = RecordWriter(  # lines made and written on its own thread
            sink, tally.add, Converter(workers), failed=stop.set, compressed=compressed(out)
        )
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


__all__ = ["add_record_parsers", "record"]
