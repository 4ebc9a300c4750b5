"""Polls the BMC in its own thread on its own cadence (default 60 s), off the GPU sampling path:
a slow or dead BMC never delays a GPU reading. The sampling loop only takes the latest sample.

A BMC that cannot be reached is retried with capped exponential backoff (interval, 2x, 4x, ... up
to `backoff_max`, jittered), and logged once per backoff step rather than once per cycle.

Every poll has a deadline (`poll_timeout_seconds`, bmc.poll_timeout_seconds): the poll runs in a
worker thread, and one still running at the deadline is abandoned: the source is told to stop
(`interrupt()`, where it has one: the Redfish source cuts its request in flight), the poll counts as
a failed one (one log line, the backoff), and the next poll runs on time. A source that ignores the
interrupt is not polled again until its stuck poll ends; each skipped poll counts as failed too.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

from agent.sources.bmc import SECTIONS, BmcSample, BmcSectionStatus, BmcSource
from agent.sources.gpu import GpuInfo

log = logging.getLogger("gpufleet.agent.bmc")


class BmcPoller:
    def __init__(
        self,
        source: BmcSource,
        *,
        interval_seconds: float = 60.0,
        backoff_max_seconds: float = 600.0,
        gpus: Sequence[GpuInfo] = (),
        jitter: Callable[[], float] = random.random,
        poll_timeout_seconds: float | None = None,
    ) -> None:
        self.source = source
        self.interval = interval_seconds
        self.backoff_max = max(backoff_max_seconds, interval_seconds)
        self.gpus = list(gpus)
        self.jitter = jitter
        self.poll_timeout = poll_timeout_seconds  # None: wait for the source however long it takes
        self.failures = 0  # whole polls failed in a row
        self.abandoned = 0  # polls given up at their deadline, over the poller's life
        self._stuck: threading.Thread | None = None  # an abandoned poll's worker, until it ends
        self._lock = threading.Lock()
        self._latest: BmcSample | None = None
        self._taken: BmcSample | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> BmcSample:
        """One poll now (`gpufleet agent --once`, tests), within the deadline; kept as the latest."""
        sample = self.source.poll(self.gpus) if self.poll_timeout is None else self._bounded_poll()
        with self._lock:
            self._latest = sample
        return sample

    def _bounded_poll(self) -> BmcSample:
        """The source's poll, in a worker thread; an error sample when it passes the deadline."""
        assert self.poll_timeout is not None
        started = time.time()
        if self._stuck is not None and self._stuck.is_alive():
            return BmcSample(
                time=started,
                endpoint=self.source.endpoint,
                error="not polled: the previous poll, abandoned at its deadline, is still running",
            )
        self._stuck = None
        done: list[BmcSample] = []
        failed: list[BaseException] = []

        def work() -> None:
            try:
                done.append(self.source.poll(self.gpus))
            except Exception as exc:  # noqa: BLE001 - handed to the poller's thread, which logs it
                failed.append(exc)

        worker = threading.Thread(target=work, name="bmc-poll", daemon=True)
        worker.start()
        # A little grace past the deadline: the Redfish source ends its own poll at the deadline
        # with a better message (which request was cut) than this one can give.
        worker.join(self.poll_timeout + min(1.0, 0.1 * self.poll_timeout))
        if failed:
            raise failed[0]
        if done:
            return done[0]
        self.abandoned += 1
        interrupt = getattr(self.source, "interrupt", None)
        if callable(interrupt):
            interrupt()
        worker.join(0.5)
        if done:
            return done[0]  # it stopped when told: its own sample says which request was cut
        if worker.is_alive():
            self._stuck = worker
        error = f"poll abandoned: no answer within bmc.poll_timeout_seconds ({self.poll_timeout:g} s)"
        return BmcSample(
            time=started,
            endpoint=self.source.endpoint,
            poll_duration_seconds=time.time() - started,
            error=error,
            sections=[BmcSectionStatus(name, False, 0.0, f"not read: {error}") for name in SECTIONS],
        )

    def take(self) -> tuple[BmcSample | None, bool]:
        """The latest sample, and whether it is new since the previous take (a frame carries it then)."""
        with self._lock:
            latest = self._latest
            new = latest is not None and latest is not self._taken
            self._taken = latest
        return latest, new

    def next_delay(self, sample: BmcSample) -> float:
        """Seconds until the next poll: the interval, or the backoff after a failed poll."""
        if not sample.error:
            if self.failures:
                log.info("BMC %s answers again after %d failed polls", self.source.endpoint, self.failures)
            self.failures = 0
            return self.interval
        self.failures += 1
        # The exponent is capped: 2.0 ** 1024 overflows, and a BMC dead for a week gets there.
        delay = min(self.interval * 2.0 ** min(self.failures - 1, 32), self.backoff_max)
        delay *= 0.9 + 0.2 * self.jitter()  # BMCs of a rack that failed together do not retry together
        log.warning(
            "BMC %s poll failed (%d in a row): %s; next try in %.0f s",
            self.source.endpoint,
            self.failures,
            sample.error,
            delay,
        )
        return delay

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bmc-poller", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self.poll_once()
            except Exception:  # a source bug must not end BMC polling for the agent's lifetime
                log.exception("BMC %s poll raised; polling goes on", self.source.endpoint)
                delay = self.interval
            else:
                delay = self.next_delay(sample)
            self._stop.wait(delay)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop polling and log out. A poll still waiting on the BMC after `timeout` is left to its
        timeouts (the thread is a daemon) and the session to expire, rather than hold up shutdown."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning(
                    "BMC %s: a poll is still in flight at shutdown; not logging out", self.source.endpoint
                )
                return
        self.source.close()
