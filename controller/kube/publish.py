"""The fleet's health, published on the Node objects after each detection pass (health.py says
how): healthy, degraded (active findings, none critical), unhealthy (a critical finding), unknown
(the agent went silent: the condition only). Only nodes whose health changed are patched, in the
background (a slow API server never holds up detection); a node the cluster does not have is
skipped, an API error is logged and tried again after the next pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from controller.config import KubernetesConfig
from controller.fleet.findings import StoredFinding
from controller.fleet.health import node_health
from controller.fleet.model import Fleet
from controller.kube.api import ApiError
from controller.kube.cluster import Cluster
from controller.kube.health import Health, set_health
from protos.gpufleet.v1 import operator_pb2

log = logging.getLogger("gpufleet.controller.kube")
STATES = {
    operator_pb2.NODE_HEALTH_HEALTHY: ("healthy", "Healthy"),
    operator_pb2.NODE_HEALTH_DEGRADED: ("degraded", "Degraded"),
    operator_pb2.NODE_HEALTH_CRITICAL: ("unhealthy", "Unhealthy"),
}
MESSAGE_CAUSES = 5  # causes named in the condition's message


def health_of(state: operator_pb2.NodeHealth.ValueType, findings: list[StoredFinding]) -> Health:
    if state not in STATES:
        return Health("unknown", "AgentSilent", "no telemetry from the node's gpufleet agent")
    name, reason = STATES[state]
    if not findings:
        return Health(name, reason, "no active gpufleet findings")
    causes = sorted({f"{s.finding.cause} ({s.finding.severity})" for s in findings})
    more = f", +{len(causes) - MESSAGE_CAUSES} more" if len(causes) > MESSAGE_CAUSES else ""
    return Health(
        name, reason, f"{len(findings)} active finding(s): {', '.join(causes[:MESSAGE_CAUSES])}{more}"
    )


class HealthPublisher:
    def __init__(self, config: KubernetesConfig, cluster: Cluster, *, clock: Callable[[], float]) -> None:
        self.config = config
        self.cluster = cluster
        self.clock = clock
        self.published: dict[str, Health] = {}  # node -> what its Node object says now
        self.task: asyncio.Task[None] | None = None

    def after_pass(self, fleet: Fleet, active: Iterable[StoredFinding], stale_after_seconds: float) -> None:
        """Publish the nodes whose health changed, in the background (one round at a time)."""
        if self.cluster.api is None or (self.task is not None and not self.task.done()):
            return
        by_node: dict[str, list[StoredFinding]] = {}
        for stored in active:
            by_node.setdefault(stored.finding.node, []).append(stored)
        now = self.clock()
        changed: dict[str, Health] = {}
        for name, node in fleet.nodes.items():
            found = by_node.get(name, [])
            health = health_of(node_health(node, found, now, stale_after_seconds), found)
            if self.published.get(name) != health:
                changed[name] = health
        if changed:
            self.task = asyncio.get_running_loop().create_task(self.publish(changed))

    async def publish(self, changed: dict[str, Health]) -> None:
        api = self.cluster.require()
        for name, health in sorted(changed.items()):
            try:
                await asyncio.to_thread(
                    set_health,
                    api,
                    name,
                    health,
                    taint=self.config.taint_unhealthy,
                    now=self.clock(),
                    maintenance=self.config.maintenance,
                )
            except ApiError as exc:
                if exc.status != 404:
                    log.warning(
                        "node %s: health not published on its Node (tried again later): %s", name, exc
                    )
                    continue
                log.debug("node %s: no such Kubernetes node; its health is not published", name)
            except Exception:  # a bug must not end publishing: logged, tried again after the next pass
                log.exception("node %s: health not published on its Node", name)
                continue
            self.published[name] = health
