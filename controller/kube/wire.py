"""The Kubernetes side on the wire: a drain's record as DrainStatus, and a node's Kubernetes view
(KubernetesNode, read from the API server when GetNode asks)."""

from __future__ import annotations

import asyncio

from google.protobuf.timestamp_pb2 import Timestamp

from controller.kube.actions import KubeActions
from controller.kube.api import ApiError
from controller.kube.health import node_health
from controller.kube.nodes import cordoned_by, maintenance_mark, unschedulable
from controller.store.drains import DrainPod, DrainRecord
from protos.gpufleet.v1 import operator_pb2


def _ts(unix_seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(unix_seconds * 1e9))
    return ts


def _pod(p: DrainPod, *, evicted: bool = False) -> operator_pb2.DrainPod:
    msg = operator_pb2.DrainPod(namespace=p.namespace, name=p.name, why=p.why, pdb=p.pdb, gone=p.gone)
    if evicted and p.time:
        msg.evicted.CopyFrom(_ts(p.time))
    return msg


def drain_to_proto(r: DrainRecord) -> operator_pb2.DrainStatus:
    return operator_pb2.DrainStatus(
        id=r.id,
        node=r.node,
        outcome=r.state,
        progress=r.progress,
        error=r.error,
        evicted=[_pod(p, evicted=True) for p in r.evicted],
        skipped=[_pod(p) for p in r.skipped],
        blocking=[_pod(p) for p in r.blocking],
        pending=[_pod(p) for p in r.pending],
        waiting=[_pod(p) for p in r.waiting],
        started=_ts(r.started),
        updated=_ts(r.updated),
        deadline=_ts(r.deadline),
        requester=r.requester,
        reason=r.reason,
        audit_id=r.audit_id,
        cordoned=r.cordoned,
    )


async def kube_view(actions: KubeActions, name: str) -> operator_pb2.KubernetesNode | None:
    """The node as the cluster has it, and its newest drain; None without a cluster."""
    api = actions.cluster.api
    if api is None:
        return None
    view = operator_pb2.KubernetesNode()
    try:
        node = await asyncio.to_thread(api.get_node, name)
    except ApiError as exc:
        view.error = f"the cluster has no node {name}" if exc.status == 404 else f"Kubernetes API: {exc}"
    else:
        view.found = True
        view.schedulable = not unschedulable(node)
        for t in (node.get("spec") or {}).get("taints") or []:
            view.taints.add(key=t.get("key", ""), value=t.get("value", ""), effect=t.get("effect", ""))
        view.cordoned_by = cordoned_by(node)
        view.health_label = node_health(node)
        view.maintenance = maintenance_mark(node, actions.config.maintenance)
    drain = await actions.latest(name)
    if drain is not None:
        view.drain.CopyFrom(drain_to_proto(drain))
    return view
