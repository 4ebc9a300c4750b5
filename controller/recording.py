"""Record what the controller ingests: a hub the ingest path publishes each accepted Hello and frame
to, and its readers (the operator RPC Record's streams, the `--record FILE` sink).

Publishing never waits and never fails: each reader has a bounded queue, and a reader too slow to
keep up loses messages (counted, and told to a stream reader in RecordedMessage.dropped_before)
rather than slowing ingest. Messages are shared, not copied: the ingest path never changes a
message once accepted.

File format (`controller --record FILE` and `gpufleet record`): JSON Lines, one RecordedMessage per
line in the protobuf JSON mapping (field names as in the .proto); `gpufleet analyze` reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Protocol

from controller.record_lines import Converter
from controller.record_space import SpaceGuard
from protos.gpufleet.v1 import operator_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.recording")
STREAM_QUEUE = 2048  # messages a Record stream may fall behind before it loses some
FILE_QUEUE = 8192  # messages the --record writer may fall behind
RETRY_SECONDS = 5.0  # after a write error, the file is tried again this long later
FLUSH_EVERY = 256  # lines written between flushes while the queue stays busy
BATCH = 64  # messages the writer takes from its queue at once, for its Converter's workers


@dataclass(frozen=True, slots=True)
class Accepted:
    """One message the controller accepted (a Hello, or a frame it stored), at `received`."""

    received: float
    node: str
    hello: pb.Hello | None = None
    frame: pb.TelemetryFrame | None = None

    def to_proto(self, dropped_before: int = 0) -> operator_pb2.RecordedMessage:
        msg = operator_pb2.RecordedMessage(node=self.node, dropped_before=dropped_before)
        msg.received.FromNanoseconds(int(self.received * 1e9))
        if self.hello is not None:
            msg.message.hello.CopyFrom(self.hello)
        elif self.frame is not None:
            msg.message.frame.CopyFrom(self.frame)
        return msg


class Reader(Protocol):
    node: str  # "" for every node

    def offer(self, item: Accepted) -> None:
        """Take `item` without waiting (or count it lost)."""


class RecordHub:
    """Fan-out of accepted messages to readers. Publish from the event loop (ingest does)."""

    def __init__(self) -> None:
        self._readers: list[Reader] = []

    @property
    def readers(self) -> int:
        return len(self._readers)

    def add(self, reader: Reader) -> None:
        self._readers.append(reader)

    def remove(self, reader: Reader) -> None:
        if reader in self._readers:
            self._readers.remove(reader)

    @contextlib.contextmanager
    def subscribe(self, node: str = "", maxsize: int = STREAM_QUEUE) -> Iterator[Subscription]:
        """A stream reader for the block's length (every node, or only `node`)."""
        sub = Subscription(node, maxsize)
        self.add(sub)
        try:
            yield sub
        finally:
            self.remove(sub)

    def hello(self, hello: pb.Hello, received: float) -> None:
        if self._readers:
            self._publish(Accepted(received, hello.node, hello=hello))

    def frame(self, frame: pb.TelemetryFrame, received: float) -> None:
        if self._readers:
            self._publish(Accepted(received, frame.node, frame=frame))

    def _publish(self, item: Accepted) -> None:
        for reader in list(self._readers):
            if not reader.node or reader.node == item.node:
                reader.offer(item)


class Subscription:
    """A Record stream's queue (event loop only): `await get()` gives the next RecordedMessage, with
    the count of messages lost just before it."""

    def __init__(self, node: str = "", maxsize: int = STREAM_QUEUE) -> None:
        self.node = node
        self._queue: asyncio.Queue[tuple[Accepted, int]] = asyncio.Queue(maxsize)
        self._lost = 0  # lost since the last message queued
        self.dropped = 0  # lost in all

    def offer(self, item: Accepted) -> None:
        try:
            self._queue.put_nowait((item, self._lost))
        except asyncio.QueueFull:
            self._lost += 1
            self.dropped += 1
        else:
            self._lost = 0

    async def get(self) -> operator_pb2.RecordedMessage:
        item, lost = await self._queue.get()
        return item.to_proto(lost)


Opener = Callable[[str], IO[bytes]]


def compressed(path: str) -> bool:
    """Whether a recording written to `path` is gzip-compressed: its name ends .gz."""
    return path.endswith(".gz")


IN_USE = "being written by another recorder (gpufleet record, or a controller's --record)"


def open_recording(path: str) -> IO[bytes]:
    """The file for appending (UTF-8 lines, as the Converter makes them); a line a full disk cut
    short is ended first, so the next is whole. (A compressed one's cut-short member is skipped
    when it is read: cli/gzip_lines.py.) The file is this writer's alone while open (an flock):
    another recorder appending to it is an OSError saying so. Before, two of them (a `gpufleet
    record` started twice) appended every message twice, and `gpufleet analyze` counted both."""
    f = open(path, "ab")  # noqa: SIM115 - the sink keeps it open
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(errno.EBUSY, IN_USE, path) from None
        if f.tell() > 0 and not compressed(path):
            with open(path, "rb") as existing:
                existing.seek(-1, os.SEEK_END)
                if existing.read(1) != b"\n":
                    f.write(b"\n")
    except OSError:
        f.close()
        raise
    return f


class FileSink:
    """`controller --record FILE`: appends every accepted message to FILE from a thread of its own.

    Never blocks or breaks ingest. A full queue loses the message; a write error (a full disk, an
    unwritable path) logs one error line, loses the messages not yet on disk and the ones arriving
    in the next RETRY_SECONDS, then tries the file again, and logs once more when writing resumes.
    Every lost message is counted in `dropped` (gpufleet_controller_record_dropped_total).
    The JSON lines are made by the `converter`'s worker processes (record_lines.py), in batches of
    what is queued: on this thread the mapping would take the interpreter from the event loop.
    """

    node = ""

    def __init__(
        self,
        path: str,
        *,
        maxsize: int = FILE_QUEUE,
        opener: Opener = open_recording,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        converter: Converter | None = None,
        space: SpaceGuard | None = None,
    ) -> None:
        self.path = path
        # Below record_min_free_bytes free, batches are not written (record_space.py); none: no check
        self.space = space
        self.compressed = compressed(path)
        self.converter = converter or Converter()
        self.written = 0
        self._dropped = 0
        self._count_lock = threading.Lock()  # dropped is counted from the loop and the writer
        self._queue: queue.Queue[Accepted] = queue.Queue(maxsize)
        self._opener = opener
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._file: IO[bytes] | None = None
        self._retry_at = 0.0
        self._failing = False
        self._lost_while_failing = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufleet-record", daemon=True)

    @property
    def dropped(self) -> int:
        return self._dropped

    def _lose(self, n: int) -> None:
        with self._count_lock:
            self._dropped += n
        if self._failing:
            self._lost_while_failing += n

    def start(self) -> None:
        self._thread.start()

    def offer(self, item: Accepted) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._lose(1)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most `timeout` seconds), then close the file."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        if self.space is None or self.space.allows(0):  # (a disk under the reserve: said, not opened)
            self._open()  # now, not at the first message: a path that cannot be written is said at start
        pending = 0  # lines written since the last flush: lost if the flush fails
        while True:
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                pending = self._flush(pending)
                if self._stop.is_set():
                    break
                continue
            batch = [item]
            with contextlib.suppress(queue.Empty):
                while len(batch) < BATCH:
                    batch.append(self._queue.get_nowait())
            pending = self._write(batch, pending)
            if pending >= FLUSH_EVERY or self._queue.empty():
                pending = self._flush(pending)
        self._flush(pending)
        if self._file is not None:
            self._close_file()
        self.converter.close()

    def _write(self, batch: list[Accepted], pending: int) -> int:
        if self.space is not None and not self.space.allows(len(batch)):
            self._lose(len(batch))
            return pending
        f = self._open()
        if f is None:
            self._lose(len(batch))
            return pending
        chunks = self.converter.lines([item.to_proto() for item in batch], compressed=self.compressed)
        try:
            for chunk in chunks:
                f.write(chunk)
        except OSError as exc:
            self._failed(exc, pending + len(batch))
            return 0
        return pending + len(batch)

    def _flush(self, pending: int) -> int:
        if self._file is None or pending == 0:
            return 0
        try:
            self._file.flush()
        except OSError as exc:
            self._failed(exc, pending)
            return 0
        self.written += pending
        if self._failing:
            log.warning(
                "recording to %s resumed; %d messages were lost while it failed",
                self.path,
                self._lost_while_failing,
            )
            self._failing, self._lost_while_failing = False, 0
        return 0

    def _open(self) -> IO[bytes] | None:
        if self._file is not None:
            return self._file
        if self._clock() < self._retry_at:
            return None
        try:
            self._file = self._opener(self.path)
        except OSError as exc:
            self._failed(exc, 0)
        return self._file

    def _failed(self, exc: OSError, lost: int) -> None:
        if not self._failing:
            log.error(
                "recording to %s failed: %s; messages are lost (gpufleet_controller_record_dropped_total) "
                "and the file is tried again every %.0f s; telemetry ingest goes on",
                self.path,
                exc.strerror or exc,
                self._retry_seconds,
            )
            self._failing = True
        self._lose(lost)
        self._retry_at = self._clock() + self._retry_seconds
        if self._file is not None:
            self._close_file()

    def _close_file(self) -> None:
        assert self._file is not None
        with contextlib.suppress(OSError):  # its unflushed lines were counted lost already
            self._file.close()
        self._file = None
