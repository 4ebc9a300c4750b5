"""Controller: agents and nodes it knows, frames ingested, ingest lag, store latency, findings,
node health, detector passes, probe commands, and actions with the blast-radius breaker."""

from __future__ import annotations

from dashboards.grafana import (
    JSON,
    Layout,
    bargauge,
    dashboard,
    heatmap,
    stat,
    status_history,
    target,
    thresholds,
    timeseries,
)
from dashboards.promql import node_health_code, node_health_mapping, rate

QUANTILES = ((0.5, "median"), (0.9, "p90"), (0.99, "p99"))


def _histogram_quantile(q: float, metric: str, by: str = "") -> str:
    return f"histogram_quantile({q}, sum by (le{by}) ({rate(metric + '_bucket')}))"


def _summary(layout: Layout) -> None:
    layout.add(
        stat(
            "Connected agents",
            [target("sum(gpufleet_controller_connected_agents)")],
            "none",
            description="Agents with an open telemetry stream.",
        ),
        6,
        4,
    )
    layout.add(
        stat(
            "Nodes",
            # The leader's: with replica ingest every replica is scraped, and a standby counts the
            # nodes it holds, which the leader's count includes.
            [target("sum(gpufleet_controller_nodes and on (instance) gpufleet_controller_leading == 1)")],
            "none",
            description="Nodes the leading controller holds (every replica's agents included).",
        ),
        6,
        4,
    )
    layout.add(
        stat("Frames ingested", [target(f"sum({rate('gpufleet_controller_frames_ingested_total')})")], "cps"),
        6,
        4,
    )
    layout.add(
        stat(
            "Since the last detector pass",
            [
                target(
                    "time() - max(gpufleet_controller_detector_pass_timestamp_seconds"
                    " or gpufleet_controller_leading_since_timestamp_seconds)"
                )
            ],
            "s",
            description="Should stay below the detect interval (10 s by default). Before the leader's "
            "first pass: since it took the lead.",
            steps=thresholds((None, "green"), (60, "red")),
        ),
        6,
        4,
    )


def _ingest(layout: Layout) -> None:
    layout.row("Ingest")
    layout.add(
        timeseries(
            "Frames",
            [
                target(f"sum({rate('gpufleet_controller_frames_ingested_total')})", "ingested"),
                target(f"sum({rate('gpufleet_controller_duplicate_frames_total')})", "duplicates dropped"),
                target(
                    f"sum({rate('gpufleet_controller_non_finite_readings_total')})", "non-finite readings"
                ),
            ],
            "cps",
            description="Duplicates are frames an agent resent after a reconnect (already stored).",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Ingest lag",
            [
                target(_histogram_quantile(q, "gpufleet_controller_ingest_lag_seconds"), name)
                for q, name in QUANTILES
            ],
            "s",
            description="Ingest time minus the frame's own time: network, agent spool and controller "
            "delay together (clock skew between hosts shows here too).",
        ),
        8,
    )
    layout.add(
        heatmap(
            "Ingest lag distribution",
            [
                target(
                    "sum by (le) (increase(gpufleet_controller_ingest_lag_seconds_bucket[$__rate_interval]))",
                    "{{le}}",
                )
            ],
            "s",
            buckets=True,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Store latency (p99) per operation",
            [
                target(
                    _histogram_quantile(0.99, "gpufleet_controller_store_latency_seconds", ", operation"),
                    "{{operation}}",
                )
            ],
            "s",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Store operations",
            [
                target(
                    f"sum by (operation) ({rate('gpufleet_controller_store_latency_seconds_count')})",
                    "{{operation}}",
                )
            ],
            "ops",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Event loop lag",
            [
                target(
                    _histogram_quantile(q, "gpufleet_controller_event_loop_lag_seconds", ", instance"),
                    f"{name} {{{{instance}}}}",
                )
                for q, name in QUANTILES[1:]
            ],
            "s",
            description="How late each controller's event loop ran a task due every 0.25 s: what acks "
            "wait behind a scrape, a probe scheduling pass or a burst of frames. Well under a "
            "millisecond on a controller keeping up; near a second, it is falling behind (more "
            "ingest_fronts, or replicas).",
            min_value=0,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Open files, of the limit",
            [
                target(
                    "gpufleet_controller_open_files / on (job, instance) group_left "
                    "gpufleet_controller_open_files_limit",
                    "{{instance}} {{process}}",
                )
            ],
            "percentunit",
            description="Files open in the controller and in each ingest front, of the soft limit: "
            "an agent holds one, two while it reconnects. Past half, a fleet reconnecting at once could "
            "run out, and no connection is then accepted until others close "
            "(alert GpufleetControllerOpenFilesHigh).",
            min_value=0,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Recording (--record)",
            [
                target(
                    f"sum by (instance) ({rate('gpufleet_controller_record_written_total')})",
                    "{{instance}} written",
                ),
                target(
                    f"sum by (instance) ({rate('gpufleet_controller_record_dropped_total')})",
                    "{{instance}} lost",
                ),
            ],
            "cps",
            description="Accepted messages each controller's --record file takes, and those it loses: "
            "its writer behind (record_workers), its writes failing, or paused while its filesystem is "
            "nearly full (alerts GpufleetRecordingLosingMessages, GpufleetRecordingPaused). Telemetry "
            "ingest is never held back for it. Zero without --record.",
            min_value=0,
        ),
        8,
    )


def _findings(layout: Layout) -> None:
    layout.row("Findings and node health")
    layout.add(
        timeseries(
            "Active findings by cause",
            [target("sum by (cause) (gpufleet_controller_findings)", "{{cause}}")],
            "none",
            stack=True,
        ),
        12,
    )
    layout.add(
        bargauge(
            "Active findings by severity",
            [target("sum by (severity) (gpufleet_controller_findings)", "{{severity}}")],
            "none",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        12,
    )
    layout.add(
        status_history(
            "Node health",
            [target(node_health_code('node=~".+"'), "{{node}}")],
            mappings=node_health_mapping(),
        ),
        12,
        10,
    )
    layout.add(
        timeseries(
            "Nodes per health state",
            [target("sum by (state) (gpufleet_controller_node_health)", "{{state}}")],
            "none",
            stack=True,
        ),
        6,
        10,
    )
    layout.add(
        timeseries(
            "Since each node's last frame",
            [target("time() - gpufleet_controller_node_last_frame_timestamp_seconds", "{{node}}")],
            "s",
        ),
        6,
        10,
    )


def _detectors(layout: Layout) -> None:
    layout.row("Detectors")
    metric = "gpufleet_controller_detector_pass_duration_seconds"
    layout.add(
        timeseries(
            "Detector pass duration",
            [
                *(target(_histogram_quantile(q, metric), name) for q, name in QUANTILES),
                target(f"sum({rate(metric + '_sum')}) / sum({rate(metric + '_count')})", "mean"),
            ],
            "s",
            description="One pass runs every detector over the whole fleet.",
        ),
        12,
    )
    layout.add(
        timeseries("Detector passes", [target(f"sum({rate(metric + '_count')})", "passes")], "cps"),
        12,
    )
    layout.add(
        timeseries(
            "Detection process backlog",
            [target("sum(gpufleet_controller_detection_waiting_bytes)", "not read yet")],
            "bytes",
            description="Fleet changes sent to the detection processes that they have not read yet; "
            "a process that reads nothing past 512 MiB is stopped and started again.",
        ),
        12,
    )
    layout.add(
        timeseries(
            "Detection processes started",
            [
                target(
                    "sum(increase(gpufleet_controller_detection_process_starts_total[$__rate_interval]))",
                    "started",
                )
            ],
            "short",
            description="Beyond the first start of each, processes that died or were stopped.",
        ),
        12,
    )


def _probes(layout: Layout) -> None:
    layout.row("Probes")
    layout.add(
        timeseries(
            "Probes in flight",
            [
                target("gpufleet_controller_probes_in_flight", "nodes probing"),
                target("gpufleet_controller_probes_waiting", "waiting (on connect)"),
            ],
            "none",
            description="Nodes with a probe command sent and not yet answered; the scheduler keeps this "
            "under probes.max_fleet_share of the connected nodes. Waiting: nodes that connected while "
            "every slot was taken (a fleet reconnecting at once), probed in connect order.",
            min_value=0,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Probe commands sent",
            [
                target(
                    "sum by (reason) (increase(gpufleet_controller_probe_commands_total[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            "none",
            description="Per window: periodic (the scheduler), on_connect (a new agent boot), operator "
            "(gpufleet probe-node), recovery (a drained node whose findings cleared).",
            min_value=0,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Probe command failures",
            [
                target(
                    "sum by (failure) "
                    "(increase(gpufleet_controller_probe_command_failures_total[$__rate_interval]))",
                    "{{failure}}",
                )
            ],
            "none",
            description="Per window: error (the agent answered a failure), timeout (no answer within "
            "probes.timeout_seconds), restarted (the agent rebooted first).",
            min_value=0,
        ),
        8,
    )


def _actions(layout: Layout) -> None:
    """The acting half: the blast-radius breaker and the actions asked of it (controller/metrics_actions.py).
    The leader's only: a standby replica acts on nothing."""
    layout.row("Actions and the breaker")
    layout.add(
        stat(
            "Breaker",
            [target("max(gpufleet_controller_breaker_tripped)")],
            "none",
            description="Tripped: an action would have exceeded the blast-radius budget; every retune, drain "
            "and cordon is refused until `gpufleet breaker reset` (recovery still proceeds).",
            mappings=[
                {
                    "type": "value",
                    "options": {
                        "0": {"text": "armed", "color": "green", "index": 0},
                        "1": {"text": "tripped", "color": "red", "index": 1},
                    },
                }
            ],
        ),
        6,
    )
    layout.add(
        timeseries(
            "Nodes in action against the budget",
            [
                target('gpufleet_controller_breaker_nodes_in_action{scope="fleet"}', "in action"),
                target('gpufleet_controller_breaker_node_limit{scope="fleet"}', "budget"),
            ],
            "none",
            description="Distinct nodes with an action in the breaker's window (in progress, or ended within "
            "breaker.window_seconds), fleet-wide, against max(1, ceil(breaker.share x nodes)). Automatic "
            "actions wait while it is full; an operator's is refused and trips the breaker.",
            min_value=0,
        ),
        9,
    )
    layout.add(
        timeseries(
            "Actions by outcome",
            [
                target(
                    "sum by (kind, outcome) (increase(gpufleet_controller_actions_total[$__rate_interval]))",
                    "{{kind}} {{outcome}}",
                )
            ],
            "none",
            description="Per window: retunes, drains and cordons refused by the breaker, or allowed and then "
            "succeeded, failed or rolled back (a retune whose re-probe did not verify). `gpufleet history` "
            "has each one.",
            min_value=0,
        ),
        9,
    )


def build() -> JSON:
    layout = Layout()
    _summary(layout)
    _ingest(layout)
    _findings(layout)
    _detectors(layout)
    _probes(layout)
    _actions(layout)
    return dashboard(
        "gpufleet-controller",
        "gpufleet / Controller",
        "The controller itself: streams, ingest rate and lag, store latency, findings, node health, "
        "detector passes, probe commands, actions and the blast-radius breaker.",
        layout,
        [],
    )
