"""The controller pod's role label (controller/kube/role.py) and /readyz (controller/standing.py)
against the fake API server: a leader takes the label from every other pod before labelling its
own, a standby labels only its own pod, and a controller is not Ready until its pod says its role."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.kube.cluster import Cluster
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import pod
from controller.kube.role import LEADER, POD_NAME_ENV, POD_NAMESPACE_ENV, ROLE_LABEL, STANDBY, PodRole
from controller.standing import Standing
from tests.kube.harness import api_for

NS = "gpufleet"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        s.add(pod("ctl-a", "n1", namespace=NS, labels={"app": "gpufleet", ROLE_LABEL: LEADER}))  # stale
        s.add(pod("ctl-b", "n2", namespace=NS, labels={"app": "gpufleet"}))
        s.add(pod("web", "n2", namespace="default", labels={ROLE_LABEL: LEADER}))  # another namespace
        yield s


def role_of(server: FakeApiServer, name: str, namespace: str = NS) -> str | None:
    obj = server.get("Pod", name, namespace)
    assert obj is not None
    labels: dict[str, str] = obj["metadata"].get("labels") or {}
    return labels.get(ROLE_LABEL)


def test_a_leader_takes_the_label_from_the_other_pods_then_labels_its_own(
    tmp_path: Path, server: FakeApiServer
) -> None:
    PodRole(api_for(tmp_path, server), NS, "ctl-b").apply(LEADER)
    assert role_of(server, "ctl-b") == LEADER
    assert role_of(server, "ctl-a") == STANDBY
    assert role_of(server, "web", "default") == LEADER  # not one of ours: left alone
    other = server.get("Pod", "ctl-a", NS)
    assert other is not None and other["metadata"]["labels"]["app"] == "gpufleet"  # only the role changed


def test_a_standby_labels_only_its_own_pod(tmp_path: Path, server: FakeApiServer) -> None:
    PodRole(api_for(tmp_path, server), NS, "ctl-b").apply(STANDBY)
    assert role_of(server, "ctl-b") == STANDBY
    assert role_of(server, "ctl-a") == LEADER


def test_only_a_pod_named_in_the_environment_is_labelled(tmp_path: Path, server: FakeApiServer) -> None:
    cluster = Cluster(api_for(tmp_path, server))
    assert PodRole.from_env(cluster, {}) is None
    assert PodRole.from_env(cluster, {POD_NAME_ENV: "ctl-b"}) is None
    role = PodRole.from_env(cluster, {POD_NAME_ENV: "ctl-b", POD_NAMESPACE_ENV: NS})
    assert role is not None and (role.namespace, role.name) == (NS, "ctl-b")


def readyz(address: str, path: str = "/readyz") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
    except urllib.error.URLError as exc:  # not listening (yet)
        return 0, str(exc.reason)


async def eventually(check: Callable[[], object], what: str) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


def test_readyz_says_the_role_once_the_pod_carries_it(tmp_path: Path, server: FakeApiServer) -> None:
    env = {POD_NAME_ENV: "ctl-b", POD_NAMESPACE_ENV: NS}

    async def go() -> None:
        standing = Standing(Cluster(api_for(tmp_path, server)), env)
        address = await standing.begin("127.0.0.1:0")
        assert address is not None
        try:
            status, text = await asyncio.to_thread(readyz, address)
            assert (status, text) == (503, "starting: opening the store")
            assert await asyncio.to_thread(readyz, address, "/livez") == (200, "ok")  # alive all along
            assert (await asyncio.to_thread(readyz, address, "/metrics"))[0] == 404  # health only
            standing.standby()
            await eventually(lambda: standing.readiness()[0], "not ready as a standby")
            assert role_of(server, "ctl-b") == STANDBY
            assert await asyncio.to_thread(readyz, address) == (200, STANDBY)
            standing.leading()
            await eventually(lambda: standing.readiness() == (True, LEADER), "not ready as the leader")
            assert role_of(server, "ctl-b") == LEADER and role_of(server, "ctl-a") == STANDBY
            assert await asyncio.to_thread(readyz, address) == (200, LEADER)
        finally:
            await standing.end()

    asyncio.run(go())


def test_not_ready_while_the_pod_cannot_be_labelled_then_ready_once_it_can(
    tmp_path: Path, server: FakeApiServer
) -> None:
    env = {POD_NAME_ENV: "ctl-new", POD_NAMESPACE_ENV: NS}  # its pod is not there yet: 404

    async def go() -> None:
        standing = Standing(Cluster(api_for(tmp_path, server)), env)
        assert standing.role is not None
        standing.role.retry_seconds = 0.05
        address = await standing.begin("127.0.0.1:0")
        assert address is not None
        try:
            standing.standby()
            await eventually(lambda: standing.role is not None and standing.role.error, "no error")
            status, text = await asyncio.to_thread(readyz, address)
            assert status == 503 and "cannot label pod gpufleet/ctl-new" in text, text
            server.add(pod("ctl-new", "n1", namespace=NS))
            await eventually(lambda: standing.readiness()[0], "not ready once the pod could be labelled")
            assert role_of(server, "ctl-new") == STANDBY
        finally:
            await standing.end()

    asyncio.run(go())


def test_without_a_cluster_the_pod_is_never_ready_and_says_why() -> None:
    env = {POD_NAME_ENV: "ctl-b", POD_NAMESPACE_ENV: NS}

    async def go() -> None:
        standing = Standing(Cluster(None, why="no Kubernetes cluster: test"), env)
        await standing.begin(None)
        try:
            standing.standby()
            await eventually(lambda: standing.role is not None and standing.role.error, "no error")
            ready, text = standing.readiness()
            assert not ready and "no Kubernetes cluster: test" in text, text
        finally:
            await standing.end()

    asyncio.run(go())


def test_without_a_pod_name_readiness_is_the_phase_alone() -> None:
    async def go() -> None:
        standing = Standing(Cluster(None), {})
        await standing.begin(None)
        assert standing.readiness() == (False, "starting: opening the store")
        standing.standby()
        assert standing.readiness() == (True, STANDBY)
        standing.leading()
        assert standing.readiness() == (True, LEADER)
        await standing.end()

    asyncio.run(go())
