"""Detectors: pure functions from fleet state to findings with evidence; one file each, registered by name."""

# What the detectors find today: each cause they report, with the telemetry their evidence reads
# (contract field names, "nvlinks.active" for a field of each link, "probe.KIND" for a probe's
# results). A fault that shows only in other fields goes unseen even where its cause is listed
# (NVLink CRC errors on links that stay up, say). `gpufleet demo` injects only what these find.
DETECTED: dict[str, frozenset[str]] = {
    "thermal_throttle": frozenset({"clock_event_reasons", "probe.gemm"}),
    "power_brake": frozenset({"clock_event_reasons", "probe.gemm"}),
    "power_cap": frozenset({"clock_event_reasons", "enforced_power_limit_watts", "probe.gemm"}),
    "clocks_locked_low": frozenset({"applications_sm_clock_hz", "probe.gemm"}),
    "pcie_downtrained": frozenset({"pcie_link_gen", "pcie_link_width", "probe.pcie"}),
    "nvlink_down": frozenset({"nvlinks.active", "probe.nccl"}),
    "ecc_row_remap_pending": frozenset({"row_remap_pending"}),
    "hbm_degraded": frozenset({"probe.membw"}),
}
