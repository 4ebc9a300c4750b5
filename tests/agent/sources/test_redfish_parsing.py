"""The pure Redfish JSON -> BmcSample translations, on shapes seen on real BMCs.

Whole services are exercised against real servers in test_redfish_bmc.py; these pin the rules
that are easy to get subtly wrong: where a sensor sits, GPU board matching, log ordering.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.sources.gpu import GpuInfo
from agent.sources.redfish.gpus import GpuBoard, board_slot, gpu_board, map_boards
from agent.sources.redfish.inventory import attribute_text, bios_pending, log_entry, newest
from agent.sources.redfish.thermal import context_of, fans_from_legacy, temperatures_from_legacy
from agent.sources.redfish.values import health, number, snake, worst


def test_sensor_context_from_name_where_physical_context_says_little() -> None:
    assert context_of("System Board Inlet Temp", "SystemBoard") == "intake"  # Dell's naming
    assert context_of("System Board Exhaust Temp", "SystemBoard") == "exhaust"
    assert context_of("GT_MB_OUTLET_L_TEMP_C", "") == "exhaust"
    assert context_of("CPU1 Temp", "CPU") == "cpu"
    assert context_of("DIMM A1 Temp", "SystemBoard") == "memory"
    assert context_of("HGX_GPU_SXM_3_TEMP_0", "GPU") == "gpu"
    assert context_of("PSU2 Temp", "PowerSupply") == "power_supply"
    assert context_of("Mystery", "") == "other"


def test_values_reject_what_is_not_a_reading() -> None:
    assert number({"Reading": float("nan")}, "Reading") is None
    assert number({"Reading": True}, "Reading") is None
    assert number({"Reading": "41"}, "Reading") is None
    assert number({"Reading": 41}, "Reading") == 41.0
    assert health({"Status": {"HealthRollUp": "Critical", "Health": "OK"}}, rollup=True) == "critical"
    assert health({"Status": "OK"}) == ""
    assert snake("UnavailableOffline") == "unavailable_offline"
    assert worst(["ok", "warning", "", "ok"]) == "warning"
    assert worst(["ok", "Degraded-by-vendor"]) == "Degraded-by-vendor"  # unknown counts as warning
    assert worst([]) == ""


def test_legacy_thermal_tolerates_missing_properties() -> None:
    thermal = {
        "@odata.id": "/redfish/v1/Chassis/1/Thermal",
        "Temperatures": [
            {"Name": "Inlet Temp", "ReadingCelsius": 24, "UpperThresholdCritical": 42},
            {"MemberId": "7", "Status": {"State": "Absent"}},
            "not an object",
        ],
        "Fans": [{"Reading": 45, "ReadingUnits": "Percent"}, {"Name": "Fan 2", "Reading": 9000}],
    }
    temps = temperatures_from_legacy(thermal, "1")
    assert [(t.name, t.context, t.reading_celsius, t.upper_critical_celsius) for t in temps] == [
        ("Inlet Temp", "intake", 24.0, 42.0),
        ("temperature 7", "other", None, None),
    ]
    assert temps[1].state == "absent"
    fans = fans_from_legacy(thermal, "1")
    assert [(f.name, f.speed_rpm, f.speed_ratio) for f in fans] == [
        ("fan 0", None, 0.45),
        ("Fan 2", 9000.0, None),
    ]


def test_gpu_boards_exclude_roots_of_trust_and_switches() -> None:
    assert board_slot({"Id": "HGX_GPU_SXM_7"}) == 7
    assert board_slot({"Id": "GPU_SXM_2"}) == 2
    assert board_slot({"Id": "HGX_ERoT_GPU_SXM_1"}) is None
    assert board_slot({"Id": "HGX_NVSwitch_0"}) is None
    assert board_slot({"Id": "HGX_Baseboard_0"}) is None


def test_gpu_board_reads_gpu_memory_and_power_sensors() -> None:
    sensors = [
        {"Name": "HGX_GPU_SXM_1_DRAM_0_Temp_0", "ReadingType": "Temperature", "Reading": 51},
        {
            "Name": "HGX_GPU_SXM_1_TEMP_0",
            "ReadingType": "Temperature",
            "PhysicalContext": "GPU",
            "Reading": 41,
        },
        {"Name": "HGX_GPU_SXM_1_Energy_0", "ReadingType": "EnergyJoules", "Reading": 1e9},
        {"Name": "HGX_GPU_SXM_1_Power_0", "ReadingType": "Power", "Reading": 310},
    ]
    board = gpu_board({"Id": "HGX_GPU_SXM_1", "SerialNumber": " 1654 "}, sensors, {})
    assert (board.temperature_celsius, board.memory_temperature_celsius, board.power_watts) == (41, 51, 310)
    assert board.serial == "1654"
    fallback = gpu_board({"Id": "HGX_GPU_SXM_2"}, [], {"PowerWatts": {"Reading": 280}})
    assert fallback.power_watts == 280 and fallback.temperature_celsius is None


def _board(slot: int, serial: str = "", uuid: str = "") -> GpuBoard:
    return GpuBoard(slot, f"HGX_GPU_SXM_{slot}", serial, uuid, 40.0 + slot, None, None, "ok")


def test_boards_map_by_serial_then_uuid_then_slot_order() -> None:
    gpus = [
        GpuInfo(0, "GPU-aaaa", "H100", serial="S0"),
        GpuInfo(1, "GPU-BBBB", "H100", serial="S1"),
        GpuInfo(2, "GPU-cccc", "H100", serial="S2"),
        GpuInfo(3, "GPU-dddd", "H100", serial="S3"),
    ]
    boards = [_board(4, serial="S1"), _board(2, uuid="bbbb"), _board(3, uuid="CCCC"), _board(1), _board(5)]
    mapped = {g.chassis: (g.index, g.matched_by) for g in map_boards(boards, gpus)}
    # Slot 2's UUID names GPU 1, already taken by serial: it falls back to slot order with slot 1.
    assert mapped == {
        "HGX_GPU_SXM_4": (1, "serial"),
        "HGX_GPU_SXM_3": (2, "uuid"),
        "HGX_GPU_SXM_1": (0, "index"),
        "HGX_GPU_SXM_2": (3, "index"),
        "HGX_GPU_SXM_5": (4, "none"),  # more boards than GPUs: kept, numbered after them
    }


def test_boards_without_inventory_number_by_slot() -> None:
    mapped = map_boards([_board(2), _board(1)], [])
    assert [(g.index, g.chassis, g.matched_by) for g in mapped] == [
        (0, "HGX_GPU_SXM_1", "index"),
        (1, "HGX_GPU_SXM_2", "index"),
    ]


def test_bios_pending_is_what_differs_as_text() -> None:
    assert attribute_text(True) == "true"
    assert attribute_text(4.0) == "4"
    assert attribute_text(None) == ""
    current = {"Turbo": "Enabled", "Cores": "0"}
    settings = {"Attributes": {"Turbo": "Disabled", "Cores": 0, "New": False}}
    assert bios_pending(current, settings) == {"Turbo": "Disabled", "New": "false"}


def test_newest_log_entries_across_time_offsets() -> None:
    entries = [
        log_entry({"Id": "a", "Created": "2026-11-23T10:00:00+06:00", "Severity": "OK"}, "/l"),  # 04:00Z
        log_entry({"Id": "b", "Created": "2026-11-23T05:00:00Z", "Severity": "Critical"}, "/l"),
        log_entry({"Id": "c", "Severity": "Warning"}, "/l"),
        log_entry({"Id": "d", "Created": "2026-11-23T04:30:00", "Message": "x" * 900}, "/l"),
    ]
    assert [e.id for e in newest(entries, 3)] == ["b", "d", "a"]
    assert newest(entries, 3)[0].severity == "critical"
    assert len(entries[3].message) == 500


def test_only_the_redfish_module_imports_the_redfish_library() -> None:
    repo = Path(__file__).resolve().parents[3]
    importing = re.compile(r"^\s*(import|from)\s+redfish\b", re.MULTILINE)
    found = [
        str(p.relative_to(repo))
        for package in ("agent", "controller", "protos")
        for p in (repo / package).rglob("*.py")
        if importing.search(p.read_text())
    ]
    assert found == ["agent/sources/redfish/session.py"]
