"""`gpufleet record`'s writing: a thread takes the stream's messages, has their JSON lines made in
batches by a Converter (controller/record_lines.py: worker processes, ~1.5 ms of pure Python an
8-GPU frame otherwise, so one process kept up with ~600 frames a second: a fleet of 6,000 nodes)
and appends them to the file, while the main thread goes on reading the stream.

The queue between them is bounded: a writer that falls behind holds back the reading, and the
controller counts what its queue for this reader then loses (dropped_before), as for any slow
reader. A write error (a full disk) stops the writer; `put` then says so and the recording ends.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import IO

from controller.record_lines import Converter
from protos.gpufleet.v1 import operator_pb2

QUEUE = 4096  # messages read but not yet written
BATCH = 64  # messages made into lines at once
_END = None  # after the last message


class RecordWriter:
    """Appends each message `put` to `sink` (binary: the lines are UTF-8), calling `written(msg)` once
    its line is in the file."""

    def __init__(
        self,
        sink: IO[bytes],
        written: Callable[[operator_pb2.RecordedMessage], None],
        converter: Converter | None = None,
        *,
        failed: Callable[[], object] = lambda: None,
        compressed: bool = False,
    ) -> None:
        self.sink = sink
        self.written = written
        self.failed = failed  # called once writing has failed (the reading can stop then)
        self.converter = converter or Converter()
        self.compressed = compressed  # each batch a gzip member (a recording named .gz)
        self.error: OSError | None = None
        self._queue: queue.Queue[operator_pb2.RecordedMessage | None] = queue.Queue(QUEUE)
        self._thread = threading.Thread(target=self._run, name="record-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, msg: operator_pb2.RecordedMessage | None) -> bool:
        """Queue `msg` (waiting while the queue is full); False once writing has failed."""
        while self.error is None:
            try:
                self._queue.put(msg, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def finish(self) -> None:
        """Write what is queued, then stop the thread and the converter's workers."""
        if self._thread.is_alive():
            self.put(_END)
            self._thread.join()
        self.converter.close()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < BATCH and batch[-1] is not _END:
                    batch.append(self._queue.get_nowait())
            messages = [m for m in batch if m is not _END]
            if messages:
                try:
                    for chunk in self.converter.lines(messages, compressed=self.compressed):
                        self.sink.write(chunk)
                    self.sink.flush()
                except OSError as exc:
                    self.error = exc
                    self.failed()
                    return
                for msg in messages:
                    self.written(msg)
            if batch[-1] is _END:
                return
