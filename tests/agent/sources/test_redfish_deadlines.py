"""Issue 15, bad input 7: a BMC that trickles its answer (one byte every 0.2 s, forever) never trips
a per-read timeout; every request and every poll still ends by its deadline, the poller goes on
polling, and the agent's GPU sampling never waits on the BMC."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from agent.config import load
from agent.daemon import Agent
from agent.sources.bmc import SECTIONS, BmcSample
from agent.sources.bmc_poller import BmcPoller
from agent.sources.gpu import GpuInfo
from agent.sources.redfish.bmc import RedfishBmc
from agent.sources.redfish.session import BmcEndpoint, BmcError, RedfishSession
from agent.sources.sim import SimNode
from agent.sources.sim.probes import ModelledProbes

pytestmark = pytest.mark.timeout(60)  # a regression hangs forever: fail it instead

STATUS_LINE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


class TricklingServer:
    """Answers every request on 127.0.0.1 one byte every `every` seconds, forever (until stop()).

    `headers_first`: the status line and headers arrive at once and the body trickles; else the
    status line itself trickles."""

    def __init__(self, *, headers_first: bool, every: float = 0.2) -> None:
        self.headers_first = headers_first
        self.every = every
        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            self.connections += 1
            worker = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
            self._threads.append(worker)
            worker.start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)  # the request (small: one segment)
                if self.headers_first:
                    conn.sendall(STATUS_LINE + b'{"a": "')
                source = b"x" if self.headers_first else STATUS_LINE
                i = 0
                while not self._stop.wait(self.every):
                    conn.sendall(source[i % len(source) : i % len(source) + 1])
                    i += 1
            except OSError:
                return  # the client hung up: what the deadline does

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._listener.close()


@pytest.fixture(params=[True, False], ids=["body-trickles", "status-line-trickles"])
def trickling(request: pytest.FixtureRequest) -> Iterator[TricklingServer]:
    server = TricklingServer(headers_first=request.param)
    yield server
    server.stop()


def test_one_request_ends_at_its_deadline(trickling: TricklingServer) -> None:
    # Each read gets a byte within 0.2 s, far inside the 2 s read timeout: only the whole-request
    # deadline can end it.
    endpoint = BmcEndpoint(trickling.url, read_timeout_seconds=2.0, request_timeout_seconds=1.0)
    session = RedfishSession(endpoint)
    start = time.monotonic()
    with pytest.raises(BmcError) as caught:
        session.open()
    assert caught.value.kind == "timeout"
    assert caught.value.message == f"GET {trickling.url}/redfish/v1/: no complete answer within 1 s"
    assert time.monotonic() - start < 30  # it ended at all (the test's own timeout is the real bound)
    assert not session.is_open


def test_request_deadline_defaults_to_connect_plus_read() -> None:
    assert BmcEndpoint("http://bmc", connect_timeout_seconds=2, read_timeout_seconds=3).request_budget == 5
    assert BmcEndpoint("http://bmc", request_timeout_seconds=7).request_budget == 7


def test_poll_ends_at_the_poll_deadline(trickling: TricklingServer) -> None:
    # Requests alone could take 25 s each; the poll's 1.5 s deadline cuts the one in flight.
    bmc = RedfishBmc(BmcEndpoint(trickling.url), poll_timeout_seconds=1.5)
    try:
        sample = bmc.poll()
    finally:
        bmc.close()
    assert not sample.success
    assert sample.error == f"GET {trickling.url}/redfish/v1/: the poll ran past its deadline of 1.5 s"
    assert [s.name for s in sample.sections] == list(SECTIONS)
    assert all(s.error.startswith("not read: ") for s in sample.sections)
    assert sample.poll_duration_seconds < 25  # not the 25 s request budget


def test_poller_counts_a_trickled_poll_as_failed_and_polls_again(
    trickling: TricklingServer, caplog: pytest.LogCaptureFixture
) -> None:
    bmc = RedfishBmc(BmcEndpoint(trickling.url), poll_timeout_seconds=0.5)
    poller = BmcPoller(bmc, interval_seconds=0.2, backoff_max_seconds=0.2, poll_timeout_seconds=0.5)
    poller.start()
    try:
        deadline = time.monotonic() + 30
        while poller.failures < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        poller.stop(timeout=5)
    assert poller.failures >= 3  # each poll ended, failed, and the next one ran
    assert trickling.connections >= 3
    warnings = [r.getMessage() for r in caplog.records if "poll failed" in r.getMessage()]
    assert len(warnings) >= 3 and all("\n" not in w for w in warnings)
    assert "ran past its deadline of 0.5 s" in warnings[0]


class StuckBmc:
    """A BMC source whose poll blocks until released and ignores interrupts (a source bug)."""

    endpoint = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.polls = 0
        self.returned = 0

    def poll(self, gpus: Sequence[GpuInfo] = ()) -> BmcSample:
        self.polls += 1
        self.release.wait(30)
        self.returned += 1
        return BmcSample(time=time.time(), success=True, endpoint=self.endpoint)

    def close(self) -> None:
        self.release.set()


class InterruptibleBmc(StuckBmc):
    def interrupt(self) -> None:
        self.release.set()


def test_poller_abandons_a_poll_past_its_deadline() -> None:
    source = StuckBmc()
    poller = BmcPoller(source, interval_seconds=60, poll_timeout_seconds=0.3, jitter=lambda: 0.5)
    sample = poller.poll_once()
    assert sample.error == "poll abandoned: no answer within bmc.poll_timeout_seconds (0.3 s)"
    assert poller.abandoned == 1 and poller.next_delay(sample) == 60 and poller.failures == 1
    # The stuck poll is not joined by a second one on the same source; it counts as failed too.
    again = poller.poll_once()
    assert again.error.startswith("not polled: the previous poll") and source.polls == 1
    source.release.set()  # the stuck poll ends; the next one answers at once
    for _ in range(500):  # until the stuck worker has ended (skipped polls never reach the source)
        last = poller.poll_once()
        if not last.error.startswith("not polled"):
            break
        time.sleep(0.01)
    assert last.success and source.polls == 2 and source.returned == 2


def test_poller_interrupts_the_source_at_the_deadline() -> None:
    source = InterruptibleBmc()
    poller = BmcPoller(source, interval_seconds=60, poll_timeout_seconds=0.3)
    poller.poll_once()
    assert source.release.is_set()  # told to stop; it did, so the next poll runs
    assert poller.poll_once().success and source.polls == 2


def test_agent_samples_gpus_while_the_bmc_trickles() -> None:
    server = TricklingServer(headers_first=True)
    config = load(
        None, {"node": "n1", "source": "sim", "sim": {"gpus": 2}, "bmc": {"poll_timeout_seconds": 1}}
    )
    sim = SimNode("n1", gpus=2)
    bmc = RedfishBmc(BmcEndpoint(server.url), poll_timeout_seconds=config.bmc.poll_timeout_seconds)
    agent = Agent(config, sim, None, ModelledProbes(sim), bmc=bmc)
    assert agent.bmc is not None and agent.bmc.poll_timeout == 1
    agent.bmc.start()
    try:
        while server.connections == 0:
            time.sleep(0.01)
        during = [agent.sample() for _ in range(5)]  # the first poll is in flight
        deadline = time.monotonic() + 30
        while agent.bmc.failures == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = agent.sample()
    finally:
        agent.close()
        server.stop()
    assert all(len(s.gpus) == 2 and s.collectors["gpu"].success for s in during)
    assert after.collectors["gpu"].success and len(after.gpus) == 2
    assert not after.collectors["bmc"].success
    assert "ran past its deadline of 1 s" in after.collectors["bmc"].error
