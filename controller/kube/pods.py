"""Which of a node's pods a drain evicts, as `kubectl drain` sorts them (pkg/drain/filters.go),
with its flags made explicit in the config (kubernetes.drain):

- a mirror pod (static, the kubelet's own) is skipped: the API cannot evict it;
- a DaemonSet-managed pod is skipped: its DaemonSet would put it right back (it tolerates the
  cordon); one whose DaemonSet is gone is treated as a pod with no controller;
- a pod with an emptyDir volume loses its data: refused unless `delete_emptydir_data`;
- a pod that declares no controller is not recreated anywhere: refused unless `force`;
- a finished pod (Succeeded, Failed) is evicted whatever it holds; one already being deleted is
  waited for, never evicted again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controller.config import DrainConfig
from controller.kube.api import Obj
from controller.store.drains import DrainPod

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MIRROR = "mirror pod (static, run by the kubelet): the API cannot evict it"
EMPTYDIR = "emptyDir volume (its data is lost): kubernetes.drain.delete_emptydir_data allows it"
NO_CONTROLLER = "no controller (nothing recreates it elsewhere): kubernetes.drain.force allows it"


@dataclass(slots=True)
class Plan:
    evict: list[DrainPod] = field(default_factory=list)
    terminating: list[DrainPod] = field(default_factory=list)  # being deleted already: waited for
    skipped: list[DrainPod] = field(default_factory=list)  # left on the node (why)
    refused: list[DrainPod] = field(default_factory=list)  # the config does not allow evicting (why)

    def refusal(self, node: str) -> str:
        """One line naming the pods the config does not allow evicting ("" for none)."""
        if not self.refused:
            return ""
        pods = "; ".join(f"{p.key}: {p.why}" for p in self.refused)
        return f"drain of {node} refused: {len(self.refused)} pod(s) cannot be evicted: {pods}"


def pod_ref(pod: Obj, why: str = "") -> DrainPod:
    m = pod.get("metadata") or {}
    return DrainPod(namespace=m.get("namespace", ""), name=m.get("name", ""), uid=m.get("uid", ""), why=why)


def controller_of(pod: Obj) -> Obj | None:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), None)


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _has_emptydir(pod: Obj) -> bool:
    return any("emptyDir" in v for v in (pod.get("spec") or {}).get("volumes") or [])


def plan_pods(pods: list[Obj], config: DrainConfig, daemonset_exists: Callable[[str, str], bool]) -> Plan:
    """Sort `pods` (the node's) for a drain; `daemonset_exists(namespace, name)` asks the API."""
    plan = Plan()
    for pod in sorted(pods, key=lambda p: (pod_ref(p).namespace, pod_ref(p).name)):
        m = pod.get("metadata") or {}
        if m.get("deletionTimestamp"):
            plan.terminating.append(pod_ref(pod, "being deleted already"))
            continue
        if MIRROR_ANNOTATION in (m.get("annotations") or {}):
            plan.skipped.append(pod_ref(pod, MIRROR))
            continue
        owner = controller_of(pod)
        finished = _finished(pod)
        if owner is not None and owner.get("kind") == "DaemonSet" and owner.get("apiVersion") == "apps/v1":
            if not finished and daemonset_exists(m.get("namespace", ""), owner.get("name", "")):
                plan.skipped.append(pod_ref(pod, f"DaemonSet-managed (DaemonSet {owner.get('name')})"))
                continue
            if not finished:
                owner = None  # orphaned: its DaemonSet is gone
        if not finished and _has_emptydir(pod) and not config.delete_emptydir_data:
            plan.refused.append(pod_ref(pod, EMPTYDIR))
        elif not finished and owner is None and not config.force:
            plan.refused.append(pod_ref(pod, NO_CONTROLLER))
        else:
            plan.evict.append(pod_ref(pod))
    return plan
