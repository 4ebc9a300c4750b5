"""Real controller processes electing their leader on a Kubernetes Lease (kubernetes.leader_lease)
of a fake API server, on one store: the Lease names the leader, a standby waits, a leader stopped
cleanly releases it and the standby leads at once, a leader killed with SIGKILL is replaced once its
Lease expires (15 s), and the Lease counts each change of leader. Without the pod's namespace the
setting is refused with a clear error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import pod
from controller.kube.role import POD_NAME_ENV, POD_NAMESPACE_ENV
from tests.kube.harness import kubeconfig
from tests.processes import spawn, stop
from tests.test_controller_crash_e2e import wait_for

pytestmark = pytest.mark.slow
NS = "gpufleet"
LEASE = "gpufleet-controller"


def write_config(tmp_path: Path, i: int, server: FakeApiServer) -> Path:
    cfg = tmp_path / f"controller{i}.yaml"
    settings = {
        "listen": "127.0.0.1:0",
        "metrics_address": None,
        "db": str(tmp_path / "fleet.db"),
        "kubernetes": {"kubeconfig": str(kubeconfig(tmp_path, server)), "leader_lease": LEASE},
    }
    cfg.write_text(yaml.safe_dump(settings))
    return cfg


def holder(server: FakeApiServer) -> tuple[str, int]:
    obj = server.get("Lease", LEASE, NS)
    if obj is None:
        return "", -1
    return str(obj["spec"].get("holderIdentity") or ""), int(obj["spec"].get("leaseTransitions") or 0)


def identity(process: subprocess.Popen[bytes]) -> str:
    return f"{socket.gethostname()}:{process.pid}"


def test_the_lease_elects_the_leader_and_moves_on_stop_and_on_kill(tmp_path: Path) -> None:
    with FakeApiServer() as server:
        for i in range(3):
            server.add(pod(f"ctl-{i}", f"n{i}", namespace=NS, labels={"app": "gpufleet"}))
        logs = [tmp_path / f"ctl-{i}.log" for i in range(3)]
        ready = [tmp_path / f"ctl-{i}.ready" for i in range(3)]
        processes: list[subprocess.Popen[bytes]] = []

        def start(i: int) -> subprocess.Popen[bytes]:
            env = {POD_NAME_ENV: f"ctl-{i}", POD_NAMESPACE_ENV: NS}
            args = ["controller", "controller", "--config", str(write_config(tmp_path, i, server))]
            process = spawn([*args, "--ready-file", str(ready[i])], logs[i], env)
            processes.append(process)
            return process

        try:
            first = start(0)
            wait_for("the first controller did not lead", ready[0].exists, logs)
            assert holder(server) == (identity(first), 0)
            assert f"holding Lease {NS}/{LEASE} as {identity(first)}" in logs[0].read_text()

            second = start(1)
            wait_for("the second did not wait as a standby", lambda: "standby" in logs[1].read_text(), logs)
            time.sleep(3)  # a few of its tries: the Lease stays the leader's
            assert holder(server) == (identity(first), 0) and not ready[1].exists()

            stopped = time.monotonic()
            stop(first)  # SIGTERM: the Lease is released on the way out
            wait_for("the standby did not take the lead", ready[1].exists, logs)
            assert time.monotonic() - stopped < 10  # at its next try, not after the Lease's 15 s
            assert holder(server) == (identity(second), 1)
            assert f"released Lease {NS}/{LEASE}" in logs[0].read_text()

            third = start(2)
            wait_for("the third did not wait as a standby", lambda: "standby" in logs[2].read_text(), logs)
            killed = time.monotonic()
            os.kill(second.pid, signal.SIGKILL)  # no release: the Lease must expire
            second.wait(timeout=10)
            wait_for("the third did not take the lead", ready[2].exists, logs)
            waited = time.monotonic() - killed
            assert 13 <= waited < 30, waited  # the Lease's 15 s by the standby's clock (and its tries)
            assert holder(server) == (identity(third), 2)
        finally:
            for process in processes:
                stop(process)


def test_a_lease_without_the_pods_namespace_is_refused(tmp_path: Path) -> None:
    with FakeApiServer() as server:
        log = tmp_path / "ctl.log"
        env = {POD_NAMESPACE_ENV: ""}
        process = spawn(
            ["controller", "controller", "--config", str(write_config(tmp_path, 0, server))], log, env
        )
        assert process.wait(timeout=60) == 2
        assert (
            f"kubernetes.leader_lease: ${POD_NAMESPACE_ENV} must name the pod's namespace" in log.read_text()
        )
        assert server.get("Lease", LEASE, NS) is None
