"""The detection process (`python -m controller.detection.worker`, started by the controller): it
keeps a copy of the fleet, changed by the same functions as the controller's own (the Hellos and
frames the controller applied, in the order it applied them, connections and forgotten nodes), and
runs the detectors over it when asked, answering with the pass's report. Its stdin closed (the
controller gone), it ends."""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

from controller.children import ignore_stop_signals
from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.detect.runner import run_detectors
from controller.detection.fleet_copy import install
from controller.detection.wire import encode, read
from controller.fleet.adopt import adopt, adopt_history
from controller.fleet.expiry import forget
from controller.fleet.model import Fleet
from controller.fleet.state import apply_frame, apply_hello, write_of
from controller.gc_policy import CollectorPolicy
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.logsafe import configure_logging

log = logging.getLogger("gpufleet.controller.detect")


class Mirror:
    def __init__(self) -> None:
        self.fleet = Fleet()
        self.config = DetectConfig()
        self.names: list[str] = []

    def handle(self, message: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Apply one message; the answer to send, for a pass."""
        kind = message[0]
        if kind == "init":
            _, self.fleet, self.config, self.names = message  # the fleet's shell: its nodes follow
        elif kind == "nodes":
            install(self.fleet, message)
        elif kind == "hello":
            _, hello, acked, now = message
            apply_hello(self.fleet, hello, acked, now)
        elif kind == "frame":
            _, node, plan, frame = message
            if node in self.fleet.nodes:
                write = write_of(node, pb.TelemetryFrame.FromString(frame), plan)
                apply_frame(self.fleet, write, links_unchanged=plan.links_unchanged)
        elif kind == "connected":
            node = self.fleet.nodes.get(message[1])
            if node is not None:
                node.connected = message[2]
        elif kind == "forget":
            forget(self.fleet, message[1])
        elif kind == "adopt":
            adopt(self.fleet, message[1].fleet(), message[2])
        elif kind == "history":
            adopt_history(self.fleet, message[1])
        elif kind == "pass":
            _, pass_id, now, names, merged = message
            names = self.names if names is None else names
            try:
                report = run_detectors(DetectContext(self.fleet, self.config, now), names, merged=merged)
            except Exception as exc:  # the pass fails, the process goes on
                log.exception("detection pass failed")
                return ("failed", pass_id, f"{type(exc).__name__}: {exc}")
            return ("report", pass_id, report)
        else:
            raise ValueError(f"unknown message {kind!r}")
        return None


def serve(source: IO[bytes], sink: IO[bytes]) -> None:
    mirror = Mirror()
    collector = CollectorPolicy()  # the fleet's copy is as big as the controller's (controller/gc_policy.py)
    while (message := read(source)) is not None:
        answer = mirror.handle(message)
        if answer is not None:
            sink.write(encode(answer))
            sink.flush()
        # After each message, not each pass only: the copy's slices and the frames between passes
        # are new objects by the hundred thousand, each full collection walked all of them.
        collector.tick()


def main() -> None:
    ignore_stop_signals()  # the controller ends this process: its stdin's end
    configure_logging("info")  # to stderr: the controller's own log
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
