"""The agent's stream to the controller on its /metrics page: whether the controller has it, what
waits in its spool, and what was lost. They change between snapshots, so a scrape reads them as they
are (StreamClient.status) rather than from the page kept per snapshot; an agent that does not stream
(no controller configured) shows none of them.

The alerts GpufleetAgentNotStreaming, GpufleetAgentLosingTelemetry and GpufleetAgentSpoolNotOnDisk
(dashboards/gpufleet-alerts.yaml) read them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.stream.status import StreamStatus

CONNECTED = "gpufleet_agent_controller_connected"
LAST_ACK = "gpufleet_agent_controller_last_ack_timestamp_seconds"
SPOOLED = "gpufleet_agent_spool_frames"
MAX_FRAMES = "gpufleet_agent_spool_max_frames"
ON_DISK = "gpufleet_agent_spool_on_disk"
DROPPED = "gpufleet_agent_spool_dropped_frames"  # _total: a counter
REJECTED = "gpufleet_agent_spool_rejected_frames"  # _total: a counter

# Every series name these families put on the page (counters with their _total).
NAMES = frozenset(
    {CONNECTED, LAST_ACK, SPOOLED, MAX_FRAMES, ON_DISK, f"{DROPPED}_total", f"{REJECTED}_total"}
)


def stream_families(node: str, status: StreamStatus) -> Iterator[Metric]:
    connected = GaugeMetricFamily(
        CONNECTED,
        "Whether the controller has accepted this agent's stream and it is open (1) or not (0).",
        labels=["node", "controller"],
    )
    connected.add_metric([node, status.controller], 1.0 if status.connected else 0.0)
    yield connected
    if status.last_ack_time is not None:
        yield _gauge(
            LAST_ACK,
            "Unix time of the latest ack from the controller: the frames it acked are stored.",
            node,
            status.last_ack_time,
        )
    yield _gauge(SPOOLED, "Frames waiting in the spool for the controller's ack.", node, status.spooled)
    yield _gauge(
        MAX_FRAMES,
        "Frames the spool holds before it drops the oldest (stream.spool_max_frames).",
        node,
        status.max_frames,
    )
    if status.on_disk is not None:
        yield _gauge(
            ON_DISK,
            "Whether new frames reach the spool's directory (1) or stay in memory only (0: the disk is "
            "full or unwritable; a restart would lose them).",
            node,
            1.0 if status.on_disk else 0.0,
        )
    yield _counter(
        DROPPED,
        "Frames dropped because the spool was full: telemetry the controller never gets.",
        node,
        status.dropped,
    )
    yield _counter(
        REJECTED,
        "Frames set aside in the spool's rejected/ directory: refused by the controller for good, "
        "or unsendable.",
        node,
        status.rejected,
    )


def _gauge(name: str, help_text: str, node: str, value: float) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=["node"])
    family.add_metric([node], float(value))
    return family


def _counter(name: str, help_text: str, node: str, value: float) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=["node"])
    family.add_metric([node], float(value))
    return family
