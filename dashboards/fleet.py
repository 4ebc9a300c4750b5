"""Fleet overview: which nodes are unhealthy, which GPUs are slow and why, fleet-wide heat and power."""

from __future__ import annotations

from dashboards.grafana import (
    JSON,
    UP_MAPPING,
    Layout,
    bargauge,
    dashboard,
    heatmap,
    query_variable,
    stat,
    status_history,
    table,
    target,
    thresholds,
    timeseries,
)
from dashboards.promql import (
    AGENT_JOB,
    NODE,
    THROTTLE_REASONS,
    node_health_code,
    node_health_mapping,
    probe_vs_peers,
    regex,
)

RED_FROM_ONE = thresholds((None, "green"), (1, "red"))


def _summary(layout: Layout) -> None:
    layout.add(
        stat(
            "Nodes reporting",
            [target(f"count(count by (node) (gpufleet_agent_info{{{AGENT_JOB}, {NODE}}}))")],
            "none",
        ),
        4,
        4,
    )
    layout.add(stat("Agents up", [target(f"sum(up{{{AGENT_JOB}}})")], "none"), 4, 4)
    layout.add(
        stat(
            "Agents down",
            [target(f"count(up{{{AGENT_JOB}}} == 0) or vector(0)")],
            "none",
            description="Agent scrape targets Prometheus cannot reach.",
            steps=RED_FROM_ONE,
        ),
        4,
        4,
    )
    layout.add(
        stat(
            "Agents streaming to the controller",
            [target("sum(gpufleet_controller_connected_agents)")],
            "none",
        ),
        4,
        4,
    )
    layout.add(stat("GPUs", [target(f"count(gpufleet_gpu_info{{{NODE}}})")], "none"), 4, 4)
    layout.add(stat("GPU power", [target(f"sum(gpufleet_gpu_power_watts{{{NODE}}})")], "watt"), 4, 4)


def _health(layout: Layout) -> None:
    layout.row("Health")
    layout.add(
        status_history(
            "Node health (controller)",
            [target(node_health_code(), "{{node}}")],
            description="The controller's view of each node: healthy, degraded (active findings), "
            "critical (a critical finding) or stale (no recent frame).",
            mappings=node_health_mapping(),
        ),
        16,
        10,
    )
    layout.column(
        [
            stat(
                "Active findings by severity",
                [target("sum by (severity) (gpufleet_controller_findings)", "{{severity}}")],
                "none",
                steps=RED_FROM_ONE,
            ),
            bargauge(
                "Active findings by cause",
                [target("sum by (cause) (gpufleet_controller_findings)", "{{cause}}")],
                "none",
                steps=RED_FROM_ONE,
            ),
        ],
        8,
        5,
    )
    layout.add(
        status_history(
            "Agent scrape",
            [target(f"up{{{AGENT_JOB}}}", "{{instance}}")],
            description="Whether Prometheus reached each agent's /metrics.",
            mappings=UP_MAPPING,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Nodes with a failing collector",
            [target(f"sum by (collector) (1 - gpufleet_collector_success{{{NODE}}})", "{{collector}}")],
            "none",
            description="How many nodes' agents had each collector fail in their latest cycle.",
            min_value=0,
        ),
        12,
        8,
    )


def _slow(layout: Layout) -> None:
    layout.row("Slow GPUs and nodes")
    layout.add(
        table(
            "Active findings",
            [target(f"gpufleet_controller_finding_active{{{NODE}}}", table=True)],
            "none",
            description="Every active finding the controller holds; slow GPUs and nodes (raised by "
            "the peer-baseline probe detector) first. gpu is empty for node-level findings; silenced is true "
            "where a silence or maintenance covers it (gpufleet's alerts leave those out).",
            hide=("Time", "__name__", "job", "instance", "Value"),
            sort=(("slow", True),),
        ),
        24,
        9,
    )
    layout.add(
        table(
            "Probe results against the peer median",
            [target(probe_vs_peers(), table=True)],
            "percentunit",
            description="Each GPU's (or node's, for nccl) latest probe result divided by the fleet "
            "median of the same probe and variant: 100% is typical, lower is slower. Compare like with "
            "like: in a fleet of several GPU models, filter the nodes of one model.",
            hide=("Time", "job", "instance"),
            rename={"Value": "against peer median"},
            sort=(("against peer median", False),),
            steps=thresholds((None, "red"), (0.9, "yellow"), (0.95, "green")),
        ),
        14,
        10,
    )
    layout.add(
        bargauge(
            "Lowest probe results against the peer median",
            [target(f"bottomk(10, {probe_vs_peers()})", "{{node}} gpu {{gpu}} {{probe}}/{{variant}}")],
            "percentunit",
            min_value=0,
            max_value=1.2,
            steps=thresholds((None, "red"), (0.9, "yellow"), (0.95, "green")),
        ),
        10,
        10,
    )


def _throttling(layout: Layout) -> None:
    layout.row("Throttling")
    layout.add(
        timeseries(
            "GPUs per clock-event reason",
            [target(f"sum by (reason) (gpufleet_gpu_clock_event_reason{{{NODE}}})", "{{reason}}")],
            "none",
            description="How many GPUs report each NVML clock-event (throttle) reason.",
        ),
        12,
        8,
    )
    layout.add(
        table(
            "GPUs throttled now",
            [
                target(
                    f'gpufleet_gpu_clock_event_reason{{{NODE}, reason=~"{regex(THROTTLE_REASONS)}"}} == 1',
                    table=True,
                )
            ],
            "none",
            description="GPUs slowed by heat, power or a hardware slowdown signal right now.",
            hide=("Time", "__name__", "job", "instance", "Value", "pci_bus_id"),
            sort=(("reason", False),),
        ),
        12,
        8,
    )


def _heat_and_power(layout: Layout) -> None:
    layout.row("Temperature and power")
    layout.add(
        heatmap(
            "GPU temperature distribution", [target(f"gpufleet_gpu_temperature_celsius{{{NODE}}}")], "celsius"
        ),
        12,
        8,
    )
    quantiles = ((0.5, "median"), (0.9, "p90"), (0.99, "p99"))
    layout.add(
        timeseries(
            "GPU and HBM temperature quantiles",
            [
                *(
                    target(f"quantile({q}, gpufleet_gpu_temperature_celsius{{{NODE}}})", f"GPU {name}")
                    for q, name in quantiles
                ),
                target(f"max(gpufleet_gpu_temperature_celsius{{{NODE}}})", "GPU max"),
                target(f"max(gpufleet_gpu_memory_temperature_celsius{{{NODE}}})", "HBM max"),
            ],
            "celsius",
        ),
        12,
        8,
    )
    layout.add(
        heatmap("GPU power distribution", [target(f"gpufleet_gpu_power_watts{{{NODE}}}")], "watt"), 12, 8
    )
    layout.add(
        timeseries(
            "GPU power against the enforced limit",
            [
                target(
                    f"quantile({q}, gpufleet_gpu_power_watts{{{NODE}}}"
                    f" / gpufleet_gpu_power_limit_watts{{{NODE}}})",
                    name,
                )
                for q, name in ((0.1, "p10"), *quantiles)
            ],
            "percentunit",
            description="Power draw as a share of each GPU's enforced power limit.",
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Fleet power",
            [
                target(f"sum(gpufleet_gpu_power_watts{{{NODE}}})", "GPUs (NVML)"),
                target(f"sum(gpufleet_bmc_system_power_watts{{{NODE}}})", "systems (BMC)"),
                target(f"sum(gpufleet_bmc_psu_input_watts{{{NODE}}})", "PSU input (BMC)"),
            ],
            "watt",
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "GPU power by node",
            [target(f"sum by (node) (gpufleet_gpu_power_watts{{{NODE}}})", "{{node}}")],
            "watt",
            stack=True,
        ),
        12,
        8,
    )


def _agents(layout: Layout) -> None:
    layout.row("Agents")
    layout.add(
        timeseries(
            "Snapshot age",
            [target(f"time() - gpufleet_snapshot_timestamp_seconds{{{NODE}}}", "{{node}}")],
            "s",
            description="Seconds since each agent's latest sampling cycle; it should stay near the "
            "sampling interval.",
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Slowest collector duration",
            [target(f"max by (collector) (gpufleet_collector_duration_seconds{{{NODE}}})", "{{collector}}")],
            "s",
        ),
        6,
        8,
    )
    layout.add(
        table(
            "Agent versions",
            [target(f"count by (version) (gpufleet_agent_info{{{NODE}}})", table=True)],
            "none",
            hide=("Time",),
            rename={"Value": "agents"},
        ),
        6,
        8,
    )


def build() -> JSON:
    layout = Layout()
    _summary(layout)
    _health(layout)
    _slow(layout)
    _throttling(layout)
    _heat_and_power(layout)
    _agents(layout)
    variables = [
        query_variable("job", "Agent job", "label_values(gpufleet_agent_info, job)"),
        query_variable("node", "Node", 'label_values(gpufleet_agent_info{job=~"$job"}, node)'),
    ]
    return dashboard(
        "gpufleet-fleet",
        "gpufleet / Fleet overview",
        "Fleet health, slow GPUs and nodes against their peers, throttling, temperature and power.",
        layout,
        variables,
    )
