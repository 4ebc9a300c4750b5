"""The controller's side of the detection process (worker.py): it starts the process with a copy of
the fleet, sends it every change the controller applies (never waiting: the pipe's writes are
buffered by the event loop), and asks it for a pass, whose report it awaits. The detectors then run
on another core while the loop goes on storing and acking frames; their CPU no longer delays acks.

A process that dies (or answers nothing for PASS_TIMEOUT_SECONDS) fails that pass; the next pass
starts a new one with the fleet as the controller holds it then. The error counters' trends (rates
over a window) are kept in the process only, so a new one starts them afresh, as a controller
restart does (controller/ingest.py, `mirror`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

from controller import children
from controller.batched_writes import BatchedWriter
from controller.config import DetectConfig
from controller.detect.runner import PassReport
from controller.detection.changes import FleetChanges
from controller.detection.fleet_copy import send_fleet
from controller.detection.wire import HEADER, decode, parts
from controller.event_loop import write_transport
from controller.fleet.model import Fleet
from controller.pipe_sizes import widen

log = logging.getLogger("gpufleet.controller.detect")
PASS_TIMEOUT_SECONDS = 120.0
# Changes not yet read by the process: past this it is taken as hung, stopped, and started anew.
MAX_BUFFERED_BYTES = 512 * 1024 * 1024
STOP_TIMEOUT_SECONDS = 5.0
# A change waits this long for others to join its write to the process (a pass request does not: it
# goes at once, with what waits before it). Written each turn of the loop, a fleet's changes went one
# write, and one wake-up of the process, per frame. At 2,000 nodes on 2 cores the process spent
# 0.50-0.57 ms of CPU a frame that way, 0.41-0.49 with this (bench/controller_scale.py; results in
# bench/results/2026-12-01_controller_scale_hellos_and_pipe_batches.txt). A pass sees every change
# sent before it asked, so what the delay holds back never makes a finding late.
COALESCE_SECONDS = 0.05


class DetectionUnavailable(RuntimeError):
    """The detection process is gone or did not answer: this pass has no report."""


class DetectionProcess(FleetChanges):
    def __init__(self, config: DetectConfig, names: Sequence[str]) -> None:
        self.config = config
        self.names = list(names)
        self.starts = 0  # processes started (1 unless one died)
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._writer: BatchedWriter | None = None
        self.pipe_bytes = 0  # the capacity of the pipe to the process
        self._waiting: dict[int, asyncio.Future[PassReport]] = {}
        self._next_id = 0

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self, fleet: Fleet) -> None:
        """A new process, given a copy of `fleet` (in slices: fleet_copy.py)."""
        await self.spawn()
        await send_fleet([self], fleet, self.config, self.names)

    async def spawn(self) -> None:
        """A new process, holding nothing yet: fleet_copy.send_fleet gives it its copy."""
        await self.stop()
        self._process = await children.create_subprocess_exec(
            sys.executable,
            "-m",
            "controller.detection.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self.starts += 1
        assert self._process.stdin is not None
        transport = write_transport(self._process.stdin.transport)  # asyncio's or uvloop's
        self._writer = BatchedWriter(transport, delay=COALESCE_SECONDS)
        self.pipe_bytes = widen(transport)  # every frame's change goes through it
        self._reader = asyncio.create_task(self._read(self._process))
        log.info("detection runs in process %d", self._process.pid)

    def waiting_bytes(self) -> int:
        """What the process has not read yet of what was sent to it (0 without a process)."""
        process = self._process
        if process is None or process.stdin is None or self._writer is None:
            return 0
        return process.stdin.transport.get_write_buffer_size() + self._writer.pending_bytes()

    async def run_pass(
        self, now: float, names: list[str] | None = None, *, merged: bool = True
    ) -> PassReport:
        """The detectors' report over the fleet as changed up to now (these detectors only: `names`;
        merged=False: each one's findings, unmerged, in PassReport.raw); DetectionUnavailable if the
        process is gone or silent for PASS_TIMEOUT_SECONDS."""
        if not self.running:
            raise DetectionUnavailable("the detection process is not running")
        self._next_id += 1
        pass_id = self._next_id
        answer: asyncio.Future[PassReport] = asyncio.get_running_loop().create_future()
        self._waiting[pass_id] = answer
        try:
            self._send(("pass", pass_id, now, names, merged))
            self.flush()  # the changes that wait, then this request
            return await asyncio.wait_for(answer, PASS_TIMEOUT_SECONDS)
        except TimeoutError:
            await self.stop()
            raise DetectionUnavailable(f"no report within {PASS_TIMEOUT_SECONDS:.0f} s") from None
        finally:
            self._waiting.pop(pass_id, None)

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            self.flush()  # what waits is read before the end
            process.stdin.close()  # its end of input: it exits
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            await self._reader
            self._reader = None

    def flush(self) -> None:
        """Write what waits for the process now (COALESCE_SECONDS)."""
        if self._writer is not None:
            self._writer.flush()

    def _send(self, message: tuple[Any, ...]) -> None:
        self.send(*parts(message))

    def send(self, *data: bytes) -> None:
        """An encoded message (wire.encode, or wire.parts' parts in order): the pool encodes each
        change once for all its processes."""
        process = self._process
        if (
            process is None
            or process.returncode is not None  # it ended: writes to its pipe would each log a warning
            or process.stdin is None
            or process.stdin.is_closing()
        ):
            return  # no process: the next pass starts one from the controller's fleet
        if process.stdin.transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
            log.error(
                "the detection process reads nothing (%d MB waiting): stopping it", MAX_BUFFERED_BYTES >> 20
            )
            process.stdin.close()
            process.kill()
            return
        assert self._writer is not None
        for part in data:
            self._writer.write(part)

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        try:
            while True:
                header = await process.stdout.readexactly(HEADER)
                body = await process.stdout.readexactly(int.from_bytes(header, "big"))
                kind, pass_id, content = decode(body)
                answer = self._waiting.get(pass_id)
                if answer is None or answer.done():
                    continue
                if kind == "report":
                    answer.set_result(content)
                else:
                    answer.set_exception(DetectionUnavailable(f"the detection pass failed: {content}"))
        except asyncio.IncompleteReadError:
            pass  # it ended
        finally:
            with contextlib.suppress(ProcessLookupError):
                await process.wait()
            if process.returncode not in (0, None):
                if process is self._process:  # not stop()'s doing
                    log.error("the detection process ended with status %s", process.returncode)
                else:  # stop() killed it: freeing a big fleet's copy outlasted STOP_TIMEOUT_SECONDS
                    log.info("the detection process was stopped (status %s)", process.returncode)
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(DetectionUnavailable("the detection process ended"))
