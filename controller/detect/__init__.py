"""Detectors: pure functions from fleet state to findings with evidence; one file each, registered by name."""

# What the detectors find today: each cause they report, with the telemetry their evidence reads
# (contract field names, "nvlinks.active" for a field of each link, "probe.KIND" for a probe's
# results). A fault that shows only in other fields goes unseen even where its cause is listed.
# `gpufleet demo` injects only what these find.
DETECTED: dict[str, frozenset[str]] = {
    "thermal_throttle": frozenset({"clock_event_reasons", "probe.gemm"}),
    "power_brake": frozenset({"clock_event_reasons", "probe.gemm"}),
    "power_cap": frozenset({"clock_event_reasons", "enforced_power_limit_watts", "probe.gemm"}),
    "clocks_locked_low": frozenset(
        {"applications_sm_clock_hz", "sm_clock_hz", "clock_event_reasons", "probe.gemm"}
    ),
    "pcie_downtrained": frozenset({"pcie_link_gen", "pcie_link_width", "probe.pcie"}),
    "nvlink_down": frozenset({"nvlinks.active", "probe.nccl"}),
    "ecc_row_remap_pending": frozenset({"row_remap_pending"}),
    "hbm_degraded": frozenset({"probe.membw"}),
    "xid_error": frozenset({"xid_events", "xid_counts"}),
    "nvlink_errors": frozenset(
        {"nvlinks.crc_errors_total", "nvlinks.replay_errors_total", "nvlinks.recovery_errors_total"}
    ),
    "cpu_governor_powersave": frozenset(
        {"cpu_governor", "cpu_governors", "cpus.governor", "cpu_frequency_hz"}
    ),
    "host_tuning_drift": frozenset({"numa_balancing", "transparent_hugepage"}),
    "ib_link_degraded": frozenset(
        {
            "infiniband.state",
            "infiniband.physical_state",
            "infiniband.rate_gbps",
            "infiniband.symbol_error_total",
            "infiniband.port_rcv_errors_total",
            "infiniband.link_error_recovery_total",
            "infiniband.link_downed_total",
        }
    ),
    "fan_failure": frozenset({"fans.health", "fans.speed_rpm"}),
    "psu_failure": frozenset(
        {"power_supplies.health", "power_supplies.output_watts", "power_supply_redundancy_health"}
    ),
    "inlet_temperature_high": frozenset({"temperatures.intake"}),
    "firmware_drift": frozenset(
        {"inventory.vbios_version", "inventory.driver_version", "bmc_firmware_version", "bios_version"}
    ),
    "bios_drift": frozenset({"bios_attributes"}),
    "driver_branch_slow": frozenset({"inventory.driver_version", "probe.gemm"}),
}
