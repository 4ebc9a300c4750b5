"""NvmlSource against the fake NVML (test_nvml_fake): inventory, readings in base units, errors."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from agent.sources.errors import SourceError
from agent.sources.gpu import ComputeProcess, GpuReading
from agent.sources.nvml import source as nvml_module
from agent.sources.nvml.source import NvmlSource
from tests.agent.sources import test_nvml_fake as nvml_fake
from tests.agent.sources.test_nvml_fake import (
    CLUSTER_UUID,
    DOWN_LINK,
    GPM_PERCENT,
    H100_LINKS,
    FakeNvml,
    fast_xid_thread,
)

ROW_REMAP_FIELDS = [
    "row_remap_correctable_total",
    "row_remap_uncorrectable_total",
    "row_remap_pending",
    "row_remap_failure",
]
RETIRED_FIELDS = ["retired_pages_sbe_total", "retired_pages_dbe_total", "retired_pages_pending"]
GPM_FIELDS = [
    "gpm_sm_activity_ratio",
    "gpm_tensor_activity_ratio",
    "gpm_dram_activity_ratio",
    "gpm_graphics_activity_ratio",
]
FABRIC_FIELDS = ["fabric_state", "fabric_status", "fabric_cluster_uuid", "fabric_clique_id"]


@pytest.fixture(autouse=True)
def _fast_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_xid_thread(monkeypatch)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def source(fake: FakeNvml) -> Iterator[NvmlSource]:
    # GPM compared over any window: reads here are microseconds apart (the window: test_nvml_gpm_window.py).
    with NvmlSource(nvml=fake.module, gpm_min_window_s=0.0) as s:
        yield s


def by_index(readings: list[GpuReading]) -> dict[int, GpuReading]:
    return {r.index: r for r in readings}


def test_inventory_fields(source: NvmlSource) -> None:
    inv = source.inventory()
    assert inv.source == "nvml"
    assert inv.driver_version == "550.54.15"
    assert inv.cuda_driver_version == "12.4"
    assert inv.expected_gpu_count == 2
    h100, l40s = inv.gpus
    assert h100.index == 0 and h100.uuid == "GPU-2f4b6a1e-8c3d-4e5f-9a0b-1c2d3e4f5a6b"
    assert h100.name == "NVIDIA H100 80GB HBM3"
    assert h100.serial == "1652823012345"
    assert h100.pci_bus_id == "00000000:18:00.0"
    assert h100.board_part_number == "692-2G520-0200-000"
    assert h100.vbios_version == "96.00.89.00.01"
    assert h100.driver_version == "550.54.15"
    assert h100.memory_total_bytes == 85_520_809_984
    assert h100.nvlink_count == H100_LINKS
    assert h100.mig_mode_enabled is False
    assert (h100.default_power_limit_watts, l40s.default_power_limit_watts) == (700.0, 350.0)  # power class
    # Reported once, in the inventory: what each GPU answered NOT_SUPPORTED for.
    assert sorted(h100.unsupported_fields) == sorted([*RETIRED_FIELDS, "fan_speed_ratio"])
    assert l40s.nvlink_count == 0
    assert l40s.mig_mode_enabled is None
    assert sorted(l40s.unsupported_fields) == sorted(
        [
            "mig_mode_enabled",
            "memory_temperature_celsius",
            *ROW_REMAP_FIELDS,
            "nvlink_tx_bytes_total",
            "nvlink_rx_bytes_total",
            *GPM_FIELDS,
            *FABRIC_FIELDS,
        ]
    )


def test_bytes_and_str_answers_read_the_same(source: NvmlSource) -> None:
    l40s = source.inventory().gpus[1]  # this fake GPU answers bytes, like older pynvml versions
    texts = (l40s.uuid, l40s.name, l40s.serial, l40s.pci_bus_id, l40s.vbios_version, l40s.board_part_number)
    assert all(type(text) is str for text in texts)
    assert (l40s.name, l40s.pci_bus_id) == ("NVIDIA L40S", "00000000:3B:00.0")
    assert by_index(source.read())[1].uuid == "GPU-7a8b9c0d-1e2f-3a4b-5c6d-7e8f9a0b1c2d"


def test_readings_in_base_units(source: NvmlSource) -> None:
    readings = by_index(source.read())
    assert source.last_errors() == []
    r = readings[0]
    assert r.uuid == "GPU-2f4b6a1e-8c3d-4e5f-9a0b-1c2d3e4f5a6b"
    assert (r.gpu_utilization_ratio, r.memory_utilization_ratio) == (0.87, 0.43)
    assert (r.encoder_utilization_ratio, r.decoder_utilization_ratio) == (0.05, 0.07)
    assert (r.memory_used_bytes, r.memory_total_bytes) == (1 << 30, 85_520_809_984)
    assert (r.memory_reserved_bytes, r.memory_free_bytes) == (
        512 << 20,
        85_520_809_984 - (1 << 30) - (512 << 20),
    )
    assert (r.sm_clock_hz, r.memory_clock_hz, r.graphics_clock_hz) == (1.98e9, 2.619e9, 1.965e9)
    assert (r.max_sm_clock_hz, r.max_memory_clock_hz, r.max_graphics_clock_hz) == (1.98e9, 2.619e9, 1.98e9)
    assert (r.applications_sm_clock_hz, r.applications_memory_clock_hz) == (1.755e9, 2.619e9)
    assert r.power_watts == 512.345
    assert (r.enforced_power_limit_watts, r.power_management_limit_watts) == (700.0, 700.0)
    assert (r.default_power_limit_watts, r.power_limit_min_watts, r.power_limit_max_watts) == (
        700.0,
        200.0,
        700.0,
    )
    assert r.energy_joules_total == pytest.approx(123_456.789)
    assert (r.temperature_celsius, r.memory_temperature_celsius) == (61.0, 70.0)
    assert (r.slowdown_temperature_celsius, r.shutdown_temperature_celsius) == (87.0, 92.0)
    assert (r.max_operating_temperature_celsius, r.memory_max_operating_temperature_celsius) == (85.0, 95.0)
    assert r.fan_speed_ratio is None  # SXM: no fan
    assert r.clock_event_reasons == pynvml.nvmlClocksEventReasonSwPowerCap
    assert r.performance_state == 0
    assert (r.pcie_link_gen, r.pcie_link_gen_max, r.pcie_link_width, r.pcie_link_width_max) == (5, 5, 16, 16)
    assert r.pcie_replay_errors_total == 5
    assert r.ecc_mode_enabled is True
    assert (r.ecc_corrected_volatile_total, r.ecc_uncorrected_volatile_total) == (3, 0)
    assert (r.ecc_corrected_aggregate_total, r.ecc_uncorrected_aggregate_total) == (12, 1)
    assert all(getattr(r, name) is None for name in RETIRED_FIELDS)
    assert (r.row_remap_correctable_total, r.row_remap_uncorrectable_total) == (2, 1)
    assert r.row_remap_pending is True and r.row_remap_failure is False
    link_kib = sum(1000 * (link + 1) for link in range(H100_LINKS))
    assert (r.nvlink_tx_bytes_total, r.nvlink_rx_bytes_total) == (link_kib * 1024, 2 * link_kib * 1024)
    assert r.persistence_mode_enabled is True
    assert r.compute_mode == pynvml.NVML_COMPUTEMODE_DEFAULT + 1
    assert r.processes == [ComputeProcess(4242, 8 << 30), ComputeProcess(4343, None)]
    assert r.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED + 1
    assert (r.fabric_status, r.fabric_clique_id) == (pynvml.NVML_SUCCESS, 7)
    assert r.fabric_cluster_uuid == str(uuid.UUID(bytes=CLUSTER_UUID))
    assert (r.xid_events, r.xid_counts) == ([], [])


def test_nvlink_readings(source: NvmlSource) -> None:
    r = source.read()[0]
    assert [link.link for link in r.nvlinks] == list(range(H100_LINKS))
    up, down = r.nvlinks[0], r.nvlinks[DOWN_LINK]
    assert up.active and up.version == 4  # NVML_NVLINK_VERSION_4_0 is NVLink 4
    assert (up.crc_errors_total, up.replay_errors_total, up.recovery_errors_total) == (7, 2, 1)
    assert (up.tx_bytes_total, up.rx_bytes_total) == (1000 * 1024, 2000 * 1024)
    assert up.remote_pci_bus_id == "00000000:05:00.0"
    assert r.nvlinks[3].remote_pci_bus_id == "00000000:08:00.0"
    assert not down.active and down.version is None and down.crc_errors_total is None


def test_pcie_card_readings(source: NvmlSource) -> None:
    pcie = source.read()[1]
    assert pcie.power_watts == 250.0 and pcie.performance_state == 8 and pcie.pcie_link_gen == 3
    assert pcie.fan_speed_ratio == 0.3
    assert pcie.compute_mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS + 1
    assert (pcie.retired_pages_sbe_total, pcie.retired_pages_dbe_total, pcie.retired_pages_pending) == (
        1,
        0,
        False,
    )
    assert pcie.nvlinks == [] and pcie.processes == []
    assert pcie.memory_temperature_celsius is None and pcie.fabric_state is None
    assert all(getattr(pcie, name) is None for name in ROW_REMAP_FIELDS + GPM_FIELDS)


def test_rates_and_gpm_come_from_the_previous_read(fake: FakeNvml, source: NvmlSource) -> None:
    first = source.read()[0]
    # Nothing to compare with yet: GPM and the PCIe byte counters need two reads.
    assert first.pcie_tx_bytes_per_second is None and first.gpm_sm_activity_ratio is None
    gpu = fake.gpus[0]
    gpu.pcie_tx += 50_000_000
    gpu.pcie_rx += 10_000_000
    gpu.field_time_us += 10_000_000  # ten seconds later, as NVML stamps the field values
    second = source.read()[0]
    assert (second.pcie_tx_bytes_per_second, second.pcie_rx_bytes_per_second) == (5_000_000.0, 1_000_000.0)
    assert second.gpm_sm_activity_ratio == 0.625
    assert (second.gpm_tensor_activity_ratio, second.gpm_dram_activity_ratio) == (0.41, 0.55)
    assert second.gpm_graphics_activity_ratio == 0.9
    assert source.last_errors() == []


def test_a_gpm_metric_the_driver_refuses_is_empty_and_said_once(
    fake: FakeNvml, source: NvmlSource, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As the H200 of 2026-11-28 showed for DRAM bandwidth: one metric failing leaves the others."""
    percent = {k: v for k, v in GPM_PERCENT.items() if k != pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL}
    monkeypatch.setattr(nvml_fake, "GPM_PERCENT", percent)
    with caplog.at_level(logging.INFO, logger="agent.sources.nvml.gpm"):
        readings = [source.read()[0] for _ in range(4)]
    assert [r.gpm_dram_activity_ratio for r in readings] == [None] * 4
    assert readings[-1].gpm_sm_activity_ratio == 0.625
    said = [r.getMessage() for r in caplog.records if "GPM metric" in r.getMessage()]
    assert len(said) == 1  # once per metric and error: not per read, nor per GPU
    assert "gpm_dram_activity_ratio not read (NVML error 3" in said[0]


def test_inventory_primes_rates_so_the_first_read_has_them(fake: FakeNvml, source: NvmlSource) -> None:
    source.inventory()
    fake.gpus[0].field_time_us += 1_000_000
    fake.gpus[0].pcie_tx += 1000
    first = source.read()[0]
    assert first.pcie_tx_bytes_per_second == 1000.0 and first.gpm_sm_activity_ratio == 0.625


def test_not_supported_is_listed_and_never_asked_again(fake: FakeNvml, source: NvmlSource) -> None:
    fake.errors[("nvmlDeviceGetEncoderUtilization", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    for _ in range(3):
        readings = by_index(source.read())
        assert source.last_errors() == []  # unsupported is not an error
        assert readings[0].encoder_utilization_ratio is None
        assert readings[1].encoder_utilization_ratio == 0.05
    assert fake.calls[("nvmlDeviceGetEncoderUtilization", 0)] == 1
    assert fake.calls[("nvmlDeviceGetEncoderUtilization", 1)] == 3
    assert fake.calls[("nvmlDeviceGetFanSpeed", 0)] == 1
    assert fake.calls[("nvmlDeviceGetRemappedRows", 1)] == 1  # its field values were missing first
    assert fake.calls[("nvmlDeviceGetRemappedRows", 0)] == 0  # answered as field values
    assert fake.calls[("nvmlGpmQueryDeviceSupport", 1)] == 1
    h100, l40s = source.inventory().gpus
    assert "encoder_utilization_ratio" in h100.unsupported_fields
    assert "row_remap_pending" in l40s.unsupported_fields


def test_a_failed_field_is_none_for_that_cycle_only(fake: FakeNvml, source: NvmlSource) -> None:
    fake.errors[("nvmlDeviceGetTemperature", 0)] = pynvml.NVML_ERROR_UNKNOWN
    readings = by_index(source.read())
    assert readings[0].temperature_celsius is None and readings[0].power_watts == 512.345
    assert readings[1].temperature_celsius == 61
    assert source.last_errors() == ["gpu 0 temperature_celsius: Unknown Error"]
    del fake.errors[("nvmlDeviceGetTemperature", 0)]
    assert by_index(source.read())[0].temperature_celsius == 61
    assert source.last_errors() == []
    assert "temperature_celsius" not in source.inventory().gpus[0].unsupported_fields


def test_a_lost_gpu_is_left_out_and_reported(fake: FakeNvml, source: NvmlSource) -> None:
    source.read()
    fake.gpus[0].lost = True
    for _ in range(2):
        readings = source.read()
        assert [r.index for r in readings] == [1]
        assert source.last_errors() == ["gpu 0 lost (fallen off the bus)"]
    # A lost GPU stays lost until a reset: it is not asked again.
    calls_to_gpu0 = fake.calls_to(0)
    source.read()
    assert fake.calls_to(0) == calls_to_gpu0
    assert [g.index for g in source.inventory().gpus] == [1]


def test_a_gpu_lost_in_a_field_value_is_lost(fake: FakeNvml, source: NvmlSource) -> None:
    fake.field_errors[(0, pynvml.NVML_FI_DEV_POWER_AVERAGE)] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert [r.index for r in source.read()] == [1]
    assert source.last_errors() == ["gpu 0 lost (fallen off the bus)"]


def test_every_gpu_lost_returns_nothing_without_raising(fake: FakeNvml, source: NvmlSource) -> None:
    for gpu in fake.gpus:
        gpu.lost = True
    assert source.read() == []
    assert source.last_errors() == ["gpu 0 lost (fallen off the bus)", "gpu 1 lost (fallen off the bus)"]


def test_a_gpu_lost_before_start_is_left_out(fake: FakeNvml) -> None:
    fake.gpus[1].lost = True
    with NvmlSource(nvml=fake.module) as source:
        assert [g.index for g in source.inventory().gpus] == [0]
        assert [r.index for r in source.read()] == [0]
        assert source.last_errors() == ["gpu 1 lost (fallen off the bus)"]


def test_a_gpu_that_cannot_be_opened_is_retried(fake: FakeNvml) -> None:
    fake.errors[("nvmlDeviceGetHandleByIndex", 1)] = pynvml.NVML_ERROR_UNKNOWN
    with NvmlSource(nvml=fake.module) as source:
        assert [r.index for r in source.read()] == [0]
        assert source.last_errors() == ["gpu 1: cannot open: Unknown Error"]
        del fake.errors[("nvmlDeviceGetHandleByIndex", 1)]
        assert [r.index for r in source.read()] == [0, 1]
        assert source.last_errors() == []
        source.read()
    assert fake.calls[("nvmlDeviceGetHandleByIndex", 1)] == 3  # start, first read, second read; cached after
    assert (1, pynvml.nvmlEventTypeXidCriticalError) in fake.registered  # watched once opened


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found: is the NVIDIA driver installed?"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "the NVIDIA driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to open the GPUs"),
    ],
)
def test_nvml_that_cannot_start_raises_a_clear_source_error(fake: FakeNvml, code: int, expected: str) -> None:
    fake.errors[("nvmlInit", None)] = code
    with pytest.raises(SourceError, match="--sim") as info:
        NvmlSource(nvml=fake.module)
    assert info.value.source == "nvml"
    assert expected in str(info.value)
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    # A failed start holds no share of NVML: the next attempt initialises again.
    del fake.errors[("nvmlInit", None)]
    with NvmlSource(nvml=fake.module):
        assert fake.initialised == 1


def test_a_failed_gpu_count_releases_nvml(fake: FakeNvml) -> None:
    fake.errors[("nvmlDeviceGetCount", None)] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(SourceError, match="cannot count the GPUs"):
        NvmlSource(nvml=fake.module)
    assert (fake.initialised, fake.shut_down) == (1, 1)


def test_missing_pynvml_raises_at_construction_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_module, "_pynvml", None)
    with pytest.raises(SourceError, match=r"pynvml module is missing.*nvidia-ml-py"):
        NvmlSource()

    # A fresh copy of the module, imported where `import pynvml` fails.
    monkeypatch.setitem(sys.modules, "pynvml", None)  # None in sys.modules makes the import raise
    spec = importlib.util.spec_from_file_location("nvml_without_pynvml", nvml_module.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, copy)  # dataclasses look their module up while defined
    spec.loader.exec_module(copy)
    with pytest.raises(SourceError, match="pynvml module is missing"):
        copy.NvmlSource()


def test_only_the_nvml_module_imports_pynvml() -> None:
    sources = nvml_module.__file__
    assert sources is not None
    importing = re.compile(r"^\s*(import|from)\s+pynvml\b", re.MULTILINE)
    tree = Path(sources).parent.parent  # agent/sources
    found = [p.relative_to(tree).as_posix() for p in tree.rglob("*.py") if importing.search(p.read_text())]
    assert found == ["nvml/source.py"]


def test_nvml_is_initialised_and_shut_down_once(fake: FakeNvml) -> None:
    a = NvmlSource(nvml=fake.module)
    b = NvmlSource(nvml=fake.module)
    assert (fake.initialised, fake.shut_down) == (1, 0)
    a.close()
    a.close()  # closing twice gives back one share only
    assert (fake.initialised, fake.shut_down) == (1, 0)
    assert len(b.read()) == 2
    b.close()
    assert (fake.initialised, fake.shut_down) == (1, 1)
    with pytest.raises(SourceError, match="closed"):
        b.read()
    with NvmlSource(nvml=fake.module):
        assert fake.initialised == 2
    assert fake.shut_down == 2


def test_close_frees_what_the_source_allocated(fake: FakeNvml) -> None:
    with NvmlSource(nvml=fake.module) as source:
        source.read()
        source.read()
        assert len(fake.samples) == 2  # two GPM samples for the H100, none for the L40S
    assert fake.samples == {} and fake.samples_freed == 2
    assert fake.event_sets == fake.event_sets_freed == 1


def test_clock_event_reasons_fall_back_to_throttle_reasons(fake: FakeNvml) -> None:
    both = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonGpuIdle
    fake.errors[("nvmlDeviceGetCurrentClocksEventReasons", 0)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    with NvmlSource(nvml=fake.module) as source:  # an older driver without the new symbol
        assert source.read()[0].clock_event_reasons == both
        assert source.last_errors() == []
    del fake.module.nvmlDeviceGetCurrentClocksEventReasons
    with NvmlSource(nvml=fake.module) as source:  # an older pynvml without the function
        assert [r.clock_event_reasons for r in source.read()] == [both, both]


def test_memory_info_falls_back_to_version_1(fake: FakeNvml) -> None:
    fake.gpus[0].memory_v2 = False  # a driver without nvmlDeviceGetMemoryInfo_v2
    with NvmlSource(nvml=fake.module) as source:
        r = source.read()[0]
        assert source.last_errors() == []
    assert r.memory_reserved_bytes is None and r.memory_total_bytes == 85_520_809_984
    assert (r.memory_used_bytes, r.memory_free_bytes) == (1 << 30, 85_520_809_984 - (1 << 30))


def test_fabric_falls_back_to_the_unversioned_call(fake: FakeNvml) -> None:
    del fake.module.nvmlDeviceGetGpuFabricInfoV  # an older pynvml
    fake.gpus[0].fabric_state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    with NvmlSource(nvml=fake.module) as source:
        r = source.read()[0]
    assert r.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS + 1
    assert (r.fabric_status, r.fabric_cluster_uuid, r.fabric_clique_id) == (None, "", None)
    assert fake.calls[("nvmlDeviceGetGpuFabricInfo", 0)] == 1


def test_gpm_is_unsupported_where_pynvml_or_the_driver_lack_it(fake: FakeNvml) -> None:
    fake.errors[("nvmlGpmSampleGet", 0)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND  # a driver without GPM
    with NvmlSource(nvml=fake.module) as source:
        assert set(GPM_FIELDS) <= set(source.inventory().gpus[0].unsupported_fields)
        assert source.read()[0].gpm_sm_activity_ratio is None and source.last_errors() == []
    del fake.module.nvmlGpmQueryDeviceSupport  # a pynvml without GPM
    with NvmlSource(nvml=fake.module) as source:
        assert set(GPM_FIELDS) <= set(source.inventory().gpus[0].unsupported_fields)


def test_unknown_performance_state_is_none_without_an_error(fake: FakeNvml, source: NvmlSource) -> None:
    fake.gpus[0].pstate = pynvml.NVML_PSTATE_UNKNOWN
    assert source.read()[0].performance_state is None
    assert source.last_errors() == []


def test_slow_every_must_be_positive(fake: FakeNvml) -> None:
    with pytest.raises(ValueError, match="slow_every"):
        NvmlSource(nvml=fake.module, slow_every=0)
    assert fake.initialised == 0


def real_nvml() -> NvmlSource:
    """An NvmlSource on the real driver, or the test skipped saying why not."""
    try:
        return NvmlSource()
    except SourceError as exc:
        pytest.skip(f"NVML cannot initialise here (no NVIDIA GPU or driver): {exc}")


@pytest.mark.gpu
def test_real_nvml_reads_once() -> None:
    with real_nvml() as source:
        inv = source.inventory()
        readings = source.read()
        errors = source.last_errors()
        calls = source.calls
    assert inv.source == "nvml" and inv.driver_version and inv.cuda_driver_version
    assert inv.gpus, "NVML started but lists no GPU"
    assert errors == []
    assert calls > 0
    assert [r.uuid for r in readings] == [g.uuid for g in inv.gpus]
    for gpu, r in zip(inv.gpus, readings, strict=True):
        assert gpu.uuid.startswith(("GPU-", "MIG-")) and gpu.name and gpu.pci_bus_id
        assert r.memory_total_bytes == gpu.memory_total_bytes
        assert r.temperature_celsius is not None and 0 < r.temperature_celsius < 120
        assert r.power_watts is not None and r.power_watts > 0
        assert r.sm_clock_hz is not None and r.sm_clock_hz > 1e8
        assert r.energy_joules_total is not None and r.energy_joules_total > 0
        assert r.enforced_power_limit_watts is not None and r.enforced_power_limit_watts > 0
        assert len(r.nvlinks) == gpu.nvlink_count
        for link in r.nvlinks:
            assert link.version is None or 1 <= link.version <= 6  # a generation, not NVML's enum
        if r.slowdown_temperature_celsius is not None:
            assert 50 < r.slowdown_temperature_celsius < 120  # Celsius, not the T.Limit scale
