"""What every Kubernetes node action shares (a base of KubeActions, controller/kube/actions.py):
the API called in a worker thread, the node read (NotFound for one the cluster lacks), the checks
that keep gpufleet off a node (someone else's maintenance; another action holding it: a drain, a
cordon, a mutating agent command) and the audit entry of a refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from controller.commands.channel import CommandChannel
from controller.config import KubernetesConfig
from controller.errors import FailedPrecondition, NotFound
from controller.kube import nodes
from controller.kube.api import ApiError, KubeApi, Obj
from controller.kube.cluster import Cluster
from controller.remediate.audit import Auditor
from controller.remediate.guard import Breaker
from controller.store.store import Store

T = TypeVar("T")


class NodeChecks:
    config: KubernetesConfig
    cluster: Cluster
    store: Store
    auditor: Auditor
    breaker: Breaker
    channel: CommandChannel
    clock: Callable[[], float]
    busy: dict[str, str]  # node -> the action holding it

    @property
    def enabled(self) -> bool:
        """A cluster is configured (and usable)."""
        return self.cluster.api is not None

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiError as exc:
            raise FailedPrecondition(f"Kubernetes API: {exc}") from exc

    async def _node(self, api: KubeApi, node: str) -> Obj:
        try:
            return await asyncio.to_thread(api.get_node, node)
        except ApiError as exc:
            if exc.status == 404:
                raise NotFound(f"the Kubernetes cluster has no node {node!r}") from exc
            raise FailedPrecondition(f"Kubernetes API: {exc}") from exc

    def _check_free(self, obj: Obj, node: str) -> None:
        mark = nodes.maintenance_mark(obj, self.config.maintenance)
        if mark:
            raise FailedPrecondition(
                f"node {node} is under someone else's maintenance ({mark}): gpufleet leaves it alone"
            )
        holder = self.busy.get(node)
        if holder:
            raise FailedPrecondition(f"node {node} is busy: {holder}")
        command = self.channel.mutating_holder(node)
        if command is not None:
            raise FailedPrecondition(
                f"node {node} already has a mutating command in flight: {command.id} "
                f"({command.kind}, {command.state}, requested by {command.requester})"
            )

    async def _refused(
        self, requester: str, action: str, node: str, exc: Exception, *, params: dict[str, Any], reason: str
    ) -> None:
        entry = await self.auditor.begin(requester, action, node, parameters=params, reason=reason)
        await self.auditor.outcome(entry, "refused", str(exc))
