"""Drains against the fake API server, as kubectl drain does them: DaemonSet and mirror pods
skipped with why, emptyDir and bare pods refused unless the config allows them, PDB refusals
retried with backoff and shown as `blocked by PDB <name>` (then `blocked` at the timeout), a pod
that never goes `timed_out`, an API error `failed`, and a drain taken up again from its stored
record without evicting anything twice. The clock is fake: a drain's minutes take milliseconds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from controller.config import DrainConfig
from controller.kube.api import KubeApi
from controller.kube.drain import DrainRun, backoff
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import daemon_set, mirror_pod, node, pdb, pod, replica_set
from controller.kube.nodes import CORDONED_BY
from controller.store.drains import DrainRecord
from tests.kube.harness import T0, FakeTime, api_for, evictions

WEB = ("ReplicaSet", "web")


class Crash(BaseException):
    """The controller dies right after a save."""


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        s.add(node("n1"))
        s.add(node("n2"))
        s.add(replica_set("web", replicas=2))
        s.add(daemon_set("gpufleet-agent"))
        yield s


@pytest.fixture
def api(tmp_path: Path, server: FakeApiServer) -> KubeApi:
    return api_for(tmp_path, server)


class Drain:
    """One DrainRun on node n1 with a fake clock; every stored state kept (as copies)."""

    def __init__(self, api: KubeApi, config: DrainConfig | None = None, timeout: float = 600.0) -> None:
        self.time = FakeTime()
        self.saved: list[DrainRecord] = []
        self.crash_after: int | None = None  # raise Crash after this many evictions are stored
        self.record = DrainRecord(
            id="d1", node="n1", state="running", started=T0, updated=T0, deadline=T0 + timeout
        )
        self.run = DrainRun(
            api, self.record, config or DrainConfig(), save=self.save, clock=self.time, sleep=self.time.sleep
        )

    async def save(self, record: DrainRecord) -> None:
        self.saved.append(msgspec.json.decode(msgspec.json.encode(record), type=DrainRecord))
        if self.crash_after is not None and len(record.evicted) >= self.crash_after:
            raise Crash

    def __call__(self) -> DrainRecord:
        return asyncio.run(self.run.run())


def web_pods(server: FakeApiServer, n: int = 2, on: str = "n1") -> None:
    for i in range(n):
        server.add(pod(f"web-{i}", on, owned_by=WEB, labels={"app": "web"}))


def test_drain_evicts_and_skips_daemonset_and_mirror_pods_saying_why(
    server: FakeApiServer, api: KubeApi
) -> None:
    web_pods(server)
    server.add(pod("agent-x1", "n1", namespace="kube-system", owned_by=("DaemonSet", "gpufleet-agent")))
    server.add(mirror_pod("etcd-n1", "n1"))
    server.add(pod("elsewhere", "n2", owned_by=WEB))
    done = Drain(api)()
    assert done.state == "drained" and done.error == ""
    assert sorted(evictions(server)) == ["default/web-0", "default/web-1"]
    assert [p.key for p in done.evicted] == ["default/web-0", "default/web-1"]
    assert all(p.gone for p in done.evicted)
    why = {p.key: p.why for p in done.skipped}
    assert why["kube-system/agent-x1"] == "DaemonSet-managed (DaemonSet gpufleet-agent)"
    assert why["kube-system/etcd-n1"].startswith("mirror pod")
    assert done.progress == "drained: 2 pod(s) evicted, 2 skipped"
    n1 = server.get("Node", "n1")
    assert (
        n1 is not None
        and n1["spec"]["unschedulable"]
        and n1["metadata"]["annotations"][CORDONED_BY] == "gpufleet"
    )
    assert done.cordoned
    assert server.get("Pod", "elsewhere") is not None
    assert not any(m == "DELETE" for m, _ in server.requests)  # evictions only, never a delete


def test_emptydir_and_bare_pods_are_refused_naming_them_unless_allowed(
    server: FakeApiServer, api: KubeApi
) -> None:
    server.add(pod("cache", "n1", owned_by=WEB, empty_dir=True))
    server.add(pod("bare", "n1"))
    server.add(pod("finished", "n1", phase="Succeeded"))  # a finished bare pod goes whatever it is
    refused = Drain(api)()
    assert refused.state == "failed" and evictions(server) == []
    assert refused.error.startswith("drain of n1 refused: 2 pod(s) cannot be evicted")
    assert "default/bare: no controller" in refused.error and "kubernetes.drain.force" in refused.error
    assert "default/cache: emptyDir volume" in refused.error and "delete_emptydir_data" in refused.error

    allowed = Drain(api, DrainConfig(delete_emptydir_data=True, force=True))()
    assert allowed.state == "drained"
    assert sorted(evictions(server)) == ["default/bare", "default/cache", "default/finished"]


def test_an_orphaned_daemonset_pod_needs_force(server: FakeApiServer, api: KubeApi) -> None:
    server.add(pod("orphan", "n1", owned_by=("DaemonSet", "gone")))
    assert Drain(api)().state == "failed"
    assert Drain(api, DrainConfig(force=True))().state == "drained"


def test_a_pdb_blocks_with_backoff_then_the_drain_ends_blocked(server: FakeApiServer, api: KubeApi) -> None:
    web_pods(server)
    server.add(pdb("web-pdb", {"app": "web"}, min_available=2))
    drain = Drain(api, timeout=300.0)
    done = drain()
    assert done.state == "blocked"
    assert done.progress == (
        "blocked at the timeout (300s): default/web-0 blocked by PDB web-pdb; "
        "default/web-1 blocked by PDB web-pdb"
    )
    assert [(p.key, p.pdb) for p in done.blocking] == [
        ("default/web-0", "web-pdb"),
        ("default/web-1", "web-pdb"),
    ]
    running = [s for s in drain.saved if s.state == "running"]
    first_blocked = next(s for s in running if s.blocking)
    assert first_blocked.updated - T0 < 60  # shown within a minute
    assert "blocked by PDB web-pdb (default/web-0, default/web-1)" in first_blocked.progress
    # each pod tried at 0, 10, 30, 70, 150, 270 s (10 s doubling, capped at 2 min), then the timeout
    assert evictions(server).count("default/web-0") == 6
    assert [backoff(n) for n in range(1, 8)] == [10, 20, 40, 80, 120, 120, 120]
    assert drain.time.now == T0 + 300


def test_a_pdb_that_relents_lets_the_drain_finish(server: FakeApiServer, api: KubeApi) -> None:
    web_pods(server)
    budget = server.add(pdb("web-pdb", {"app": "web"}, min_available=2))
    drain = Drain(api)

    async def relent(record: DrainRecord) -> None:
        await Drain.save(drain, record)
        if record.blocking and drain.time.now >= T0 + 30:
            budget["spec"] = {"maxUnavailable": 2, "selector": budget["spec"]["selector"]}
            server.replace(budget)

    drain.run._save = relent
    done = drain()
    assert done.state == "drained" and done.blocking == []
    assert sorted(set(evictions(server))) == ["default/web-0", "default/web-1"]


def test_a_pod_that_never_goes_ends_timed_out(server: FakeApiServer, api: KubeApi) -> None:
    web_pods(server)
    server.stuck.add(("default", "web-1"))
    done = Drain(api, timeout=20.0)()
    assert done.state == "timed_out"
    assert done.progress == "timed out (20s): pods not gone: default/web-1"
    assert [p.key for p in done.waiting] == ["default/web-1"]
    assert evictions(server) == ["default/web-0", "default/web-1"]  # evicted once, then waited for


def test_an_api_error_fails_the_drain_with_the_error(server: FakeApiServer, api: KubeApi) -> None:
    web_pods(server)
    server.fail[("POST", r"/pods/web-1/eviction$")] = (500, 1)
    done = Drain(api)()
    assert done.state == "failed"
    assert done.error.startswith("500 Internal Server Error: evicting default/web-1: injected failure")
    assert done.progress == f"failed: {done.error}"

    server.fail[("GET", r"^/api/v1/pods$")] = (500, 1)
    listing = Drain(api)()
    assert listing.state == "failed" and "injected failure" in listing.error


def test_a_drain_resumed_from_its_record_never_evicts_twice(server: FakeApiServer, api: KubeApi) -> None:
    web_pods(server, 3)
    server.stuck.add(("default", "web-0"))  # evicted, still terminating when the controller dies
    first = Drain(api)
    first.crash_after = 2
    with pytest.raises(Crash):
        first()
    stored = first.saved[-1]
    assert stored.state == "running" and [p.key for p in stored.evicted] == ["default/web-0", "default/web-1"]
    assert evictions(server) == ["default/web-0", "default/web-1"]

    server.stuck.clear()
    second = Drain(api)
    second.record = stored
    second.run.record = stored
    done = second()
    assert done.state == "drained"
    assert evictions(server) == ["default/web-0", "default/web-1", "default/web-2"]  # each once
    assert [p.key for p in done.evicted] == ["default/web-0", "default/web-1", "default/web-2"]


def test_a_pod_already_terminating_is_waited_for_not_evicted(server: FakeApiServer, api: KubeApi) -> None:
    web_pods(server, 1)
    server.stuck.add(("default", "web-0"))
    api.request("DELETE", "/api/v1/namespaces/default/pods/web-0")  # someone deletes it first
    drain = Drain(api, timeout=10.0)
    done = drain()
    assert done.state == "timed_out" and evictions(server) == []
    assert [p.key for p in done.terminating] == ["default/web-0"]
