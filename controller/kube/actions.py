"""The controller's Kubernetes node actions, held by the app: cordon and uncordon here, drains in
draining.py, the checks they share in checks.py.

Every request is audited before it acts: cordon and drain through the breaker (which writes the
audit entry, then allows or refuses; `finished` records the outcome), uncordon (recovery: never
counted) and every refusal straight through the Auditor. One action per node at a time: a node
with a drain running, a cordon in progress or a mutating agent command in flight (the command
channel's one-per-node rule) is refused, as is a node under someone else's maintenance. Without a
cluster every action is refused with one line saying so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from controller.commands.channel import CommandChannel
from controller.config import KubernetesConfig
from controller.errors import ControllerError, FailedPrecondition
from controller.kube import nodes
from controller.kube.api import ApiError
from controller.kube.cluster import Cluster
from controller.kube.drain import Sleep
from controller.kube.draining import Draining
from controller.kube.nodes import Changed
from controller.remediate.applying import BreakerRefused
from controller.remediate.audit import Auditor
from controller.remediate.guard import Breaker
from controller.store.drains import DrainRecord
from controller.store.store import Store


class KubeActions(Draining):
    def __init__(
        self,
        config: KubernetesConfig,
        cluster: Cluster,
        store: Store,
        *,
        auditor: Auditor,
        breaker: Breaker,
        channel: CommandChannel,
        clock: Callable[[], float],
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.store = store
        self.auditor = auditor
        self.breaker = breaker
        self.channel = channel
        self.clock = clock
        self.sleep = sleep  # the drains' (tests make it move a fake clock)
        self.busy: dict[str, str] = {}  # node -> the action holding it
        self.drains: dict[str, DrainRecord] = {}  # node -> its newest drain this controller ran
        self.tasks: dict[str, asyncio.Task[DrainRecord]] = {}  # drain id -> its task

    async def tuning_blocked(self, node: str) -> str:
        """Why a retune must not go to `node` now ("" if it may): a drain or cordon holds it, it is
        under someone else's maintenance, or someone else cordoned it. Without a cluster, or for a
        node the cluster does not have, nothing here objects; a cluster that cannot be asked does
        (a retune never goes ahead unchecked)."""
        api = self.cluster.api
        if api is None:
            return ""
        holder = self.busy.get(node)
        if holder:
            return f"node {node} is busy on Kubernetes: {holder}"
        try:
            obj = await asyncio.to_thread(api.get_node, node)
        except ApiError as exc:
            if exc.status == 404:
                return ""
            return f"cannot check node {node} on Kubernetes ({exc}): not retuned"
        mark = nodes.maintenance_mark(obj, self.config.maintenance)
        if mark:
            return f"node {node} is under someone else's maintenance ({mark}): gpufleet leaves it alone"
        if nodes.cordoned_by(obj) == "other":
            return f"node {node} is cordoned by someone else: gpufleet does not retune it"
        return ""

    # Cordon and uncordon

    async def cordon(self, node: str, *, requester: str, reason: str = "") -> tuple[Changed, str]:
        """Cordon `node` (breaker-counted); the outcome and the audit entry's id."""
        params: dict[str, Any] = {}
        try:
            api = self.cluster.require()
            self._check_free(await self._node(api, node), node)
        except ControllerError as exc:
            await self._refused(requester, "cordon", node, exc, params=params, reason=reason)
            raise
        self.busy[node] = "a cordon is in progress"
        try:
            verdict = await self.breaker.request("cordon", node, requester, reason, parameters=params)
            if not verdict.allowed:
                raise BreakerRefused(verdict.why)
            try:
                done = await self._call(nodes.cordon, api, node)
            except FailedPrecondition as exc:
                await self.breaker.finished(verdict, "failed", str(exc))
                raise
            await self.breaker.finished(verdict, "succeeded", done.detail)
            return done, verdict.audit.id
        finally:
            self.busy.pop(node, None)

    async def uncordon(
        self, node: str, *, requester: str, reason: str = "", force: bool = False
    ) -> tuple[Changed, str]:
        """Uncordon `node`: recovery, never counted by the breaker; someone else's cordon only with
        `force`. Audited before it acts."""
        entry = await self.auditor.begin(
            requester, "uncordon", node, parameters={"force": force, "is_recovery": True}, reason=reason
        )
        try:
            api = self.cluster.require()
            self._check_free(await self._node(api, node), node)
            self.busy[node] = "an uncordon is in progress"
            try:
                done = await asyncio.to_thread(nodes.uncordon, api, node, force=force)
            finally:
                self.busy.pop(node, None)
        except ControllerError as exc:
            await self.auditor.outcome(entry, "refused", str(exc))
            raise
        except ApiError as exc:
            await self.auditor.outcome(entry, "failed", str(exc))
            raise FailedPrecondition(f"Kubernetes API: {exc}") from exc
        await self.auditor.outcome(entry, "succeeded", done.detail)
        return done, entry.id
