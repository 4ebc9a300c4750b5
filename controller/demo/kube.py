"""`gpufleet demo --kubernetes fake`: the demo's nodes as a Kubernetes cluster, served by gpufleet's
fake API server (controller/kube/fake/) in the demo's own process, so a newcomer sees the whole
life of a slow node: found, cordoned and drained (the policy's automatic drain), repaired (the
demo restarts that node's agent without its fault, as a technician would fix the hardware),
re-probed, and uncordoned once it is back within fleet normal. Fixable faults are retuned instead,
online, without a drain.

Each node runs a training pod (owned by a ReplicaSet, so it is evicted) and gpufleet's agent pod
(owned by a DaemonSet, so a drain leaves it). The demo reads the node's Kubernetes side through the
Operator API (GetNode), like any client, and notes each step the first time it sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import daemon_set, node, pod, replica_set
from protos.gpufleet.v1 import operator_pb2

MODES = ("off", "fake")
POD_GRACE_SECONDS = 1.0  # an evicted pod takes this long to go
DRAIN_TIMEOUT_SECONDS = 60.0
STEPS = ("cordoned", "drained", "repaired", "uncordoned")


class DemoCluster:
    """The fake API server holding one Node per demo node, with their pods, and a kubeconfig for it."""

    def __init__(self, tmp: Path, nodes: list[str], gpus: int) -> None:
        self.server = FakeApiServer(pod_grace_seconds=POD_GRACE_SECONDS).start()
        self.server.add(daemon_set("gpufleet-agent"))
        self.server.add(replica_set("train", replicas=len(nodes)))
        for name in nodes:
            self.server.add(node(name, gpus=gpus))
            self.server.add(
                pod(
                    f"gpufleet-agent-{name}",
                    name,
                    namespace="kube-system",
                    owned_by=("DaemonSet", "gpufleet-agent"),
                )
            )
            self.server.add(
                pod(f"train-{name}", name, owned_by=("ReplicaSet", "train"), labels={"app": "train"})
            )
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f'clusters: [{{name: demo, cluster: {{server: "{self.server.url}"}}}}]\n'
            "contexts: [{name: demo, context: {cluster: demo, user: demo}}]\n"
            "users: [{name: demo, user: {token: demo}}]\n"
            "current-context: demo\n"
        )

    def controller_config(self) -> dict[str, Any]:
        """The controller's `kubernetes` section: this cluster, drains automatic for hardware causes."""
        return {
            "kubeconfig": str(self.kubeconfig),
            "default_policy": "auto",
            "drain": {"timeout_seconds": DRAIN_TIMEOUT_SECONDS},
        }

    def stop(self) -> None:
        self.server.stop()


@dataclass
class NodeLife:
    """The steps one faulted node went through, each with the demo time it was first seen."""

    node: str
    fault: str
    steps: dict[str, float] = field(default_factory=dict)

    def saw(self, step: str, elapsed: float) -> None:
        self.steps.setdefault(step, round(elapsed, 1))

    def observe(self, k8s: operator_pb2.KubernetesNode, elapsed: float) -> None:
        if k8s.cordoned_by == "gpufleet":
            self.saw("cordoned", elapsed)
        if k8s.drain.outcome == "drained":
            self.saw("drained", elapsed)
        if "repaired" in self.steps and k8s.schedulable and not k8s.cordoned_by:
            self.saw("uncordoned", elapsed)

    @property
    def needs_repair(self) -> bool:
        return "drained" in self.steps and "repaired" not in self.steps

    @property
    def done(self) -> bool:
        return "uncordoned" in self.steps

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "fault": self.fault,
            "steps": {s: self.steps[s] for s in STEPS if s in self.steps},
        }
