"""The leader election on a Kubernetes Lease (controller/kube/lease.py) against the fake API server:
one holder at a time, a standby takes over only once the holder's record has stood still for the
lease's duration by its own clock, a release hands over at once, concurrent takers meet a 409, and a
holder that cannot renew steps down within the renew deadline."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.kube.api import KubeApi
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import lease
from controller.kube.lease import CALL_TIMEOUT, KubeLease
from controller.store.lease import BothLeases
from tests.controller.harness import Clock
from tests.kube.harness import api_for

NS = "gpufleet"
NAME = "gpufleet-controller"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        yield s


@pytest.fixture
def api(tmp_path: Path, server: FakeApiServer) -> KubeApi:
    return api_for(tmp_path, server)


def spec(server: FakeApiServer) -> dict[str, object]:
    obj = server.get("Lease", NAME, NS)
    assert obj is not None
    found: dict[str, object] = obj["spec"]
    return found


def candidate(api: KubeApi, holder: str, clock: Clock) -> KubeLease:
    return KubeLease(api, NS, NAME, holder, monotonic=clock)


def test_the_first_controller_creates_and_holds_it(api: KubeApi, server: FakeApiServer) -> None:
    clock = Clock()
    a = candidate(api, "ctl-0:1", clock)
    assert a.try_acquire()
    held = spec(server)
    assert held["holderIdentity"] == "ctl-0:1" and held["leaseDurationSeconds"] == 15
    assert held["leaseTransitions"] == 0 and held["acquireTime"] == held["renewTime"]
    assert a.alive() and a.try_acquire()  # renewing its own lease
    assert spec(server)["leaseTransitions"] == 0


def test_a_standby_waits_while_the_holder_renews_then_takes_over_once_it_stops(
    api: KubeApi, server: FakeApiServer
) -> None:
    clock = Clock()
    a, b = candidate(api, "ctl-0:1", clock), candidate(api, "ctl-1:1", clock)
    assert a.try_acquire()
    for _ in range(20):  # 40 s: the holder renews every 2 s, so its record keeps changing
        clock.now += 2
        assert a.alive()
        assert not b.try_acquire()
    # The holder stops renewing (hung, cut off, killed without release): the record stands still.
    assert not b.try_acquire()  # first read of the record as it now is
    clock.now += 14
    assert not b.try_acquire()  # 14 s unchanged: not yet the lease's 15
    clock.now += 1
    assert b.try_acquire()
    held = spec(server)
    assert held["holderIdentity"] == "ctl-1:1" and held["leaseTransitions"] == 1
    assert not a.alive()  # the old holder sees another name and steps down
    assert not a.try_acquire()


def test_a_release_hands_over_at_the_next_try(api: KubeApi, server: FakeApiServer) -> None:
    clock = Clock()
    a, b = candidate(api, "ctl-0:1", clock), candidate(api, "ctl-1:1", clock)
    assert a.try_acquire()
    assert not b.try_acquire()
    a.release()
    assert spec(server)["holderIdentity"] == ""
    assert b.try_acquire()  # no waiting out the duration
    assert spec(server)["holderIdentity"] == "ctl-1:1"
    assert not a.alive()


def test_of_two_takers_of_an_expired_lease_one_wins(api: KubeApi, server: FakeApiServer) -> None:
    server.add(lease(NAME, "gone:1", namespace=NS))
    clock = Clock()
    b, c = candidate(api, "ctl-1:1", clock), candidate(api, "ctl-2:1", clock)
    assert not b.try_acquire() and not c.try_acquire()
    clock.now += 15
    stale = server.get("Lease", NAME, NS)  # both read the same version...
    assert b.try_acquire()
    assert stale is not None
    # ...c writes with the version it read: the API server answers 409, and c does not lead.
    assert not c._write(stale, taking_over=True)
    assert spec(server)["holderIdentity"] == "ctl-1:1"


def test_a_holder_that_cannot_renew_steps_down_within_the_deadline(
    api: KubeApi, server: FakeApiServer
) -> None:
    clock = Clock()
    a = candidate(api, "ctl-0:1", clock)
    assert a.try_acquire()
    server.fail[("PUT", "/leases/")] = (503, 100)
    clock.now += 2
    assert a.alive()  # one failed renewal: still within the 10 s deadline
    clock.now += 7
    assert a.alive()
    clock.now += 1
    assert not a.alive()  # 10 s since the last renewal: steps down before a standby may take over
    server.fail.clear()
    assert not a.alive()  # stays down: it must take the lease again


def test_unreachable_api_server_is_never_a_lead(tmp_path: Path) -> None:
    with FakeApiServer() as s:
        api = api_for(tmp_path, s)
    a = KubeLease(api, NS, NAME, "ctl-0:1")  # the server is gone
    assert not a.try_acquire()
    assert not a.alive()


class Silent:
    """An API server that accepts connections and never answers (hung, or behind a dead proxy)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"


def test_a_hung_api_server_cannot_hold_a_renewal_past_the_deadline(tmp_path: Path) -> None:
    silent = Silent()
    try:
        api = api_for(tmp_path, silent)  # type: ignore[arg-type] # only .url is read
        a = KubeLease(api, NS, NAME, "ctl-0:1")
        a._held, a._renewed = True, time.monotonic()  # holding, when the API server stops answering
        began = time.monotonic()
        assert a.alive()  # one renewal fails by its read timeout: still within the 10 s deadline
        took = time.monotonic() - began
        assert CALL_TIMEOUT[1] - 0.5 <= took < CALL_TIMEOUT[1] + 2, took  # not the API's 30 s read
        assert a.renew_deadline_seconds > 2 * sum(CALL_TIMEOUT)  # a GET and a PUT fit in the deadline
    finally:
        silent.sock.close()


class Fixed:
    def __init__(self, acquire: bool) -> None:
        self.acquire, self.released = acquire, False

    def try_acquire(self) -> bool:
        return self.acquire

    def alive(self) -> bool:
        return self.acquire

    def release(self) -> None:
        self.released = True


def test_elected_but_the_store_still_locked_is_not_a_lead(api: KubeApi, server: FakeApiServer) -> None:
    clock = Clock()
    store = Fixed(acquire=False)  # the previous leader's store session not gone yet
    both = BothLeases(candidate(api, "ctl-0:1", clock), store)
    assert not both.try_acquire()
    assert spec(server)["holderIdentity"] == "ctl-0:1"  # the election is kept meanwhile
    store.acquire = True
    assert both.try_acquire() and both.alive()
    both.release()
    assert store.released and spec(server)["holderIdentity"] == ""
