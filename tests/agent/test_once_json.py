"""`gpufleet agent --sim --once --json`: one stable JSON snapshot covering every GPU field family.

The contract: a field is non-null in every GPU's reading unless that GPU lists it in its inventory
`unsupported_fields` (per-link fields as "nvlinks.<field>"). Strings count as missing when empty.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.cli import _snapshot_json
from agent.snapshot import Snapshot
from agent.sources.gpu import GpuInfo, GpuReading, Inventory
from protos.names import clock_event_reason_names

REPO = Path(__file__).resolve().parents[2]

IDENTITY = (
    "index",
    "uuid",
    "name",
    "serial",
    "pci_bus_id",
    "vbios_version",
    "driver_version",
    "board_part_number",
    "memory_total_bytes",
    "nvlink_count",
    "mig_mode_enabled",
    "default_power_limit_watts",
)

# Reading fields by family, as the brief for full NVML coverage lists them.
FAMILIES: dict[str, tuple[str, ...]] = {
    "utilization": (
        "gpu_utilization_ratio",
        "memory_utilization_ratio",
        "encoder_utilization_ratio",
        "decoder_utilization_ratio",
    ),
    "memory": ("memory_total_bytes", "memory_used_bytes", "memory_free_bytes"),
    "clocks": (
        "sm_clock_hz",
        "memory_clock_hz",
        "graphics_clock_hz",
        "applications_sm_clock_hz",
        "applications_memory_clock_hz",
        "max_sm_clock_hz",
        "max_memory_clock_hz",
        "max_graphics_clock_hz",
    ),
    "power": (
        "power_watts",
        "power_management_limit_watts",
        "enforced_power_limit_watts",
        "power_limit_min_watts",
        "power_limit_max_watts",
        "default_power_limit_watts",
        "energy_joules_total",
    ),
    "temperatures": (
        "temperature_celsius",
        "memory_temperature_celsius",
        "slowdown_temperature_celsius",
        "shutdown_temperature_celsius",
        "max_operating_temperature_celsius",
        "memory_max_operating_temperature_celsius",
    ),
    "performance_state": ("performance_state",),
    "clock_event_reasons": ("clock_event_reasons", "clock_event_reason_names"),
    "ecc": (
        "ecc_mode_enabled",
        "ecc_corrected_volatile_total",
        "ecc_uncorrected_volatile_total",
        "ecc_corrected_aggregate_total",
        "ecc_uncorrected_aggregate_total",
    ),
    "row_remap": (
        "row_remap_correctable_total",
        "row_remap_uncorrectable_total",
        "row_remap_pending",
        "row_remap_failure",
    ),
    "pcie": (
        "pcie_link_gen",
        "pcie_link_gen_max",
        "pcie_link_width",
        "pcie_link_width_max",
        "pcie_tx_bytes_per_second",
        "pcie_rx_bytes_per_second",
        "pcie_replay_errors_total",
    ),
    "nvlink_totals": ("nvlink_tx_bytes_total", "nvlink_rx_bytes_total"),
    "modes": ("persistence_mode_enabled", "compute_mode", "compute_mode_name"),
    "gpm": (
        "gpm_sm_activity_ratio",
        "gpm_tensor_activity_ratio",
        "gpm_dram_activity_ratio",
        "gpm_graphics_activity_ratio",
    ),
    "fabric": ("fabric_state", "fabric_state_name"),
}

# Asked of active links only (a link that is down answers nothing but its state).
LINK_FIELDS = (
    "version",
    "remote_pci_bus_id",
    "crc_errors_total",
    "replay_errors_total",
    "recovery_errors_total",
    "tx_bytes_total",
    "rx_bytes_total",
)
LISTS = ("nvlinks", "processes", "xid_events", "xid_counts")


@pytest.fixture(scope="module")
def raw() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--sim", "--once", "--json", "--node", "sim-0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def once(raw: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(raw, parse_constant=_reject_constant)
    return body


def _reject_constant(name: str) -> Any:
    raise AssertionError(f"non-JSON constant {name} in the output")


def _missing(value: Any) -> bool:
    return value is None or value == ""


def _summary(missing: list[tuple[str, int]]) -> str:
    """ "field: gpus [..]" per null field, so a failure names fields rather than 8 copies of each."""
    by_field: dict[str, list[int]] = {}
    for name, gpu in missing:
        by_field.setdefault(name, []).append(gpu)
    return "null on: " + "; ".join(f"{name} (gpus {sorted(set(g))})" for name, g in sorted(by_field.items()))


def _pairs(once: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(inventory GpuInfo, reading) per GPU, matched by UUID."""
    infos = {info["uuid"]: info for info in once["inventory"]["gpus"]}
    return [(infos[reading["uuid"]], reading) for reading in once["snapshot"]["gpus"]]


def test_one_reading_per_inventory_gpu(once: dict[str, Any]) -> None:
    assert once["node"] == "sim-0"
    assert once["inventory"]["source"] == "sim"
    gpus = once["inventory"]["gpus"]
    assert len(gpus) == 8
    assert sorted(r["uuid"] for r in once["snapshot"]["gpus"]) == sorted(g["uuid"] for g in gpus)
    assert all(status["success"] for status in once["snapshot"]["collectors"].values())


def test_every_reading_field_is_a_key(once: dict[str, Any]) -> None:
    """The schema is stable: every GpuReading field is printed, null or not."""
    fields = {f.name for f in dataclasses.fields(GpuReading)}
    for _, reading in _pairs(once):
        assert fields <= set(reading), sorted(fields - set(reading))


def test_identity(once: dict[str, Any]) -> None:
    missing = [
        (name, info["index"])
        for info, _ in _pairs(once)
        for name in IDENTITY
        if _missing(info.get(name)) and name not in info["unsupported_fields"]
    ]
    assert not missing, _summary(missing)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_field_family(once: dict[str, Any], family: str) -> None:
    missing = []
    for info, reading in _pairs(once):
        unsupported = set(info["unsupported_fields"])
        for name in FAMILIES[family]:
            # A derived name is as supported as the number it names.
            source = name.removesuffix("_names").removesuffix("_name")
            if _missing(reading.get(name)) and not {name, source} & unsupported:
                missing.append((name, info["index"]))
    assert not missing, _summary(missing)


def test_lists_are_lists(once: dict[str, Any]) -> None:
    for _, reading in _pairs(once):
        for name in LISTS:
            assert isinstance(reading[name], list), name
        for event in reading["xid_events"]:
            assert {"code", "unix_time_seconds"} <= set(event)
        for count in reading["xid_counts"]:
            assert {"code", "total"} <= set(count)


def test_nvlinks(once: dict[str, Any]) -> None:
    missing = []
    for info, reading in _pairs(once):
        unsupported = set(info["unsupported_fields"])
        links = reading["nvlinks"]
        if "nvlinks.active" not in unsupported and info["nvlink_count"]:
            assert len(links) == info["nvlink_count"], f"gpu {info['index']}"
        for link in links:
            assert isinstance(link["active"], bool)
            if not link["active"]:
                continue
            missing += [
                (f"nvlinks.{name}", info["index"])
                for name in LINK_FIELDS
                if _missing(link.get(name)) and f"nvlinks.{name}" not in unsupported
            ]
    assert not missing, _summary(missing)


def test_processes(once: dict[str, Any]) -> None:
    """The simulated node runs a job (load 0.95 by default): every GPU lists its process."""
    missing = []
    for info, reading in _pairs(once):
        unsupported = set(info["unsupported_fields"])
        if "processes" in unsupported:
            continue
        if not reading["processes"]:
            missing.append(("processes (empty list)", info["index"]))
        for process in reading["processes"]:
            assert isinstance(process["pid"], int) and process["pid"] > 0, process
            assert process["kind"] in ("compute", "graphics"), process
            if process["used_memory_bytes"] is None and "processes.used_memory_bytes" not in unsupported:
                missing.append(("processes.used_memory_bytes", info["index"]))
    assert not missing, _summary(missing)


def test_decoded_names_match_the_numbers(once: dict[str, Any]) -> None:
    for _, reading in _pairs(once):
        bits = reading["clock_event_reasons"]
        if bits is not None:
            assert reading["clock_event_reason_names"] == clock_event_reason_names(bits)
        for number, name in (("compute_mode", "compute_mode_name"), ("fabric_state", "fabric_state_name")):
            assert (reading[number] is None) == (reading[name] is None), number
            if reading[number]:
                assert reading[name] and not reading[name].startswith("unknown_"), reading[name]


def test_output_is_stable_json(raw: str, once: dict[str, Any]) -> None:
    """Sorted keys at every level and no NaN, so two snapshots diff cleanly and parse anywhere."""
    assert raw.rstrip("\n") == json.dumps(once, indent=2, sort_keys=True, allow_nan=False)


def test_snapshot_json_names_enums_and_drops_non_finite_numbers() -> None:
    inventory = Inventory(source="test", gpus=[GpuInfo(index=0, uuid="GPU-0", name="test")])
    reading = GpuReading(
        index=0,
        uuid="GPU-0",
        power_watts=math.nan,
        temperature_celsius=math.inf,
        sm_clock_hz=-math.inf,
        clock_event_reasons=4 | 64 | 0x10000,
        compute_mode=1,
        fabric_state=4,
    )
    body = json.loads(_snapshot_json(inventory, Snapshot(node="n", time=1.0, gpus=[reading]), "n"))
    gpu = body["snapshot"]["gpus"][0]
    assert gpu["power_watts"] is None
    assert gpu["temperature_celsius"] is None
    assert gpu["sm_clock_hz"] is None
    assert gpu["clock_event_reasons"] == 4 | 64 | 0x10000
    assert gpu["clock_event_reason_names"] == ["sw_power_cap", "hw_thermal_slowdown", "bit_0x10000"]
    assert (gpu["compute_mode"], gpu["compute_mode_name"]) == (1, "default")
    assert (gpu["fabric_state"], gpu["fabric_state_name"]) == (4, "completed")


def test_snapshot_json_unread_and_unknown_enums() -> None:
    inventory = Inventory(source="test", gpus=[])
    unread = GpuReading(index=0, uuid="GPU-0")
    odd = GpuReading(index=1, uuid="GPU-1", compute_mode=99, clock_event_reasons=0)
    body = json.loads(_snapshot_json(inventory, Snapshot(node="n", time=1.0, gpus=[unread, odd]), "n"))
    first, second = body["snapshot"]["gpus"]
    assert first["clock_event_reason_names"] is None
    assert first["compute_mode_name"] is None
    assert first["fabric_state_name"] is None
    assert second["clock_event_reason_names"] == []
    assert second["compute_mode_name"] == "unknown_99"
