"""XID errors from an NVML event set, waited on in a thread of their own."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.sources.gpu import XidCount, XidEvent
from agent.sources.nvml.query import address, error_code

log = logging.getLogger(__name__)

MAX_EVENTS = 1000  # events kept per GPU between takes (an XID storm); the counts stay exact


class XidWatcher:
    """Counts the XID errors NVML reports, per GPU and code, and keeps the events until taken.

    One daemon thread waits on one event set for every registered GPU, `wait_ms` at a time so that
    `stop` returns promptly. NVML errors are logged and retried after a pause that doubles up to
    `backoff_s[1]`. XIDs of a GPU that fell off the bus (79) are counted like any other: the event
    names the device handle, which stays valid.
    """

    def __init__(
        self,
        nvml: Any,
        *,
        wait_ms: int,
        backoff_s: tuple[float, float],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._backoff_s = backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._set: Any = None
        self._thread: threading.Thread | None = None
        self._gpus: dict[int, int] = {}  # handle address -> GPU index
        self._events: dict[int, collections.deque[XidEvent]] = {}
        self._counts: dict[int, collections.Counter[int]] = {}

    def watch(self, nvml: Any, index: int, handle: Any) -> bool:
        """Register GPU `index` for XID events (a query call: raises NVMLError when it cannot)."""
        with self._lock:
            if self._stop.is_set():
                return False
            if self._set is None:
                self._set = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
            self._gpus[address(handle)] = index
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
                self._thread.start()
        return True

    def take(self, index: int) -> tuple[list[XidEvent], list[XidCount]]:
        """GPU `index`'s XIDs since the previous take, and its totals per code since the start."""
        with self._lock:
            events = list(self._events.pop(index, ()))
            counts = sorted(self._counts.get(index, {}).items())
        return events, [XidCount(code, total) for code, total in counts]

    def has_any(self, index: int) -> bool:
        with self._lock:
            return bool(self._counts.get(index))

    def stop(self) -> None:
        """Stop the thread (within about `wait_ms`) and free the event set."""
        with self._lock:
            self._stop.set()
            thread, event_set = self._thread, self._set
        if thread is not None:
            thread.join(timeout=self._wait_ms / 1000.0 + 1.0)
            if thread.is_alive():
                # Still inside NVML: freeing the set under it would be worse than leaking it.
                log.warning("nvml: the XID thread did not stop in time; leaving its event set")
                return
        if event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(event_set)
            except self._nvml.NVMLError as exc:
                log.warning("nvml: cannot free the XID event set: %s", exc)

    def _run(self) -> None:
        nvml = self._nvml
        first, longest = self._backoff_s
        pause = first
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, self._wait_ms)
            except nvml.NVMLError as exc:
                if error_code(exc) == nvml.NVML_ERROR_TIMEOUT:
                    pause = first
                    continue
                log.warning("nvml: waiting for XID events failed: %s; retrying in %.1f s", exc, pause)
                self._stop.wait(pause)
                pause = min(pause * 2, longest)
                continue
            except Exception:  # the watcher must outlive one bad event; it is logged
                log.exception("nvml: XID watcher error; retrying in %.1f s", pause)
                self._stop.wait(pause)
                pause = min(pause * 2, longest)
                continue
            pause = first
            if int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                self._record(data.device, int(data.eventData))

    def _record(self, device: Any, code: int) -> None:
        with self._lock:
            index = self._gpus.get(address(device))
            if index is None:
                log.warning("nvml: XID %d from a GPU this source does not watch", code)
                return
            events = self._events.setdefault(index, collections.deque(maxlen=MAX_EVENTS))
            events.append(XidEvent(code, self._clock()))
            self._counts.setdefault(index, collections.Counter())[code] += 1
