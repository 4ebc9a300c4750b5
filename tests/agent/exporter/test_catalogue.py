"""catalogue.yaml: the names fixed for dashboards and alerts, every GPU reading covered, dcgm-exporter's
default counters covered, and a catalogue the exporter could not produce refused at load."""

from __future__ import annotations

import csv
import dataclasses
import typing

import pytest

from agent.exporter import catalogue
from agent.exporter.catalogue import CatalogueError, parse
from agent.exporter.view import _SCOPES, SCOPE_LABELS
from agent.sources.gpu import GpuReading
from tests.agent.exporter.simnode import shared_dcgm


def _words(text: str) -> list[str]:
    return text.split()


GPU = ["node", "gpu", "gpu_uuid", "model_name", "pci_bus_id"]
IB = ["node", "device", "port", "link_layer"]

# The names the dashboards and alerts use, with their labels (lead's contract: never renamed).
FIXED: dict[str, list[str]] = {
    "gpufleet_gpu_info": [*GPU, "driver_version", "vbios_version", "serial", "board_part_number"],
    **{
        f"gpufleet_gpu_{name}": GPU
        for name in _words(
            "utilization_ratio memory_utilization_ratio memory_used_bytes memory_total_bytes "
            "memory_free_bytes sm_clock_hertz memory_clock_hertz max_sm_clock_hertz "
            "applications_sm_clock_hertz power_watts power_limit_watts default_power_limit_watts "
            "energy_joules_total temperature_celsius memory_temperature_celsius "
            "slowdown_temperature_celsius pcie_link_gen pcie_link_gen_max pcie_link_width "
            "pcie_link_width_max pcie_tx_bytes_per_second pcie_rx_bytes_per_second "
            "pcie_replay_errors_total ecc_corrected_errors_total ecc_uncorrected_errors_total "
            "row_remap_correctable_total row_remap_uncorrectable_total row_remap_pending "
            "row_remap_failure xid_errors_total xid_last_code nvlink_transmit_bytes_total "
            "nvlink_receive_bytes_total sm_activity_ratio tensor_activity_ratio dram_activity_ratio "
            "graphics_activity_ratio performance_state"
        )
    },
    "gpufleet_gpu_clock_event_reason": [*GPU, "reason"],
    **{
        f"gpufleet_gpu_nvlink_{name}": [*GPU, "link"]
        for name in (
            "active",
            "crc_errors_total",
            "replay_errors_total",
            "recovery_errors_total",
            "link_transmit_bytes_total",
            "link_receive_bytes_total",
        )
    },
    "gpufleet_host_info": ["node", "kernel", "os", "cpu_model"],
    **{
        f"gpufleet_host_{name}": ["node"]
        for name in _words(
            "cpu_utilization_ratio cpu_frequency_hertz load1 load5 load15 memory_used_bytes "
            "memory_total_bytes memory_available_bytes swap_used_bytes swap_total_bytes "
            "hugepages_total hugepages_free hugepage_size_bytes numa_balancing_enabled uptime_seconds"
        )
    },
    "gpufleet_host_cpu_core_utilization_ratio": ["node", "cpu"],
    "gpufleet_host_cpu_core_frequency_hertz": ["node", "cpu"],
    "gpufleet_host_cpu_governor_cores": ["node", "governor"],
    "gpufleet_host_transparent_hugepage": ["node", "mode"],
    **{
        f"gpufleet_host_network_{direction}_{what}_total": ["node", "interface"]
        for direction in ("receive", "transmit")
        for what in ("bytes", "packets", "errors", "drops")
    },
    "gpufleet_host_disk_read_bytes_total": ["node", "device"],
    "gpufleet_host_disk_written_bytes_total": ["node", "device"],
    "gpufleet_host_disk_io_time_seconds_total": ["node", "device"],
    **{
        f"gpufleet_host_infiniband_port_{name}": IB
        for name in _words(
            "active physical_link_up rate_bits_per_second link_downed_total symbol_errors_total "
            "receive_errors_total link_error_recovery_total transmit_discards_total "
            "receive_bytes_total transmit_bytes_total"
        )
    },
    **{
        f"gpufleet_host_pcie_aer_{kind}_errors_total": ["node", "device"]
        for kind in ("correctable", "nonfatal", "fatal")
    },
    "gpufleet_bmc_up": ["node"],
    "gpufleet_bmc_poll_duration_seconds": ["node"],
    "gpufleet_bmc_section_success": ["node", "section"],
    "gpufleet_bmc_health": ["node", "component"],
    "gpufleet_bmc_temperature_celsius": ["node", "sensor", "context", "chassis"],
    "gpufleet_bmc_fan_speed_rpm": ["node", "fan", "chassis"],
    "gpufleet_bmc_fan_health": ["node", "fan", "chassis"],
    "gpufleet_bmc_psu_health": ["node", "psu", "chassis"],
    "gpufleet_bmc_psu_input_watts": ["node", "psu", "chassis"],
    "gpufleet_bmc_psu_output_watts": ["node", "psu", "chassis"],
    "gpufleet_bmc_system_power_watts": ["node"],
    "gpufleet_bmc_gpu_temperature_celsius": ["node", "gpu", "gpu_uuid"],
    "gpufleet_bmc_gpu_power_watts": ["node", "gpu", "gpu_uuid"],
    "gpufleet_probe_value": ["node", "probe", "variant", "unit", "gpu"],
    **{
        f"gpufleet_probe_{name}": ["node", "probe", "variant", "gpu"]
        for name in ("peak_ratio", "duration_seconds", "success", "timestamp_seconds")
    },
    "gpufleet_agent_info": ["node", "version"],
    "gpufleet_collector_success": ["node", "collector"],
    "gpufleet_collector_duration_seconds": ["node", "collector"],
    "gpufleet_snapshot_timestamp_seconds": ["node"],
}


def test_every_fixed_name_is_in_the_catalogue_with_its_labels() -> None:
    specs = {m.name: m for m in catalogue.load().metrics}
    missing = sorted(set(FIXED) - set(specs))
    assert not missing
    wrong = {
        name: specs[name].labels
        for name, labels in FIXED.items()
        if sorted(specs[name].labels) != sorted(labels)
    }
    assert not wrong


def test_native_names_types_and_units() -> None:
    for spec in catalogue.load().metrics:
        assert spec.type in ("gauge", "counter", "info"), spec.name
        assert spec.help and spec.labels[0] == "node", spec.name
        if spec.type == "counter":
            assert spec.name.endswith("_total"), spec.name
        for unit in ("_hz", "_mhz", "_percent", "_kb", "_mb", "_ms"):
            assert unit not in spec.name, f"{spec.name}: base units only"


def _numeric(annotation: str) -> bool:
    return any(t in annotation for t in ("int", "float", "bool"))


def test_every_numeric_gpu_reading_field_is_exported() -> None:
    """A field added to GpuReading without a metric fails here (identity fields excepted)."""
    hints = typing.get_type_hints(GpuReading)
    numeric = {
        f.name
        for f in dataclasses.fields(GpuReading)
        if f.name != "index" and _numeric(str(hints[f.name])) and "list" not in str(hints[f.name])
    }
    sourced = {
        term.split(".")[-1]
        for spec in catalogue.load().metrics
        for term in spec.source.replace("+", " ").replace(",", " ").split()
        if term.startswith("gpus[].")
    }
    assert numeric - sourced == set()
    for listed in ("nvlinks", "processes", "xid_events", "xid_counts"):
        assert listed in sourced or any(f"gpus[].{listed}[]" in s.source for s in catalogue.load().metrics)


def _default_counters() -> dict[str, tuple[str, str]]:
    """dcgm-exporter's default counters (name -> (type, help)), comments left out."""
    out = {}
    with shared_dcgm("default-counters.csv").open() as f:
        for row in csv.reader(f, skipinitialspace=True):
            if not row or row[0].lstrip().startswith("#"):
                continue
            name, kind, help_text = (cell.strip() for cell in (row[0], row[1], ",".join(row[2:])))
            out[name] = (kind, help_text)
    return out


def test_dcgm_section_covers_the_default_counters_nvml_can_provide() -> None:
    counters = _default_counters()
    specs = {m.name: m for m in catalogue.load().dcgm}
    # Not metrics: the driver version is a label of every series; the vGPU license only exists in a
    # vGPU guest (the YAML says why it is left out).
    expected = {name for name, (kind, _) in counters.items() if kind != "label"} - {
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS"
    }
    assert "DCGM_FI_DRIVER_VERSION" in counters and counters["DCGM_FI_DRIVER_VERSION"][0] == "label"
    assert set(specs) == expected
    for name, spec in specs.items():
        assert (spec.type, spec.help) == counters[name], name
        assert "DCGM_FI_DRIVER_VERSION" in spec.labels


def test_every_scope_has_its_labels_declared() -> None:
    assert set(_SCOPES) == set(SCOPE_LABELS)


GOOD = """
metrics:
  gpufleet_gpu_power_watts:
    type: gauge
    help: Power.
    labels: [node, gpu, gpu_uuid, model_name, pci_bus_id]
    source: gpus[].power_watts
dcgm:
  labels: [gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION]
  label_sources:
    {gpu: a, UUID: a, pci_bus_id: a, device: a, modelName: a, Hostname: a, DCGM_FI_DRIVER_VERSION: a}
  metrics: {}
"""


def test_a_small_catalogue_parses() -> None:
    [spec] = parse(GOOD).metrics
    assert (spec.scope, spec.field, spec.type) == ("gpus[]", "power_watts", "gauge")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("source: gpus[].power_watts", "source: gpus[].nope[].x", "unknown source scope"),
        ("labels: [node, gpu,", "labels: [node, link, gpu,", "labels"),
        ("type: gauge", "type: counter", "counters end in _total"),
        ("type: gauge", "type: histogram", "not valid"),
        ("source: gpus[].power_watts", "source: gpus[].power_watts\n    derive: magic", "unknown derivation"),
        ("gpufleet_gpu_power_watts:", "gpu_power_watts:", "start with gpufleet_"),
        ("labels: [node, gpu, gpu_uuid, model_name, pci_bus_id]", "labels: [gpu]", "carries node"),
        ("    help: Power.\n", "    help: Power.\n    colour: red\n", "not valid"),
        ("labels: [gpu, UUID,", "labels: [UUID, gpu,", "dcgm labels must be"),
    ],
)
def test_a_catalogue_the_exporter_cannot_produce_is_refused(old: str, new: str, expected: str) -> None:
    assert old in GOOD
    with pytest.raises(CatalogueError, match=expected):
        parse(GOOD.replace(old, new, 1))
