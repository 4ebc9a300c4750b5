"""`gpufleet cordon|uncordon|drain` and the Kubernetes side of `gpufleet node NAME` against a real
controller on loopback whose cluster is the fake API server; and against a controller with no
cluster, which says so in one line."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.app import ControllerApp
from controller.config import KubernetesConfig
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import daemon_set, node, pdb, pod, replica_set
from controller.main import main
from tests.controller.cli.test_waiting import Terminal
from tests.controller.harness import ControllerThread, config, hello
from tests.kube.harness import FakeTime, evictions, kubeconfig

Capture = pytest.CaptureFixture[str]
WEB = ("ReplicaSet", "web")


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeApiServer, ControllerThread]]:
    with FakeApiServer() as server:
        for name in ("n0", "n1"):
            server.add(node(name))
        server.add(replica_set("web", replicas=2))
        server.add(daemon_set("gpufleet-agent"))
        for i in range(2):
            server.add(pod(f"web-{i}", "n0", owned_by=WEB, labels={"app": "web"}))
        server.add(pod("agent-n0", "n0", namespace="kube-system", owned_by=("DaemonSet", "gpufleet-agent")))
        time = FakeTime()
        cfg = config(kubernetes=KubernetesConfig(kubeconfig=str(kubeconfig(tmp_path, server))))
        with ControllerThread(cfg, time) as c:
            c.app.kube.sleep = time.sleep  # a drain's minutes in milliseconds

            async def known(app: ControllerApp) -> None:
                for name in ("n0", "n1"):
                    await app.ingest.hello(hello(name, gpus=2))

            c.call(known)
            yield server, c


def test_cordon_and_uncordon(cluster: tuple[FakeApiServer, ControllerThread], capsys: Capture) -> None:
    server, c = cluster
    code, out, err = run(capsys, "cordon", "n0", "--reason", "slow gemm", "--controller", c.address)
    assert (code, out, err) == (0, "node n0 cordoned by gpufleet\n", "")
    code, out, _ = run(capsys, "cordon", "n0", "--controller", c.address, "-o", "json")
    doc: dict[str, Any] = json.loads(out)
    assert (
        code == 0 and doc["changed"] is False and doc["detail"] == "node n0 was already cordoned by gpufleet"
    )

    code, out, err = run(capsys, "uncordon", "n0", "--controller", c.address)
    assert (code, out) == (0, "node n0 uncordoned (gpufleet's cordon)\n")

    n1 = server.get("Node", "n1")
    assert n1 is not None
    n1["spec"]["unschedulable"] = True  # someone else's kubectl cordon
    server.replace(n1)
    code, out, err = run(capsys, "uncordon", "n1", "--controller", c.address)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "FAILED_PRECONDITION: node n1 was cordoned by someone else" in err and "--force" in err
    code, out, err = run(capsys, "uncordon", "n1", "--force", "--controller", c.address)
    assert (code, err) == (0, "") and "someone else's (forced)" in out

    code, _, err = run(capsys, "cordon", "nope", "--controller", c.address)
    assert code == 2 and "NOT_FOUND" in err


def test_drain_json_then_node_shows_the_kubernetes_side(
    cluster: tuple[FakeApiServer, ControllerThread], capsys: Capture
) -> None:
    server, c = cluster
    code, out, err = run(capsys, "drain", "n0", "--controller", c.address)
    assert code == 2 and "--yes" in err and evictions(server) == []  # off a terminal: --yes needed

    code, out, err = run(capsys, "drain", "n0", "--dry-run", "--controller", c.address, "-o", "json")
    plan: dict[str, Any] = json.loads(out)
    assert (code, plan["outcome"], plan["pending"]) == (0, "planned", ["default/web-0", "default/web-1"])
    assert evictions(server) == []

    code, out, err = run(
        capsys, "drain", "n0", "--yes", "--reason", "xid 79", "--controller", c.address, "-o", "json"
    )
    doc: dict[str, Any] = json.loads(out)
    assert (code, err) == (0, "")
    assert (doc["node"], doc["outcome"], doc["blocking"], doc["error"]) == ("n0", "drained", [], "")
    assert [(e["pod"], e["gone"]) for e in doc["evicted"]] == [
        ("default/web-0", True),
        ("default/web-1", True),
    ]
    assert doc["skipped"] == [
        {"pod": "kube-system/agent-n0", "why": "DaemonSet-managed (DaemonSet gpufleet-agent)"}
    ]

    code, out, _ = run(capsys, "node", "n0", "--controller", c.address)
    assert code == 0
    assert "Kubernetes: cordoned by gpufleet; health label" in out
    assert f"drain {doc['id']}: drained: drained: 2 pod(s) evicted, 1 skipped" in out
    code, out, _ = run(capsys, "node", "n0", "--controller", c.address, "-o", "json")
    k = json.loads(out)["kubernetes"]
    assert (k["found"], k["schedulable"], k["cordoned_by"], k["drain"]["outcome"]) == (
        True,
        False,
        "gpufleet",
        "drained",
    )


def test_drain_blocked_by_a_pdb(cluster: tuple[FakeApiServer, ControllerThread], capsys: Capture) -> None:
    server, c = cluster
    server.add(pdb("web-pdb", {"app": "web"}, min_available=2))
    code, out, err = run(
        capsys, "drain", "n0", "--yes", "--timeout", "30", "--controller", c.address, "-o", "json"
    )
    doc: dict[str, Any] = json.loads(out)
    assert code == 1 and doc["outcome"] == "blocked"
    assert doc["blocking"] == [
        {"pod": "default/web-0", "pdb": "web-pdb"},
        {"pod": "default/web-1", "pdb": "web-pdb"},
    ]
    assert (
        err.startswith("gpufleet drain: n0: blocked: blocked at the timeout (30s)") and err.count("\n") == 1
    )

    # the blocked drain keeps its place in the breaker's window: a drain of n1 goes over the budget
    code, out, err = run(capsys, "drain", "n1", "--yes", "--controller", c.address)
    assert (code, out) == (1, "") and "RESOURCE_EXHAUSTED: drain on n1 refused: 1 of 1 nodes" in err
    n1 = server.get("Node", "n1")
    assert n1 is not None and not n1["spec"].get("unschedulable")  # refused before it acted


def test_no_cluster_says_so_in_one_line(capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with ControllerThread(config()) as c:
        for args in (("cordon", "n0"), ("uncordon", "n0"), ("drain", "n0", "--yes")):
            code, out, err = run(capsys, *args, "--controller", c.address)
            assert (code, out) == (2, "")
            assert err.count("\n") == 1
            assert "FAILED_PRECONDITION: no Kubernetes cluster is configured" in err


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf"])
def test_a_drain_timeout_that_is_not_a_finite_number_of_seconds_is_refused_before_asking(
    capsys: Capture, timeout: str
) -> None:
    """Before, NaN and infinity passed `timeout < 0` and became the call's deadline: `cannot reach
    controller: Deadline Exceeded` from a controller that was up."""
    code, out, err = run(
        capsys, "drain", "n0", "--dry-run", "--timeout", timeout, "--controller", "127.0.0.1:1"
    )
    assert (code, out) == (2, "")
    assert (
        err
        == "gpufleet drain: --timeout must be a finite number of seconds > 0 (0: the controller's default)\n"
    )


def test_a_drain_on_a_terminal_says_what_it_waits_for(
    cluster: tuple[FakeApiServer, ControllerThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `gpufleet drain` was silent on a terminal until the drain ended (minutes, with a PDB)."""
    _, c = cluster
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    assert main(["drain", "n0", "--yes", "--controller", c.address, "-o", "json"]) == 0
    assert "draining n0" in screen.getvalue()
