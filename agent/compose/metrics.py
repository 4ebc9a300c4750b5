"""The agent's Prometheus /metrics server from its config."""

from __future__ import annotations

from typing import Any

from agent.config import AgentConfig
from agent.exporter import Exporter, MetricsServer


def metrics_server(agent: Any, config: AgentConfig) -> MetricsServer | None:
    """Bind /metrics where the config says (None: not served) and attach its exporter to `agent`."""
    if config.metrics.address is None:
        return None
    exporter = Exporter(
        config.node, agent.inventory, agent.host_facts, dcgm_compat=config.metrics.dcgm_compat
    )
    server = MetricsServer(
        config.metrics.address,
        exporter.render,
        title=f"gpufleet agent on {config.node}",
        web_config=config.metrics.web_config,
    )
    exporter.stream_status = agent.stream_status
    agent.exporter = exporter
    return server
