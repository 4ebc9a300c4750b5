"""Real controller processes on one store, each in a "pod" of a fake API server (named by the
downward-API variables the chart sets): the leader's pod alone carries the leader label that the
chart's Service selects, a standby is Ready (/readyz 200) with its pod labelled standby, a standby
that takes over from a killed leader moves the label (taking it from the dead leader's pod), and a
controller restarted in a pod still labelled leader labels it standby before it is Ready."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import pod
from controller.kube.role import LEADER, POD_NAME_ENV, POD_NAMESPACE_ENV, ROLE_LABEL, STANDBY
from tests.kube.harness import kubeconfig
from tests.kube.test_pod_role import readyz, role_of
from tests.processes import spawn, stop
from tests.support import free_port
from tests.test_controller_crash_e2e import wait_for

pytestmark = pytest.mark.slow
NS = "gpufleet"


def test_the_leaders_pod_alone_carries_the_leader_label_and_standbys_are_ready(tmp_path: Path) -> None:
    with FakeApiServer() as server:
        for i in range(2):
            server.add(pod(f"ctl-{i}", f"n{i}", namespace=NS, labels={"app": "gpufleet"}))
        config = kubeconfig(tmp_path, server)
        health = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        logs = [tmp_path / f"ctl-{i}.log" for i in range(3)]
        ready = [tmp_path / f"ctl-{i}.ready" for i in range(3)]
        processes: list[subprocess.Popen[bytes]] = []

        def start(i: int, pod_name: str) -> subprocess.Popen[bytes]:
            cfg = tmp_path / f"controller{i}.yaml"
            settings = {
                "listen": "127.0.0.1:0",
                "metrics_address": None,
                "db": str(tmp_path / "fleet.db"),
                "health_listen": health[i % 2],
                "kubernetes": {"kubeconfig": str(config)},
            }
            cfg.write_text(yaml.safe_dump(settings))
            env = {POD_NAME_ENV: pod_name, POD_NAMESPACE_ENV: NS}
            args = ["controller", "controller", "--config", str(cfg), "--ready-file", str(ready[i])]
            process = spawn(args, logs[i], env)
            processes.append(process)
            return process

        def labelled(*expected: tuple[str, str]) -> None:
            wait_for(
                f"pods not labelled {expected}",
                lambda: all(role_of(server, name) == role for name, role in expected),
                logs,
            )

        try:
            first = start(0, "ctl-0")
            wait_for("the first controller did not lead", ready[0].exists, logs)
            labelled(("ctl-0", LEADER))
            wait_for("the leader is not Ready", lambda: readyz(health[0]) == (200, LEADER), logs)

            start(1, "ctl-1")
            wait_for("the second did not wait as a standby", lambda: "standby" in logs[1].read_text(), logs)
            labelled(("ctl-0", LEADER), ("ctl-1", STANDBY))
            wait_for("the standby is not Ready", lambda: readyz(health[1]) == (200, STANDBY), logs)

            os.kill(first.pid, signal.SIGKILL)  # its pod stays, still labelled leader
            first.wait(timeout=10)
            wait_for("the standby did not take the lead", ready[1].exists, logs)
            labelled(("ctl-1", LEADER), ("ctl-0", STANDBY))  # the new leader took the label
            wait_for("the new leader is not Ready", lambda: readyz(health[1]) == (200, LEADER), logs)
            assert "took the leader label from pod gpufleet/ctl-0" in logs[1].read_text()

            # The container restarted in a pod that still says leader (as if the label had not been
            # taken yet): it labels its own pod standby, and only then is Ready.
            stale = server.get("Pod", "ctl-0", NS)
            assert stale is not None
            stale["metadata"]["labels"][ROLE_LABEL] = LEADER
            server.replace(stale)
            start(2, "ctl-0")
            wait_for(
                "the restarted one did not wait as a standby", lambda: "standby" in logs[2].read_text(), logs
            )
            labelled(("ctl-0", STANDBY), ("ctl-1", LEADER))
            wait_for("the restarted standby is not Ready", lambda: readyz(health[0]) == (200, STANDBY), logs)
            assert not ready[2].exists()
        finally:
            for process in processes:
                stop(process)
