"""Another process writing to the store's disk (`--disk-writer MB_PER_S`): issue 17's p99 ack target
holds "also while another process writes to the same disk".

The neighbour writes 1 MiB blocks into a file in the controller's run directory (the store's file
system), syncs every SYNC_BYTES, as a checkpointing job or a log shipper would, and starts the file
over every FILE_BYTES. At 0 MB/s it writes as fast as the disk takes; otherwise it spreads its
writes to that rate. It reports what it achieved: MB/s and the latency of its own syncs.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

BLOCK_BYTES = 1 << 20
SYNC_BYTES = 8 << 20
FILE_BYTES = 512 << 20
FILE_NAME = "disk-writer.bin"


class DiskWriter:
    """The neighbour process, from start() to stop() (which returns its figures)."""

    def __init__(self, directory: Path, mb_per_s: float) -> None:
        if mb_per_s < 0:
            raise ValueError("the disk writer's rate must be >= 0 MB/s (0: as fast as the disk takes)")
        context = multiprocessing.get_context("spawn")
        self.path = directory / FILE_NAME
        self.mb_per_s = mb_per_s
        self._stop: Event = context.Event()
        self._answer, child = context.Pipe(duplex=False)
        self._process: BaseProcess = context.Process(
            target=write_until_stopped,
            args=(str(self.path), mb_per_s, self._stop, child),
            name="scale-disk-writer",
            daemon=True,
        )
        self._process.start()
        child.close()

    def stop(self) -> dict[str, Any]:
        """Stop it; what it wrote (the file is removed)."""
        self._stop.set()
        figures: dict[str, Any] = {"mb_per_s_asked": self.mb_per_s}
        if self._answer.poll(30):
            figures |= self._answer.recv()
        else:
            figures["error"] = "the disk writer did not answer within 30 s"
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process.close()
        self._answer.close()
        self.path.unlink(missing_ok=True)
        return figures


def write_until_stopped(path: str, mb_per_s: float, stop: Event, answer: Connection) -> None:
    block = os.urandom(BLOCK_BYTES)  # incompressible, whatever the file system does
    syncs: list[float] = []
    written = 0
    began = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while not stop.is_set():
            if mb_per_s > 0:
                due = began + written / (mb_per_s * 1e6)
                if due > time.monotonic():
                    stop.wait(due - time.monotonic())
                    continue
            if written % FILE_BYTES == 0 and written:
                os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, block)
            written += BLOCK_BYTES
            if written % SYNC_BYTES == 0:
                start = time.monotonic()
                os.fsync(fd)
                syncs.append(time.monotonic() - start)
        seconds = time.monotonic() - began
        answer.send(
            {
                "seconds": seconds,
                "mb_written": written / 1e6,
                "mb_per_s": written / 1e6 / seconds if seconds > 0 else 0.0,
                "syncs": len(syncs),
                "sync_p50_s": _quantile(syncs, 0.5),
                "sync_p99_s": _quantile(syncs, 0.99),
            }
        )
    except OSError as exc:  # a full disk: say so rather than hang the bench
        answer.send({"error": f"the disk writer stopped: {exc}", "mb_written": written / 1e6})
    finally:
        os.close(fd)
        answer.close()


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def line(figures: dict[str, Any] | None) -> list[str]:
    """The report's lines about it (none when there was no neighbour)."""
    if figures is None:
        return []
    if "error" in figures:
        return ["", f"disk writer: {figures['error']} ({figures.get('mb_written', 0):.0f} MB written)"]
    asked = figures["mb_per_s_asked"]
    rate = "as fast as the disk took" if asked == 0 else f"asked {asked:g} MB/s"
    p50, p99 = figures["sync_p50_s"], figures["sync_p99_s"]
    syncs = "no sync" if p50 is None else f"its syncs every 8 MiB took p50 {p50:.3f} s, p99 {p99:.3f} s"
    return [
        "",
        f"another process wrote to the store's disk meanwhile: {figures['mb_per_s']:.1f} MB/s "
        f"({rate}), {figures['mb_written']:.0f} MB in {figures['seconds']:.0f} s; {syncs}",
    ]
