"""The agent's Prometheus exporter: /metrics over the latest Snapshot (catalogue.yaml lists every metric)."""

from __future__ import annotations

from agent.exporter.exporter import Exporter
from agent.exporter.server import CONTENT_TYPE, MetricsServer, MetricsServerError

__all__ = ["CONTENT_TYPE", "Exporter", "MetricsServer", "MetricsServerError"]
