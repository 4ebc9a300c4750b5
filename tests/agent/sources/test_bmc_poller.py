"""The BMC poller: its own thread and cadence, capped backoff, and never in the GPU sampling path."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from agent.config import load
from agent.daemon import Agent
from agent.probes.base import NoProbes
from agent.sources.bmc import BmcSample
from agent.sources.bmc_poller import BmcPoller
from agent.sources.gpu import GpuInfo
from agent.sources.sim import SimNode


class ScriptedBmc:
    """A BmcSource whose polls fail or succeed as told, optionally blocking until released."""

    endpoint = "https://bmc.test"

    def __init__(self, errors: Sequence[str] = (), *, block: threading.Event | None = None) -> None:
        self.errors = list(errors)
        self.block = block
        self.polls = 0
        self.closed = 0
        self.seen_gpus: list[GpuInfo] = []
        self.polling = threading.Event()

    def poll(self, gpus: Sequence[GpuInfo] = ()) -> BmcSample:
        self.polls += 1
        self.seen_gpus = list(gpus)
        self.polling.set()
        if self.block is not None:
            self.block.wait(10)
        error = self.errors.pop(0) if self.errors else ""
        if error == "raise":
            raise RuntimeError("source bug")
        return BmcSample(time=time.time(), endpoint=self.endpoint, success=not error, error=error)

    def close(self) -> None:
        self.closed += 1


def test_backoff_doubles_from_the_interval_up_to_the_cap_and_resets() -> None:
    poller = BmcPoller(ScriptedBmc(), interval_seconds=60, backoff_max_seconds=300, jitter=lambda: 0.5)
    failed = BmcSample(time=0.0, error="cannot connect")
    assert [poller.next_delay(failed) for _ in range(5)] == [60, 120, 240, 300, 300]
    assert poller.failures == 5
    assert poller.next_delay(BmcSample(time=0.0, success=True)) == 60
    assert poller.failures == 0
    jittered = BmcPoller(ScriptedBmc(), interval_seconds=60, jitter=lambda: 1.0)
    assert jittered.next_delay(failed) == 66.0  # +10 %: a rack that failed together spreads out


def test_backoff_stays_at_the_cap_after_a_week_of_failures() -> None:
    # 2.0 ** 1024 overflows: a BMC dead for ~1000 polls must not end the poller thread.
    poller = BmcPoller(ScriptedBmc(), interval_seconds=60, backoff_max_seconds=600, jitter=lambda: 0.5)
    poller.failures = 1100
    assert poller.next_delay(BmcSample(time=0.0, error="cannot connect")) == 600
    assert poller.failures == 1101


def test_a_partial_poll_is_not_a_failure_to_back_off_from() -> None:
    poller = BmcPoller(ScriptedBmc(), interval_seconds=60, jitter=lambda: 0.5)
    partial = BmcSample(time=0.0, success=False)  # a section failed, the BMC answered
    assert poller.next_delay(partial) == 60 and poller.failures == 0


def test_take_marks_each_poll_new_once() -> None:
    poller = BmcPoller(ScriptedBmc(), gpus=[GpuInfo(0, "GPU-x", "H100", serial="S")])
    assert poller.take() == (None, False)
    first = poller.poll_once()
    assert poller.take() == (first, True)
    assert poller.take() == (first, False)
    assert poller.poll_once() is not first
    assert poller.take()[1] is True
    assert [g.serial for g in poller.source.seen_gpus] == ["S"]  # type: ignore[attr-defined]


def test_thread_polls_survives_a_raising_source_and_logs_out_on_stop() -> None:
    source = ScriptedBmc(errors=["raise", "", ""])
    poller = BmcPoller(source, interval_seconds=0.01, backoff_max_seconds=0.02)
    poller.start()
    deadline = time.monotonic() + 5
    while source.polls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    poller.stop()
    assert source.polls >= 3
    latest, _ = poller.take()
    assert latest is not None and latest.success
    assert source.closed == 1


def test_stop_does_not_wait_for_a_hung_bmc() -> None:
    release = threading.Event()
    source = ScriptedBmc(block=release)
    poller = BmcPoller(source, interval_seconds=60)
    poller.start()
    assert source.polling.wait(5)
    start = time.monotonic()
    poller.stop(timeout=0.2)
    # The poll hangs until `release`, set below: a stop that waited for it would never return, one
    # that ignored its timeout would take stop's default 2 s. Room for a loaded CI machine's stalls.
    assert time.monotonic() - start < 1.5
    assert source.closed == 0  # the poll in flight still uses the session: no logout under it
    release.set()


def test_gpu_sampling_never_waits_for_the_bmc() -> None:
    """A BMC that hangs mid-poll: every sampling cycle still returns at once with GPU readings."""
    release = threading.Event()
    source = ScriptedBmc(block=release)
    config = load(None, {"source": "sim", "node": "n1", "sim": {"gpus": 2}})
    agent = Agent(config, SimNode("n1", gpus=2), None, NoProbes("none"), bmc=source)
    assert agent.bmc is not None
    agent.bmc.start()
    try:
        assert source.polling.wait(5)
        for _ in range(3):
            start = time.perf_counter()
            snapshot = agent.sample()
            assert time.perf_counter() - start < 2.0  # the BMC hangs until `release`; slack for load
            assert len(snapshot.gpus) == 2
            assert snapshot.bmc is None and "bmc" in snapshot.collectors  # nothing to show yet
        assert [g.index for g in source.seen_gpus] == [0, 1]  # the poller got the inventory
        release.set()
        deadline = time.monotonic() + 5
        while agent.sample().bmc is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        release.set()
        agent.close()
    assert source.closed == 1


def test_no_bmc_configured_means_no_bmc_collector() -> None:
    config = load(None, {"source": "sim", "node": "n1", "sim": {"gpus": 1}, "bmc": {"simulated": False}})
    agent = Agent(config, SimNode("n1", gpus=1), None, NoProbes("none"))
    snapshot = agent.sample()
    agent.close()
    assert "bmc" not in snapshot.collectors and snapshot.bmc is None
