"""Node detail: one node's (or a few nodes') GPUs, BMC, host CPU and memory, InfiniBand and PCIe AER,
and its agent's stream to the controller."""

from __future__ import annotations

from dashboards.grafana import (
    HEALTH_MAPPING,
    JSON,
    SUCCESS_MAPPING,
    UP_MAPPING,
    YES_NO_MAPPING,
    Layout,
    bargauge,
    dashboard,
    heatmap,
    query_variable,
    stat,
    state_timeline,
    status_history,
    table,
    target,
    thresholds,
    timeseries,
)
from dashboards.promql import GPU, NODE, rate

GPU_LEGEND = "{{node}} GPU {{gpu}}"
CONNECTED_MAPPING: list[JSON] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "not connected", "color": "red", "index": 0},
            "1": {"text": "connected", "color": "green", "index": 1},
        },
    }
]
PORT_LEGEND = "{{node}} {{device}}/{{port}}"


def _gpu_identity(layout: Layout) -> None:
    layout.row("GPUs")
    layout.add(
        table(
            "GPU inventory",
            [target(f"gpufleet_gpu_info{{{GPU}}}", table=True)],
            "none",
            hide=("Time", "__name__", "job", "instance", "Value"),
            sort=(("node", False),),
        ),
        24,
        7,
    )


def _clocks_and_power(layout: Layout) -> None:
    layout.row("Clocks and power")
    layout.add(
        timeseries(
            "SM clock",
            [
                target(f"gpufleet_gpu_sm_clock_hertz{{{GPU}}}", GPU_LEGEND),
                target(f"max(gpufleet_gpu_max_sm_clock_hertz{{{GPU}}})", "max"),
            ],
            "hertz",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Application (locked) SM clock",
            [target(f"gpufleet_gpu_applications_sm_clock_hertz{{{GPU}}}", GPU_LEGEND)],
            "hertz",
            description="The clock the GPU targets under load; below the maximum when an operator or "
            "a profile locked it low.",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Memory clock", [target(f"gpufleet_gpu_memory_clock_hertz{{{GPU}}}", GPU_LEGEND)], "hertz"
        ),
        8,
    )
    layout.add(
        timeseries(
            "Power against the enforced limit",
            [
                target(f"gpufleet_gpu_power_watts{{{GPU}}}", GPU_LEGEND),
                target(f"gpufleet_gpu_power_limit_watts{{{GPU}}}", GPU_LEGEND + " limit"),
            ],
            "watt",
        ),
        12,
    )
    layout.add(
        bargauge(
            "Enforced power limit against the default",
            [
                target(
                    f"gpufleet_gpu_power_limit_watts{{{GPU}}}"
                    f" / gpufleet_gpu_default_power_limit_watts{{{GPU}}}",
                    GPU_LEGEND,
                )
            ],
            "percentunit",
            description="Below 100%: the power limit was lowered (a power cap).",
            min_value=0,
            max_value=1,
            steps=thresholds((None, "red"), (0.95, "green")),
        ),
        6,
    )
    layout.add(
        status_history(
            "GPUs per clock-event reason",
            [target(f"sum by (reason) (gpufleet_gpu_clock_event_reason{{{GPU}}})", "{{reason}}")],
            description="How many of the selected GPUs report each NVML clock-event (throttle) reason.",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        6,
    )
    layout.add(
        stat(
            "Energy in the time range",
            [target(f"sum(increase(gpufleet_gpu_energy_joules_total{{{GPU}}}[$__range]))")],
            "joule",
        ),
        12,
        4,
    )
    layout.add(
        stat(
            "Performance state",
            [target(f"max(gpufleet_gpu_performance_state{{{GPU}}})", "worst P-state")],
            "none",
            description="NVML performance state (P0 fastest); the worst of the selected GPUs.",
            decimals=0,
        ),
        12,
        4,
    )


def _heat_and_load(layout: Layout) -> None:
    layout.row("Temperature and utilisation")
    layout.add(
        timeseries(
            "GPU temperature",
            [
                target(f"gpufleet_gpu_temperature_celsius{{{GPU}}}", GPU_LEGEND),
                target(f"min(gpufleet_gpu_slowdown_temperature_celsius{{{GPU}}})", "slowdown threshold"),
            ],
            "celsius",
        ),
        12,
    )
    layout.add(
        timeseries(
            "HBM temperature",
            [target(f"gpufleet_gpu_memory_temperature_celsius{{{GPU}}}", GPU_LEGEND)],
            "celsius",
        ),
        12,
    )
    layout.add(
        timeseries(
            "Utilisation",
            [
                target(f"gpufleet_gpu_utilization_ratio{{{GPU}}}", GPU_LEGEND),
                target(f"gpufleet_gpu_memory_utilization_ratio{{{GPU}}}", GPU_LEGEND + " memory"),
            ],
            "percentunit",
            description="NVML utilisation: share of time a kernel ran, and share of time memory was "
            "read or written.",
            min_value=0,
            max_value=1,
        ),
        8,
    )
    layout.add(
        timeseries(
            "SM, tensor and DRAM activity",
            [
                target(f"avg by (node) (gpufleet_gpu_sm_activity_ratio{{{GPU}}})", "{{node}} SM"),
                target(f"avg by (node) (gpufleet_gpu_tensor_activity_ratio{{{GPU}}})", "{{node}} tensor"),
                target(f"avg by (node) (gpufleet_gpu_dram_activity_ratio{{{GPU}}})", "{{node}} DRAM"),
                target(f"avg by (node) (gpufleet_gpu_graphics_activity_ratio{{{GPU}}})", "{{node}} graphics"),
            ],
            "percentunit",
            description="Profiling counters (GPM / DCGM profiling), averaged over the selected GPUs.",
            min_value=0,
            max_value=1,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Memory used",
            [
                target(f"gpufleet_gpu_memory_used_bytes{{{GPU}}}", GPU_LEGEND),
                target(f"max(gpufleet_gpu_memory_total_bytes{{{GPU}}})", "total"),
            ],
            "bytes",
        ),
        8,
    )


def _memory_errors(layout: Layout) -> None:
    layout.row("ECC, row remapping and XID")
    layout.add(
        timeseries(
            "ECC errors",
            [
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_ecc_corrected_errors_total', GPU)})",
                    GPU_LEGEND + " corrected",
                ),
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_ecc_uncorrected_errors_total', GPU)})",
                    GPU_LEGEND + " uncorrected",
                ),
            ],
            "cps",
            description="Volatile ECC error counts (since the driver loaded), as a rate.",
        ),
        8,
    )
    layout.add(
        table(
            "Row remapping",
            [
                target(f"max by (node, gpu) (gpufleet_gpu_row_remap_correctable_total{{{GPU}}})", table=True),
                target(
                    f"max by (node, gpu) (gpufleet_gpu_row_remap_uncorrectable_total{{{GPU}}})", table=True
                ),
                target(f"max by (node, gpu) (gpufleet_gpu_row_remap_pending{{{GPU}}})", table=True),
                target(f"max by (node, gpu) (gpufleet_gpu_row_remap_failure{{{GPU}}})", table=True),
            ],
            "none",
            description="Rows remapped for correctable and uncorrectable errors; pending (a GPU reset "
            "applies it) and failure (no spare row left: replace the GPU) are 0 or 1.",
            hide=("Time",),
            rename={
                "Value #A": "correctable rows",
                "Value #B": "uncorrectable rows",
                "Value #C": "pending",
                "Value #D": "failed",
            },
            sort=(("pending", True),),
        ),
        8,
    )
    layout.add(
        status_history(
            "Row remap pending or failed",
            [
                target(f"gpufleet_gpu_row_remap_pending{{{GPU}}}", GPU_LEGEND + " pending"),
                target(f"gpufleet_gpu_row_remap_failure{{{GPU}}}", GPU_LEGEND + " failed"),
            ],
            mappings=YES_NO_MAPPING,
        ),
        8,
    )
    layout.add(
        timeseries(
            "XID errors",
            [
                target(
                    f"sum by (node, gpu) "
                    f"(increase(gpufleet_gpu_xid_errors_total{{{GPU}}}[$__rate_interval]))",
                    GPU_LEGEND,
                )
            ],
            "none",
            description="New XID events (driver-reported GPU errors) per interval, all codes together.",
        ),
        12,
    )
    layout.add(
        table(
            "Last XID code",
            [target(f"max by (node, gpu) (gpufleet_gpu_xid_last_code{{{GPU}}})", table=True)],
            "none",
            description="The most recent XID code per GPU (0: none since the agent started).",
            hide=("Time",),
            rename={"Value": "last XID"},
            sort=(("last XID", True),),
            decimals=0,
        ),
        12,
    )


def _pcie(layout: Layout) -> None:
    layout.row("PCIe")
    layout.add(
        table(
            "PCIe link against its maximum",
            [
                target(f"max by (node, gpu) (gpufleet_gpu_pcie_link_gen{{{GPU}}})", table=True),
                target(f"max by (node, gpu) (gpufleet_gpu_pcie_link_gen_max{{{GPU}}})", table=True),
                target(f"max by (node, gpu) (gpufleet_gpu_pcie_link_width{{{GPU}}})", table=True),
                target(f"max by (node, gpu) (gpufleet_gpu_pcie_link_width_max{{{GPU}}})", table=True),
            ],
            "none",
            description="Current PCIe generation and width beside the maximum the GPU and slot "
            "support. An idle GPU may lower its generation to save power; under load it should be at "
            "its maximum.",
            hide=("Time",),
            rename={"Value #A": "gen", "Value #B": "max gen", "Value #C": "width", "Value #D": "max width"},
            sort=(("width", False),),
            decimals=0,
        ),
        8,
    )
    layout.add(
        timeseries(
            "PCIe throughput",
            [
                target(f"gpufleet_gpu_pcie_tx_bytes_per_second{{{GPU}}}", GPU_LEGEND + " tx"),
                target(f"gpufleet_gpu_pcie_rx_bytes_per_second{{{GPU}}}", GPU_LEGEND + " rx"),
            ],
            "Bps",
        ),
        8,
    )
    layout.add(
        timeseries(
            "PCIe replays",
            [
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_pcie_replay_errors_total', GPU)})", GPU_LEGEND
                )
            ],
            "cps",
            description="Link-level retransmissions; a steady rate points at a marginal link or riser.",
        ),
        8,
    )


def _nvlink(layout: Layout) -> None:
    layout.row("NVLink")
    layout.add(
        bargauge(
            "Active NVLinks",
            [target(f"sum by (node, gpu) (gpufleet_gpu_nvlink_active{{{GPU}}})", GPU_LEGEND)],
            "none",
            description="Active links per GPU; every GPU of one model should show the same number.",
            min_value=0,
        ),
        8,
    )
    layout.add(
        timeseries(
            "NVLink errors",
            [
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_nvlink_crc_errors_total', GPU)})",
                    GPU_LEGEND + " CRC",
                ),
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_nvlink_replay_errors_total', GPU)})",
                    GPU_LEGEND + " replay",
                ),
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_nvlink_recovery_errors_total', GPU)})",
                    GPU_LEGEND + " recovery",
                ),
            ],
            "cps",
        ),
        8,
    )
    layout.add(
        timeseries(
            "NVLink throughput",
            [
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_nvlink_transmit_bytes_total', GPU)})",
                    GPU_LEGEND + " tx",
                ),
                target(
                    f"sum by (node, gpu) ({rate('gpufleet_gpu_nvlink_receive_bytes_total', GPU)})",
                    GPU_LEGEND + " rx",
                ),
            ],
            "Bps",
        ),
        8,
    )
    # A link carrying far less than its GPU's other links under the same collective: a degraded or
    # down link, a wrong topology. Idle GPUs (no traffic) are left out rather than shown as 0.
    link = (
        "sum by (node, gpu, link) ("
        f"{rate('gpufleet_gpu_nvlink_link_transmit_bytes_total', GPU)}"
        f" + {rate('gpufleet_gpu_nvlink_link_receive_bytes_total', GPU)})"
    )
    layout.add(
        bargauge(
            "Weakest NVLinks: traffic against the GPU's mean link",
            [
                target(
                    f"bottomk(16, ({link}) / on (node, gpu) group_left () (avg by (node, gpu) ({link}) > 0))",
                    GPU_LEGEND + " link {{link}}",
                )
            ],
            "percentunit",
            description="The 16 links carrying the least against the mean of their GPU's links (tx + rx): "
            "the links of a GPU share a collective evenly, so one well below 100% is degraded, down or "
            "cabled to the wrong peer. GPUs moving nothing over NVLink are left out.",
            min_value=0,
            max_value=1.2,
        ),
        24,
    )


def _bmc(layout: Layout) -> None:
    layout.row("BMC")
    layout.add(
        stat("BMC reachable", [target(f"min(gpufleet_bmc_up{{{NODE}}})")], "none", mappings=UP_MAPPING), 4, 4
    )
    layout.add(
        stat("BMC poll duration", [target(f"max(gpufleet_bmc_poll_duration_seconds{{{NODE}}})")], "s"), 4, 4
    )
    layout.add(
        status_history(
            "BMC sections",
            [target(f"gpufleet_bmc_section_success{{{NODE}}}", "{{node}} {{section}}")],
            mappings=SUCCESS_MAPPING,
        ),
        8,
        4,
    )
    layout.add(
        status_history(
            "BMC health",
            [target(f"gpufleet_bmc_health{{{NODE}}}", "{{node}} {{component}}")],
            mappings=HEALTH_MAPPING,
        ),
        8,
        4,
    )
    layout.add(
        timeseries(
            "BMC temperatures",
            [target(f"gpufleet_bmc_temperature_celsius{{{NODE}}}", "{{node}} {{sensor}}")],
            "celsius",
            description="Every temperature sensor the BMC reports (inlet, exhaust, CPU, board ...).",
        ),
        12,
    )
    layout.add(
        timeseries(
            "GPU temperature: BMC against NVML",
            [
                target(f"gpufleet_bmc_gpu_temperature_celsius{{{GPU}}}", GPU_LEGEND + " BMC"),
                target(f"gpufleet_gpu_temperature_celsius{{{GPU}}}", GPU_LEGEND + " NVML"),
            ],
            "celsius",
            description="The baseboard's own view of each GPU beside the driver's.",
        ),
        12,
    )
    layout.add(
        timeseries("Fan speed", [target(f"gpufleet_bmc_fan_speed_rpm{{{NODE}}}", "{{node}} {{fan}}")], "rpm"),
        8,
    )
    layout.add(
        status_history(
            "Fan health",
            [target(f"gpufleet_bmc_fan_health{{{NODE}}}", "{{node}} {{fan}}")],
            mappings=HEALTH_MAPPING,
        ),
        8,
    )
    layout.add(
        status_history(
            "PSU health",
            [target(f"gpufleet_bmc_psu_health{{{NODE}}}", "{{node}} {{psu}}")],
            mappings=HEALTH_MAPPING,
        ),
        8,
    )
    layout.add(
        timeseries(
            "PSU power",
            [
                target(f"gpufleet_bmc_psu_input_watts{{{NODE}}}", "{{node}} {{psu}} in"),
                target(f"gpufleet_bmc_psu_output_watts{{{NODE}}}", "{{node}} {{psu}} out"),
            ],
            "watt",
        ),
        12,
    )
    layout.add(
        timeseries(
            "System power: BMC against the GPUs",
            [
                target(f"gpufleet_bmc_system_power_watts{{{NODE}}}", "{{node}} system (BMC)"),
                target(f"sum by (node) (gpufleet_gpu_power_watts{{{NODE}}})", "{{node}} GPUs (NVML)"),
            ],
            "watt",
        ),
        12,
    )


def _host(layout: Layout) -> None:
    layout.row("Host")
    layout.add(
        timeseries(
            "CPU utilisation",
            [target(f"gpufleet_host_cpu_utilization_ratio{{{NODE}}}", "{{node}}")],
            "percentunit",
            min_value=0,
            max_value=1,
        ),
        8,
    )
    layout.add(
        heatmap(
            "Per-core utilisation",
            [target(f"gpufleet_host_cpu_core_utilization_ratio{{{NODE}}}")],
            "percentunit",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Load average",
            [
                target(f"gpufleet_host_load1{{{NODE}}}", "{{node}} 1m"),
                target(f"gpufleet_host_load5{{{NODE}}}", "{{node}} 5m"),
                target(f"gpufleet_host_load15{{{NODE}}}", "{{node}} 15m"),
            ],
            "none",
        ),
        8,
    )
    layout.add(
        heatmap(
            "Per-core frequency",
            [target(f"gpufleet_host_cpu_core_frequency_hertz{{{NODE}}}")],
            "hertz",
            description="cpufreq's current frequency of every core; a powersave governor keeps it low.",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Mean CPU frequency",
            [target(f"gpufleet_host_cpu_frequency_hertz{{{NODE}}}", "{{node}}")],
            "hertz",
        ),
        8,
    )
    layout.add(
        bargauge(
            "Cores per governor",
            [target(f"gpufleet_host_cpu_governor_cores{{{NODE}}}", "{{node}} {{governor}}")],
            "none",
            description="GPU nodes should run the performance governor on every core.",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Memory",
            [
                target(f"gpufleet_host_memory_used_bytes{{{NODE}}}", "{{node}} used"),
                target(f"gpufleet_host_memory_available_bytes{{{NODE}}}", "{{node}} available"),
                target(f"gpufleet_host_memory_total_bytes{{{NODE}}}", "{{node}} total"),
                target(f"gpufleet_host_swap_used_bytes{{{NODE}}}", "{{node}} swap used"),
            ],
            "bytes",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Network throughput",
            [
                target(
                    f"sum by (node, interface) ({rate('gpufleet_host_network_receive_bytes_total', NODE)})",
                    "{{node}} {{interface}} rx",
                ),
                target(
                    f"sum by (node, interface) ({rate('gpufleet_host_network_transmit_bytes_total', NODE)})",
                    "{{node}} {{interface}} tx",
                ),
            ],
            "Bps",
        ),
        8,
    )
    layout.add(
        timeseries(
            "Disk throughput",
            [
                target(
                    f"sum by (node, device) ({rate('gpufleet_host_disk_read_bytes_total', NODE)})",
                    "{{node}} {{device}} read",
                ),
                target(
                    f"sum by (node, device) ({rate('gpufleet_host_disk_written_bytes_total', NODE)})",
                    "{{node}} {{device}} written",
                ),
            ],
            "Bps",
        ),
        8,
    )


def _infiniband(layout: Layout) -> None:
    layout.row("InfiniBand")
    layout.add(
        status_history(
            "Port state",
            [target(f"gpufleet_host_infiniband_port_active{{{NODE}}}", PORT_LEGEND)],
            mappings=UP_MAPPING,
            description="Port state ACTIVE (up) or anything else (down).",
        ),
        12,
    )
    layout.add(
        timeseries(
            "Port rate",
            [target(f"gpufleet_host_infiniband_port_rate_bits_per_second{{{NODE}}}", PORT_LEGEND)],
            "bps",
            description="Signalling rate the port trained to; a port below its peers is degraded.",
        ),
        12,
    )
    counters = (
        ("symbol_errors", "symbol errors"),
        ("link_downed", "link downed"),
        ("link_error_recovery", "link recoveries"),
        ("receive_errors", "receive errors"),
        ("transmit_discards", "transmit discards"),
    )
    layout.add(
        timeseries(
            "Port errors",
            [
                target(rate(f"gpufleet_host_infiniband_port_{name}_total", NODE), f"{PORT_LEGEND} {text}")
                for name, text in counters
            ],
            "cps",
        ),
        12,
    )
    layout.add(
        timeseries(
            "Port throughput",
            [
                target(rate("gpufleet_host_infiniband_port_receive_bytes_total", NODE), PORT_LEGEND + " rx"),
                target(rate("gpufleet_host_infiniband_port_transmit_bytes_total", NODE), PORT_LEGEND + " tx"),
            ],
            "Bps",
        ),
        12,
    )


def _aer(layout: Layout) -> None:
    layout.row("PCIe AER")
    classes = (("correctable", "correctable"), ("nonfatal", "non-fatal"), ("fatal", "fatal"))
    layout.add(
        timeseries(
            "AER errors",
            [
                target(
                    f"sum by (node) ({rate(f'gpufleet_host_pcie_aer_{name}_errors_total', NODE)})",
                    f"{{{{node}}}} {text}",
                )
                for name, text in classes
            ],
            "cps",
            description="PCIe Advanced Error Reporting, summed over the node's devices.",
        ),
        12,
    )
    layout.add(
        table(
            "AER errors per device",
            [
                target(
                    f"max by (node, device) (gpufleet_host_pcie_aer_{name}_errors_total{{{NODE}}})",
                    table=True,
                )
                for name, _ in classes
            ],
            "none",
            description="Totals since boot per PCI device.",
            hide=("Time",),
            rename={"Value #A": "correctable", "Value #B": "non-fatal", "Value #C": "fatal"},
            sort=(("correctable", True),),
        ),
        12,
    )


def _agent_stream(layout: Layout) -> None:
    """The agent's stream to the controller (agent/exporter/stream_families.py): whether the controller
    has it, the frames waiting for its ack, and frames lost."""
    layout.row("Stream to the controller")
    layout.add(
        state_timeline(
            "Stream to the controller",
            [target(f"gpufleet_agent_controller_connected{{{NODE}}}", "{{node}} to {{controller}}")],
            description="Whether the controller has accepted the agent's stream. While not, frames wait in "
            "the agent's spool; the agent's log says why on every retry.",
            mappings=CONNECTED_MAPPING,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Frames waiting for the controller's ack",
            [
                target(f"gpufleet_agent_spool_frames{{{NODE}}}", "{{node}} spooled"),
                target(f"gpufleet_agent_spool_max_frames{{{NODE}}}", "{{node}} limit"),
            ],
            "none",
            description="Frames in the agent's spool. At the limit (stream.spool_max_frames) the oldest "
            "are dropped.",
            min_value=0,
        ),
        8,
    )
    layout.add(
        timeseries(
            "Frames lost or set aside",
            [
                target(
                    rate("gpufleet_agent_spool_dropped_frames_total", NODE), "{{node}} dropped (spool full)"
                ),
                target(rate("gpufleet_agent_spool_rejected_frames_total", NODE), "{{node}} set aside"),
            ],
            "none",
            description="Frames a second: dropped from a full spool (telemetry the controller never gets), "
            "or set aside in the spool's rejected/ directory (refused by the controller for good).",
            min_value=0,
        ),
        8,
    )


def build() -> JSON:
    layout = Layout()
    _gpu_identity(layout)
    _clocks_and_power(layout)
    _heat_and_load(layout)
    _memory_errors(layout)
    _pcie(layout)
    _nvlink(layout)
    _bmc(layout)
    _host(layout)
    _infiniband(layout)
    _aer(layout)
    _agent_stream(layout)
    variables = [
        query_variable("job", "Agent job", "label_values(gpufleet_agent_info, job)"),
        query_variable("node", "Node", 'label_values(gpufleet_agent_info{job=~"$job"}, node)'),
        query_variable("gpu", "GPU", 'label_values(gpufleet_gpu_info{node=~"$node"}, gpu)'),
    ]
    return dashboard(
        "gpufleet-node",
        "gpufleet / Node detail",
        "One node in depth: per-GPU clocks, power, temperatures, errors, PCIe and NVLink; the BMC; the "
        "host's CPU, memory, InfiniBand and PCIe AER; the agent's stream to the controller.",
        layout,
        variables,
    )
