"""Reading a recording (JSON Lines of RecordedMessages) back in order of receive time, for
`gpufleet analyze`, without holding it whole.

A recording is written in the order its messages were accepted, so it is in receive order but for a
clock stepped back or files joined together (one compressed with gzip, as a name ending .gz has it
written, is read the same, member by member: gzip_lines.py). `in_order` reads it as a stream: a
thread reads the file and has its lines parsed in the converter's worker processes (the JSON mapping
is ~1.3 ms of pure Python an 8-GPU frame) a few batches ahead of the replay, which runs meanwhile;
the messages pass through a window of `window` messages, kept serialised and let out smallest
receive time first. A message received before one already let out cannot be put in its place:
OutOfOrder is raised, and the caller reads the file again with window=None (every message kept,
let out at the end: the whole recording sorted in memory). Held whole, each 8-GPU frame added
~9 KB of RSS, an hour of a 1,000-node fleet ~3.4 GB; through the window analyze's RSS stays at
~150 MB whatever the length (100 nodes: 147 MB at 16,100 messages, 150 MB at 40,100;
bench/analyze_recording.py).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

from controller.cli.gzip_lines import Damage, recording_lines
from controller.record_lines import Converter
from protos.gpufleet.v1 import operator_pb2

PARSE_WORKERS = 8  # processes a recording's lines are parsed in, at most (one a core)
PARSE_BATCH = 512  # lines parsed at once
AHEAD = 2  # parsed batches the reading thread may hold ready beyond the one being replayed
REORDER_WINDOW = 4096  # messages held back to put near-ordered lines in receive order
ERRORS_SHOWN = 10  # malformed lines kept by line number and reason; the rest only counted
_POLL_SECONDS = 0.2  # how often a thread blocked on a full or empty queue looks for the other's end

# A parsed batch: (line number, True and a serialised RecordedMessage, or False and why it is not one)
_Batch = list[tuple[int, bool, bytes]]


class OutOfOrder(Exception):
    """A message was received before one already let out of the window."""

    def __init__(self, path: str, line: int, received: float, after: float, window: int) -> None:
        super().__init__(
            f"line {line} was received {after - received:.3f} s before a message already replayed "
            f"(out of order by more than {window} messages)"
        )
        self.path, self.line = path, line


@dataclass(slots=True)
class RecordingStats:
    """What the summary says of a recording, counted as it is read."""

    size: int = 0  # the file's bytes
    read: int = 0  # bytes read so far
    messages: int = 0
    hellos: int = 0
    frames: int = 0
    dropped: int = 0  # messages the recorder lost (dropped_before)
    nodes: set[str] = field(default_factory=set)
    bad: list[tuple[int, str]] = field(default_factory=list)  # the first ERRORS_SHOWN (line, why)
    bad_lines: int = 0
    first: float | None = None  # earliest receive time
    last: float | None = None  # latest
    damage: Damage = field(default_factory=Damage)  # compressed parts skipped (gzip_lines.py)

    def span(self) -> float:
        """Seconds from the first message received to the last."""
        return self.last - self.first if self.first is not None and self.last is not None else 0.0

    def malformed(self, line: int, why: str) -> None:
        self.bad_lines += 1
        if len(self.bad) < ERRORS_SHOWN:
            self.bad.append((line, why))


def total(stats: Sequence[RecordingStats]) -> RecordingStats:
    """Several recordings' counts as one (their malformed lines' first few not kept)."""
    out = RecordingStats()
    for s in stats:
        out.size += s.size
        out.read += s.read
        out.messages += s.messages
        out.hellos += s.hellos
        out.frames += s.frames
        out.dropped += s.dropped
        out.nodes |= s.nodes
        out.bad_lines += s.bad_lines
        out.damage.parts += s.damage.parts
        out.damage.bytes += s.damage.bytes
    out.first = min((s.first for s in stats if s.first is not None), default=None)
    out.last = max((s.last for s in stats if s.last is not None), default=None)
    return out


def received_seconds(msg: operator_pb2.RecordedMessage) -> float:
    return msg.received.seconds + msg.received.nanos / 1e9


def in_order(
    path: str,
    stats: RecordingStats,
    *,
    window: int | None = REORDER_WINDOW,
    converter: Converter | None = None,
    each_batch: Callable[[], None] = lambda: None,
    batch: int | None = None,
) -> Generator[operator_pb2.RecordedMessage, None, None]:
    """The recording's well-formed messages in order of receive time (file order among equal times),
    counted into `stats` as read (each_batch called after each batch of lines is counted: progress);
    window=None: the whole file sorted in memory; batch: lines parsed at once (PARSE_BATCH). Raises
    OSError when the file cannot be opened or read, OutOfOrder when a message falls behind the
    window."""
    source = open(path, "rb")  # noqa: SIM115 (handed to the reading thread, which closes it)
    with contextlib.suppress(OSError):
        stats.size = os.fstat(source.fileno()).st_size
    converter = converter or Converter(min(PARSE_WORKERS, os.cpu_count() or 1))
    reader = _Reader(source, converter, stats, batch or PARSE_BATCH)
    reader.start()
    held: list[tuple[float, int, bytes]] = []  # (received, line, message): a heap
    let_out: float | None = None  # the receive time of the last message let out
    try:
        for parsed in reader.batches():
            for number, ok, data in parsed:
                received = _count(stats, number, ok, data)
                if received is None:
                    continue
                if let_out is not None and received < let_out:
                    raise OutOfOrder(path, number, received, let_out, window or 0)
                heapq.heappush(held, (received, number, data))
                if window is not None and len(held) > window:
                    let_out, _, out = heapq.heappop(held)
                    yield operator_pb2.RecordedMessage.FromString(out)
            each_batch()
        while held:
            _, _, out = heapq.heappop(held)
            yield operator_pb2.RecordedMessage.FromString(out)
    finally:
        reader.stop()


def _count(stats: RecordingStats, number: int, ok: bool, data: bytes) -> float | None:
    """The message's receive time, counted into stats; None for a malformed line (counted too)."""
    if not ok:
        stats.malformed(number, data.decode("utf-8", errors="replace"))
        return None
    msg = operator_pb2.RecordedMessage.FromString(data)
    if msg.message.WhichOneof("msg") not in ("hello", "frame"):
        stats.malformed(number, "the message is neither a hello nor a frame")
        return None
    if not msg.HasField("received"):
        stats.malformed(number, "no received time")
        return None
    received = received_seconds(msg)
    stats.messages += 1
    stats.dropped += msg.dropped_before
    if msg.message.HasField("hello"):
        stats.hellos += 1
    else:
        stats.frames += 1
    stats.nodes.add(msg.node)
    stats.first = received if stats.first is None else min(stats.first, received)
    stats.last = received if stats.last is None else max(stats.last, received)
    return received


class _Reader(threading.Thread):
    """Reads the file and has its lines parsed, up to AHEAD batches ahead of the replay. The converter's
    workers do the parsing; this thread mostly waits on their pipes, leaving the interpreter to the
    replay. Ends (closing the file and the converter) at the file's end, on an error (handed on to
    the replay), or when stopped."""

    def __init__(self, source: IO[bytes], converter: Converter, stats: RecordingStats, batch: int) -> None:
        super().__init__(name="gpufleet-analyze-reader", daemon=True)
        self.source = source
        self.batch = batch
        self.converter = converter
        self.stats = stats
        self.parsed: queue.Queue[_Batch | BaseException | None] = queue.Queue(maxsize=AHEAD)
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            compressed, source = recording_lines(self.source, self.stats.damage, self._read)
            lines: list[tuple[int, bytes]] = []
            for number, line in enumerate(source, start=1):
                if not compressed:
                    self.stats.read += len(line)
                if line.strip():
                    lines.append((number, line))
                if len(lines) >= self.batch:
                    if not self._hand_on(self._parse(lines)):
                        return
                    lines = []
            self.stats.read = self.stats.size or self.stats.read
            if self._hand_on(self._parse(lines)):
                self._hand_on(None)
        except Exception as exc:  # noqa: BLE001 - an OSError reading, or a bug: the replay raises it
            self._hand_on(exc)
        finally:
            self.source.close()
            self.converter.close()

    def _read(self, n: int) -> None:
        self.stats.read += n

    def _parse(self, lines: list[tuple[int, bytes]]) -> _Batch:
        parsed = self.converter.parse([text for _, text in lines])
        return [(number, ok, data) for (number, _), (ok, data) in zip(lines, parsed, strict=True)]

    def _hand_on(self, item: _Batch | BaseException | None) -> bool:
        """Queue `item` for the replay; False if it stopped meanwhile."""
        while not self.stopping.is_set():
            try:
                self.parsed.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def batches(self) -> Iterator[_Batch]:
        while True:
            try:
                item = self.parsed.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not self.is_alive() and self.parsed.empty():
                    raise RuntimeError("the recording's reading thread ended without a word") from None
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def stop(self) -> None:
        """End the thread (it may be mid-batch: that batch's parse finishes first) and wait for it."""
        self.stopping.set()
        self.join()


__all__ = ["OutOfOrder", "RecordingStats", "in_order", "received_seconds", "total"]
