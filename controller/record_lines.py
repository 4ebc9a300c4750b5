"""Recorded messages as JSON lines, made in processes of their own.

The protobuf JSON mapping is pure Python: json_format walks every field, about 2 ms an 8-GPU frame
(controller/record_json.py, which gives the same bytes, 1.1-1.3). `controller --record` made its
lines on a thread of its own, but a thread holds the interpreter while it runs Python: fed 500 frames
a second (5,000 nodes at a 10 s cadence) it took a quarter of the event loop's time and still wrote
only ~150 frames a second. A `Converter` sends
batches of serialised RecordedMessages to `workers` child processes (`python -m
controller.record_lines`, started by subprocess as the controller's other children are: no fork of
the controller) and reads their lines back, in order; meanwhile the calling thread waits on pipes,
which leaves the interpreter to the event loop. `gpufleet record` makes its lines the same way.

Pipe protocol. To a worker: a u32 count, then each message as a u32 length and its bytes. Back: a
u32 length and the batch's lines (UTF-8). A worker reads a whole batch before it answers, so one
batch in flight to each worker cannot deadlock. A worker that cannot be started, dies, or does not
take its batch or answer within ANSWER_SECONDS: its batch is converted on the calling thread
(nothing is lost), one warning is logged, and a new worker is started for the next batch. A worker
ends when its stdin closes (the controller closed it, or died).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import logging
import os
import select
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import BinaryIO

from google.protobuf import json_format

from controller import children, record_json
from protos.gpufleet.v1 import operator_pb2

log = logging.getLogger("gpufleet.controller.recording")
WORKERS = 2  # processes a Converter spreads each batch over
PIPE_BYTES = 1 << 20  # each worker's pipes (Linux's default pipe-max-size; 64 KB otherwise)
ANSWER_SECONDS = 30.0  # a worker that takes longer on one batch is taken for hung
_U32 = struct.Struct("<I")


def to_json_line(msg: operator_pb2.RecordedMessage) -> str:
    """One line of a recording (ends with a newline): the protobuf JSON mapping's, made by
    controller/record_json.py, or by json_format for what that does not take."""
    try:
        return record_json.to_json(msg) + "\n"
    except Exception:  # noqa: BLE001 - record_json.Unsupported, or a case it got wrong: json_format's
        return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=None) + "\n"


def parse_line(text: str) -> operator_pb2.RecordedMessage:
    """json_format.Parse(text) into a RecordedMessage (its ParseError for a line that is not one), by
    controller/record_json.py where it takes the line."""
    try:
        return record_json.from_json(text, operator_pb2.RecordedMessage)
    except Exception:  # noqa: BLE001 - record_json.Unsupported, or a case it got wrong: json_format's
        return json_format.Parse(text, operator_pb2.RecordedMessage())


def json_lines(payloads: Sequence[bytes]) -> str:
    """The lines of serialised RecordedMessages, in order."""
    out = []
    for payload in payloads:
        msg = operator_pb2.RecordedMessage()
        msg.ParseFromString(payload)
        out.append(to_json_line(msg))
    return "".join(out)


def parsed_lines(lines: Sequence[bytes]) -> bytes:
    """Each line of a recording parsed: a serialised RecordedMessage, or why it is not one; packed
    (u8 1 and the message, or u8 0 and the reason, each with its u32 length) for unpack_parsed."""
    parts: list[bytes] = []
    for line in lines:
        try:
            msg = parse_line(line.decode("utf-8", errors="replace"))
        except (json_format.ParseError, ValueError) as exc:
            why = (str(exc).splitlines()[0][:200] if str(exc) else "not JSON").encode("utf-8")
            parts += (b"\0", _U32.pack(len(why)), why)
            continue
        data = msg.SerializeToString()
        parts += (b"\1", _U32.pack(len(data)), data)
    return b"".join(parts)


def unpack_parsed(blob: bytes) -> list[tuple[bool, bytes]]:
    out, at = [], 0
    while at < len(blob):
        ok, (size,) = blob[at] == 1, _U32.unpack_from(blob, at + 1)
        at += 1 + _U32.size
        out.append((ok, blob[at : at + size]))
        at += size
    return out


MAKE_LINES, PARSE_LINES, MAKE_GZIP = 0, 1, 2  # what a batch asks of a worker
GZIP_LEVEL = 1  # ~10x smaller than the JSON at ~0.14 ms a frame; level 6 ~14x at ~0.36 ms


def gzip_member(items: Sequence[bytes]) -> bytes:
    """The lines of serialised RecordedMessages as one gzip member (a recording named .gz is these,
    one after another: a valid gzip file)."""
    return gzip.compress(json_lines(items).encode("utf-8"), compresslevel=GZIP_LEVEL, mtime=0)


JOBS = {
    MAKE_GZIP: gzip_member,
    MAKE_LINES: lambda items: json_lines(items).encode("utf-8"),
    PARSE_LINES: parsed_lines,
}


def _batch(kind: int, payloads: Sequence[bytes]) -> bytes:
    parts = [bytes([kind]), _U32.pack(len(payloads))]
    for payload in payloads:
        parts += (_U32.pack(len(payload)), payload)
    return b"".join(parts)


def _split(items: Sequence[bytes], n: int) -> list[Sequence[bytes]]:
    """`items` in at most `n` consecutive runs of about equal length (none empty)."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    runs, at = [], 0
    for i in range(n):
        end = at + size + (i < extra)
        runs.append(items[at:end])
        at = end
    return runs


class WorkerFailed(Exception):
    """A worker could not be started, died, or did not answer in time."""


class _Worker:
    def __init__(self) -> None:
        try:
            self.process = children.popen(
                [sys.executable, "-m", "controller.record_lines"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
        except OSError as exc:
            raise WorkerFailed(f"cannot start a worker: {exc.strerror or exc}") from exc
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError, AttributeError):  # Linux: fewer, larger reads and writes
                fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[union-attr]
        assert self.process.stdin is not None
        os.set_blocking(self.process.stdin.fileno(), False)  # a hung worker cannot hold a write

    def send(self, kind: int, payloads: Sequence[bytes], timeout: float) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        deadline, fd = time.monotonic() + timeout, stdin.fileno()
        data = memoryview(_batch(kind, payloads))
        try:
            while data:
                wait = deadline - time.monotonic()
                if wait <= 0 or not select.select([], [fd], [], wait)[1]:
                    raise WorkerFailed(f"worker {self.process.pid} took no input for {timeout:.0f} s")
                with contextlib.suppress(BlockingIOError):
                    data = data[os.write(fd, data) :]
        except OSError as exc:  # BrokenPipeError: it died
            raise WorkerFailed(f"worker {self.process.pid} is gone: {exc.strerror or exc}") from exc

    def receive(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        (size,) = _U32.unpack(self._read(_U32.size, deadline, timeout))
        return self._read(size, deadline, timeout)

    def _read(self, n: int, deadline: float, timeout: float) -> bytes:
        stdout = self.process.stdout
        assert stdout is not None
        fd, chunks, left = stdout.fileno(), [], n
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise WorkerFailed(f"worker {self.process.pid} did not answer within {timeout:.0f} s")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise WorkerFailed(f"worker {self.process.pid} ended (exit status {self.process.poll()})")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def stop(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class Converter:
    """JSON lines of RecordedMessages, made by `workers` child processes (started when first
    needed; 0: on the calling thread), as UTF-8: what is written to a recording, without a decode
    here and an encode again to write it; and the lines of a recording parsed back (~1.3 ms of pure
    Python an 8-GPU frame, ~6 by json_format: `gpufleet analyze` spreads it over the machine's
    cores). For one thread at a time."""

    def __init__(self, workers: int = WORKERS, *, answer_seconds: float = ANSWER_SECONDS) -> None:
        self.workers = workers
        self.answer_seconds = answer_seconds
        self.fallbacks = 0  # batches converted on the calling thread because a worker failed
        self._pool: list[_Worker | None] = [None] * workers
        self._failing = False

    def lines(
        self, messages: Sequence[operator_pb2.RecordedMessage], *, compressed: bool = False
    ) -> list[bytes]:
        """The messages' lines, in order, in a few chunks (one a worker); compressed: each chunk a
        gzip member."""
        return self._run(MAKE_GZIP if compressed else MAKE_LINES, [m.SerializeToString() for m in messages])

    def parse(self, lines: Sequence[bytes]) -> list[tuple[bool, bytes]]:
        """Each line of a recording parsed (gpufleet analyze): (True, a serialised RecordedMessage)
        or (False, why it is not one, UTF-8), in order."""
        return [item for blob in self._run(PARSE_LINES, lines) for item in unpack_parsed(blob)]

    def _run(self, kind: int, payloads: Sequence[bytes]) -> list[bytes]:
        if not payloads:
            return []
        if self.workers <= 0:
            return [JOBS[kind](payloads)]
        runs = _split(payloads, self.workers)
        sent = [(i, self._send(i, kind, run), run) for i, run in enumerate(runs)]  # one to each, then
        return [self._receive(i, worker, kind, run) for i, worker, run in sent]  # their answers, in order

    def _send(self, i: int, kind: int, run: Sequence[bytes]) -> _Worker | None:
        try:
            worker = self._pool[i] or _Worker()
            self._pool[i] = worker
            worker.send(kind, run, self.answer_seconds)
        except WorkerFailed as exc:
            self._failed(i, exc)
            return None
        return worker

    def _receive(self, i: int, worker: _Worker | None, kind: int, run: Sequence[bytes]) -> bytes:
        if worker is not None:
            try:
                text = worker.receive(self.answer_seconds)
            except WorkerFailed as exc:
                self._failed(i, exc)
            else:
                if self._failing:
                    log.warning("recording: JSON lines are converted by worker processes again")
                    self._failing = False
                return text
        self.fallbacks += 1
        return JOBS[kind](run)

    def _failed(self, i: int, exc: WorkerFailed) -> None:
        worker, self._pool[i] = self._pool[i], None
        if worker is not None:
            with contextlib.suppress(OSError):
                worker.process.kill()
            worker.stop()
        if not self._failing:
            log.warning(
                "recording: %s; its batch is converted on the calling thread, a new worker next batch",
                exc,
            )
            self._failing = True

    def close(self) -> None:
        for i, worker in enumerate(self._pool):
            if worker is not None:
                worker.stop()
            self._pool[i] = None


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return data


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """A worker: answer each batch on `stdin` on `stdout`, until stdin ends."""
    while True:
        try:
            kind = _read_exact(stdin, 1)[0]
            (count,) = _U32.unpack(_read_exact(stdin, _U32.size))
            payloads = [
                _read_exact(stdin, _U32.unpack(_read_exact(stdin, _U32.size))[0]) for _ in range(count)
            ]
        except EOFError:
            return
        data = JOBS[kind](payloads)
        stdout.write(_U32.pack(len(data)))
        stdout.write(data)
        stdout.flush()


if __name__ == "__main__":
    children.ignore_stop_signals()  # Ctrl-C and a service stop are the controller's (or gpufleet record's)
    serve(sys.stdin.buffer, sys.stdout.buffer)
