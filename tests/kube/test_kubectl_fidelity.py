"""The fake API server against the real kubectl: cordon, drain (evictions, DaemonSet, mirror and bare
pods, PodDisruptionBudgets, pods that never go) and uncordon behave as against a cluster, and the
controllers' leader Lease reads as a cluster's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import daemon_set, mirror_pod, node, pdb, pod, replica_set
from controller.kube.lease import KubeLease
from tests.kube.harness import api_for
from tests.support import require

KUBECTL = "/usr/bin/kubectl"
BUDGET = "Cannot evict pod as it would violate the pod's disruption budget"
DRAIN = ("drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data")


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add(node("n1"))
        server.add(node("n2"))
        yield server


@pytest.fixture
def kubectl(kube: FakeApiServer, tmp_path: Path) -> Iterator[Kubectl]:
    path = KUBECTL if os.access(KUBECTL, os.X_OK) else shutil.which("kubectl")
    require(path is not None, f"kubectl is not installed ({KUBECTL} and PATH looked at)")
    assert path is not None
    yield Kubectl(path, kube, tmp_path)


class Kubectl:
    def __init__(self, path: str, server: FakeApiServer, home: Path) -> None:
        self.path, self.server, self.home = path, server, home

    def __call__(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home), "KUBECONFIG": "/dev/null"}
        command = [self.path, f"--server={self.server.url}", f"--cache-dir={self.home / 'cache'}", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def stored(server: FakeApiServer, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    obj = server.get(kind, name, namespace)
    assert obj is not None, f"no {kind} {name}"
    return obj


def evictions(server: FakeApiServer) -> list[str]:
    return [
        path.split("?")[0] for method, path in server.requests if method == "POST" and "/eviction" in path
    ]


def deletes(server: FakeApiServer) -> list[str]:
    return [path for method, path in server.requests if method == "DELETE"]


def web(server: FakeApiServer, count: int, node_name: str = "n1", start: int = 0) -> None:
    if server.get("ReplicaSet", "web-1", "app") is None:
        server.add(replica_set("web-1", namespace="app"))
    for i in range(start, start + count):
        owned = ("ReplicaSet", "web-1")
        server.add(pod(f"web-{i}", node_name, namespace="app", owned_by=owned, labels={"app": "web"}))


def test_cordon_and_uncordon_set_and_clear_unschedulable(kube: FakeApiServer, kubectl: Kubectl) -> None:
    done = kubectl("cordon", "n1")
    assert done.returncode == 0, done.stderr
    assert "node/n1 cordoned" in done.stdout
    assert stored(kube, "Node", "n1")["spec"]["unschedulable"] is True
    assert ("PATCH", "/api/v1/nodes/n1") in [(m, p.split("?")[0]) for m, p in kube.requests]
    shown = kubectl("get", "nodes")
    assert "Ready,SchedulingDisabled" in shown.stdout, shown.stdout
    assert kubectl("cordon", "n1").stdout.strip() == "node/n1 already cordoned"

    done = kubectl("uncordon", "n1")
    assert done.returncode == 0, done.stderr
    assert "node/n1 uncordoned" in done.stdout
    assert "unschedulable" not in stored(kube, "Node", "n1")["spec"]


def test_taint_and_label_patches_land_on_the_node(kube: FakeApiServer, kubectl: Kubectl) -> None:
    assert kubectl("taint", "nodes", "n1", "gpufleet.io/unhealthy=true:NoSchedule").returncode == 0
    assert kubectl("label", "nodes", "n1", "gpufleet.io/health=degraded").returncode == 0
    n1 = stored(kube, "Node", "n1")
    assert n1["spec"]["taints"] == [{"effect": "NoSchedule", "key": "gpufleet.io/unhealthy", "value": "true"}]
    assert n1["metadata"]["labels"]["gpufleet.io/health"] == "degraded"
    assert kubectl("taint", "nodes", "n1", "gpufleet.io/unhealthy-").returncode == 0
    assert kubectl("label", "nodes", "n1", "gpufleet.io/health-").returncode == 0
    n1 = stored(kube, "Node", "n1")
    assert "taints" not in n1["spec"]
    assert "gpufleet.io/health" not in n1["metadata"]["labels"]


def test_drain_evicts_controlled_pods_and_skips_daemonset_and_mirror_pods(
    kube: FakeApiServer, kubectl: Kubectl
) -> None:
    web(kube, 2)
    kube.add(pod("web-9", "n2", namespace="app", owned_by=("ReplicaSet", "web-1"), labels={"app": "web"}))
    kube.add(pod("cache", "n1", namespace="app", owned_by=("ReplicaSet", "web-1"), empty_dir=True))
    kube.add(daemon_set("gpufleet-agent"))
    kube.add(
        pod("gpufleet-agent-x1", "n1", namespace="kube-system", owned_by=("DaemonSet", "gpufleet-agent"))
    )
    kube.add(mirror_pod("etcd-n1", "n1"))

    done = kubectl(*DRAIN, "--timeout=20s")

    assert done.returncode == 0, done.stderr
    assert "node/n1 drained" in done.stdout
    assert "ignoring DaemonSet-managed Pods: kube-system/gpufleet-agent-x1" in done.stderr
    assert sorted(evictions(kube)) == [
        "/api/v1/namespaces/app/pods/cache/eviction",
        "/api/v1/namespaces/app/pods/web-0/eviction",
        "/api/v1/namespaces/app/pods/web-1/eviction",
    ]
    assert deletes(kube) == []  # eviction, never delete
    assert ("GET", "/apis/apps/v1/namespaces/kube-system/daemonsets/gpufleet-agent") in kube.requests
    left = sorted(p["metadata"]["name"] for p in kube.objects("Pod"))
    assert left == ["etcd-n1", "gpufleet-agent-x1", "web-9"]
    assert stored(kube, "Node", "n1")["spec"]["unschedulable"] is True


def test_drain_refuses_a_bare_pod_without_force_and_evicts_it_with_force(
    kube: FakeApiServer, kubectl: Kubectl
) -> None:
    web(kube, 1)
    kube.add(pod("bare", "n1", namespace="app"))

    refused = kubectl(*DRAIN, "--timeout=5s")
    assert refused.returncode != 0
    assert (
        "cannot delete Pods that declare no controller (use --force to override): app/bare" in refused.stderr
    )
    assert evictions(kube) == []  # nothing evicted: the drain stops before any eviction
    assert stored(kube, "Node", "n1")["spec"]["unschedulable"] is True

    forced = kubectl(*DRAIN, "--timeout=5s", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "deleting Pods that declare no controller: app/bare" in forced.stderr
    assert "/api/v1/namespaces/app/pods/bare/eviction" in evictions(kube)
    assert deletes(kube) == []
    assert kube.objects("Pod", "app") == []


def test_drain_blocked_by_a_pdb_retries_until_its_timeout(kube: FakeApiServer, kubectl: Kubectl) -> None:
    web(kube, 2)
    kube.add(pdb("web-pdb", {"app": "web"}, namespace="app", min_available=2))

    started = time.monotonic()
    blocked = kubectl(*DRAIN, "--timeout=2s")

    assert blocked.returncode != 0
    assert f'error when evicting pods/"web-0" -n "app" (will retry after 5s): {BUDGET}' in blocked.stderr
    assert "global timeout reached: 2s" in blocked.stderr
    assert time.monotonic() - started < 30
    assert len(kube.objects("Pod", "app")) == 2
    status = stored(kube, "PodDisruptionBudget", "web-pdb", "app")["status"]
    assert (status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"]) == (2, 2, 0)


def test_drain_goes_through_once_replacements_run(kube: FakeApiServer, kubectl: Kubectl) -> None:
    web(kube, 2)
    kube.add(pdb("web-pdb", {"app": "web"}, namespace="app", min_available=2))
    timer = threading.Timer(1.0, web, args=(kube, 2, "n2", 2))  # the ReplicaSet's new pods, on n2
    timer.start()
    try:
        done = kubectl(*DRAIN, "--timeout=30s")
    finally:
        timer.cancel()
    assert done.returncode == 0, done.stderr
    assert BUDGET in done.stderr  # the first try was refused
    assert "node/n1 drained" in done.stdout
    assert sorted(p["metadata"]["name"] for p in kube.objects("Pod", "app")) == ["web-2", "web-3"]


def test_drain_times_out_on_a_pod_that_never_goes(kube: FakeApiServer, kubectl: Kubectl) -> None:
    web(kube, 1)
    kube.stuck.add(("app", "web-0"))

    done = kubectl(*DRAIN, "--timeout=2s")

    assert done.returncode != 0
    assert "/api/v1/namespaces/app/pods/web-0/eviction" in evictions(kube)
    assert 'error when waiting for pod "web-0" in namespace "app" to terminate' in done.stderr
    stuck = stored(kube, "Pod", "web-0", "app")
    assert stuck["metadata"]["deletionTimestamp"]
    assert [c["reason"] for c in stuck["status"]["conditions"]] == ["EvictionByEvictionAPI"]


def test_get_nodes_json_lists_what_the_fake_holds(kube: FakeApiServer, kubectl: Kubectl) -> None:
    kube.add(node("gpu-7", labels={"nvidia.com/gpu.present": "true"}))
    done = kubectl("get", "nodes", "-o", "json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed["kind"] == "List"
    assert [n["metadata"]["name"] for n in listed["items"]] == ["gpu-7", "n1", "n2"]
    assert [n["metadata"]["name"] for n in kube.objects("Node")] == ["gpu-7", "n1", "n2"]
    one = json.loads(kubectl("get", "node", "gpu-7", "-o", "json").stdout)
    assert one["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert one["metadata"]["uid"] == stored(kube, "Node", "gpu-7")["metadata"]["uid"]


def test_server_side_dry_run_drain_changes_nothing(kube: FakeApiServer, kubectl: Kubectl) -> None:
    web(kube, 1)
    done = kubectl(*DRAIN, "--dry-run=server", "--timeout=5s")
    assert done.returncode == 0, done.stderr
    assert "node/n1 drained (server dry run)" in done.stdout
    assert ("PATCH", "/api/v1/nodes/n1?dryRun=All") in kube.requests
    assert evictions(kube) == ["/api/v1/namespaces/app/pods/web-0/eviction"]
    assert "unschedulable" not in stored(kube, "Node", "n1")["spec"]
    assert stored(kube, "Pod", "web-0", "app")["status"]["phase"] == "Running"


def test_kubectl_shows_the_leader_lease_the_controller_holds(
    kube: FakeApiServer, kubectl: Kubectl, tmp_path: Path
) -> None:
    """What the chart's NOTES tell operators to run: the Lease KubeLease writes, read by kubectl."""
    lease = KubeLease(api_for(tmp_path, kube), "gpufleet", "gpufleet-controller", "ctl-0:1")
    assert lease.try_acquire()
    done = kubectl("get", "lease", "-n", "gpufleet", "gpufleet-controller", "-o", "json")
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)["spec"]
    assert spec["holderIdentity"] == "ctl-0:1" and spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"].endswith("Z") and spec["leaseTransitions"] == 0
    table = kubectl("get", "lease", "-n", "gpufleet")
    assert table.returncode == 0, table.stderr
    assert "gpufleet-controller" in table.stdout and "ctl-0:1" in table.stdout
