"""NvmlSource against a fake NVML built from the real pynvml's constants, errors and structures.

Only the device functions are simulated (two GPUs: an HGX H100 with 18 NVLinks and a PCIe card
without NVLink or row remapping). Everything else is taken from the installed pynvml by attribute
access, and every simulated call is bound against the real function's signature, so a renamed
symbol or a wrong argument list fails here rather than on a GPU node.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pynvml
import pytest

from agent.sources import nvml as nvml_module
from agent.sources.errors import SourceError
from agent.sources.gpu import GpuReading
from agent.sources.nvml import NvmlSource

H100_LINKS = 18
DOWN_LINK = 5
ROW_REMAP_FIELDS = [
    "row_remap_correctable_total",
    "row_remap_uncorrectable_total",
    "row_remap_pending",
    "row_remap_failure",
]


@dataclass
class FakeGpu:
    index: int
    name: str
    uuid: str
    serial: str
    bus_id: str
    part_number: str
    vbios: str
    memory_total: int
    nvlinks: int
    as_bytes: bool = False  # answer strings as bytes, as older pynvml versions do
    row_remap: bool = True
    memory_temperature: bool = True
    lost: bool = False
    pstate: int = 0
    power_mw: int = 512_345
    crc: int = 7

    def text(self, value: str) -> str | bytes:
        return value.encode() if self.as_bytes else value


class FakeNvml:
    """Two simulated GPUs behind a module that otherwise is the real pynvml."""

    def __init__(self) -> None:
        self.gpus = [
            FakeGpu(
                0,
                "NVIDIA H100 80GB HBM3",
                "GPU-2f4b6a1e-8c3d-4e5f-9a0b-1c2d3e4f5a6b",
                "1652823012345",
                "00000000:18:00.0",
                "692-2G520-0200-000",
                "96.00.89.00.01",
                85_520_809_984,
                nvlinks=H100_LINKS,
            ),
            FakeGpu(
                1,
                "NVIDIA L40S",
                "GPU-7a8b9c0d-1e2f-3a4b-5c6d-7e8f9a0b1c2d",
                "1325023045678",
                "00000000:3B:00.0",
                "900-2G133-0080-000",
                "95.02.66.00.02",
                48_305_799_168,
                nvlinks=0,
                as_bytes=True,
                row_remap=False,
                memory_temperature=False,
                pstate=8,
                power_mw=250_000,
            ),
        ]
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.errors: dict[tuple[str, int | None], int] = {}  # (function, gpu) -> NVML error code
        self.initialised = 0
        self.shut_down = 0
        self.module = types.ModuleType("fake_pynvml")
        structures = ["c_nvmlFieldValue_t", "c_nvmlValue_t", "nvmlPciInfo_t", "c_nvmlMemory_t"]
        structures.append("c_nvmlUtilization_t")
        for name in [n for n in dir(pynvml) if n.startswith(("NVML_", "NVMLError"))] + structures:
            setattr(self.module, name, getattr(pynvml, name))
        for name, function in inspect.getmembers(self, inspect.ismethod):
            if name.startswith("nvml"):
                setattr(self.module, name, self._wrap(name, function))

    def _wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        real = inspect.signature(getattr(pynvml, name))  # AttributeError: pynvml has no such function

        def call(*args: Any) -> Any:
            real.bind(*args)  # TypeError: the source calls it with the wrong arguments
            gpu = args[0] if args and isinstance(args[0], FakeGpu) else None
            index = gpu.index if gpu else (args[0] if name == "nvmlDeviceGetHandleByIndex" else None)
            self.calls[(name, index)] += 1
            if gpu is not None and gpu.lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            code = self.errors.get((name, index))
            if code is not None:
                raise pynvml.NVMLError(code)
            return function(*args)

        return call

    def not_supported(self) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # System

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.shut_down += 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    # Identity

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str | bytes:
        return gpu.text(gpu.name)

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str | bytes:
        return gpu.text(gpu.uuid)

    def nvmlDeviceGetSerial(self, gpu: FakeGpu) -> str | bytes:
        return gpu.text(gpu.serial)

    def nvmlDeviceGetBoardPartNumber(self, gpu: FakeGpu) -> str | bytes:
        return gpu.text(gpu.part_number)

    def nvmlDeviceGetVbiosVersion(self, gpu: FakeGpu) -> str | bytes:
        return gpu.text(gpu.vbios)

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        if gpu.as_bytes:
            return types.SimpleNamespace(busId=gpu.bus_id.encode())
        return pynvml.nvmlPciInfo_t(busId=gpu.bus_id.encode())

    # Readings

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        return pynvml.c_nvmlUtilization_t(gpu=87, memory=43)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: Any = None) -> Any:
        used = 1 << 30
        return pynvml.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - used, used=used)

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        clocks = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619, pynvml.NVML_CLOCK_GRAPHICS: 1965}
        return clocks[clock]

    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetApplicationsClock(self, gpu: FakeGpu, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return 1755

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        return 700_000

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu: FakeGpu) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        return 123_456_789

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 61

    def nvmlDeviceGetTemperatureThreshold(self, gpu: FakeGpu, threshold: int) -> int:
        assert threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return 87

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            assert field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP
            value.fieldId = field_id
            if gpu.memory_temperature:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = 70
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        return int(pynvml.nvmlClocksEventReasonSwPowerCap)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        return int(pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonGpuIdle)

    def nvmlDeviceGetPerformanceState(self, gpu: FakeGpu) -> int:
        return gpu.pstate

    def nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        return 5 if gpu.index == 0 else 3

    def nvmlDeviceGetMaxPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        return 5 if gpu.index == 0 else 4

    def nvmlDeviceGetCurrPcieLinkWidth(self, gpu: FakeGpu) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, gpu: FakeGpu) -> int:
        return 16

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter_type: int) -> int:
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        totals = {pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 3, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0}
        return totals[error_type]

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        if not gpu.row_remap:
            self.not_supported()
        return (2, 1, 1, 0)

    # NVLink

    def _check_link(self, gpu: FakeGpu, link: int) -> None:
        if gpu.nvlinks == 0:
            self.not_supported()
        if link >= gpu.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        self._check_link(gpu, link)
        return 0 if link == DOWN_LINK else 1

    def nvmlDeviceGetNvLinkVersion(self, gpu: FakeGpu, link: int) -> int:
        self._check_link(gpu, link)
        return 4

    def nvmlDeviceGetNvLinkErrorCounter(self, gpu: FakeGpu, link: int, counter: int) -> int:
        self._check_link(gpu, link)
        return {
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: gpu.crc + link,
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 2,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 1,
        }[counter]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu: FakeGpu, link: int) -> Any:
        self._check_link(gpu, link)
        return pynvml.nvmlPciInfo_t(busId=f"00000000:{0x05 + link % 4:02X}:00.0".encode())


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def source(fake: FakeNvml) -> Iterator[NvmlSource]:
    with NvmlSource(nvml=fake.module) as s:
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
    assert h100.unsupported_fields == []
    assert l40s.nvlink_count == 0
    assert sorted(l40s.unsupported_fields) == sorted(["memory_temperature_celsius", *ROW_REMAP_FIELDS])


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
    assert (r.memory_used_bytes, r.memory_total_bytes) == (1 << 30, 85_520_809_984)
    assert (r.sm_clock_hz, r.memory_clock_hz, r.graphics_clock_hz) == (1.98e9, 2.619e9, 1.965e9)
    assert (r.max_sm_clock_hz, r.max_memory_clock_hz) == (1.98e9, 2.619e9)
    assert r.applications_sm_clock_hz == 1.755e9
    assert r.power_watts == 512.345
    assert (r.enforced_power_limit_watts, r.default_power_limit_watts) == (700.0, 700.0)
    assert r.energy_joules_total == pytest.approx(123_456.789)
    assert (r.temperature_celsius, r.memory_temperature_celsius) == (61.0, 70.0)
    assert r.slowdown_temperature_celsius == 87.0
    assert r.clock_event_reasons == pynvml.nvmlClocksEventReasonSwPowerCap
    assert r.performance_state == 0
    assert (r.pcie_link_gen, r.pcie_link_gen_max, r.pcie_link_width, r.pcie_link_width_max) == (5, 5, 16, 16)
    assert (r.ecc_corrected_volatile_total, r.ecc_uncorrected_volatile_total) == (3, 0)
    assert (r.row_remap_correctable_total, r.row_remap_uncorrectable_total) == (2, 1)
    assert r.row_remap_pending is True and r.row_remap_failure is False

    assert [link.link for link in r.nvlinks] == list(range(H100_LINKS))
    up, down = r.nvlinks[0], r.nvlinks[DOWN_LINK]
    assert up.active and up.version == 4
    assert (up.crc_errors_total, up.replay_errors_total, up.recovery_errors_total) == (7, 2, 1)
    assert up.remote_pci_bus_id == "00000000:05:00.0"
    assert r.nvlinks[3].remote_pci_bus_id == "00000000:08:00.0"
    assert not down.active and down.version is None and down.crc_errors_total is None

    pcie = readings[1]
    assert pcie.power_watts == 250.0 and pcie.performance_state == 8 and pcie.pcie_link_gen == 3
    assert pcie.nvlinks == []
    assert pcie.memory_temperature_celsius is None
    assert all(getattr(pcie, name) is None for name in ROW_REMAP_FIELDS)


def test_not_supported_is_listed_and_never_asked_again(fake: FakeNvml, source: NvmlSource) -> None:
    fake.errors[("nvmlDeviceGetTotalEnergyConsumption", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    for _ in range(3):
        readings = by_index(source.read())
        assert source.last_errors() == []  # unsupported is not an error
        assert readings[0].energy_joules_total is None
        assert readings[1].energy_joules_total == pytest.approx(123_456.789)
    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == 1
    assert fake.calls[("nvmlDeviceGetTotalEnergyConsumption", 1)] == 3
    assert fake.calls[("nvmlDeviceGetRemappedRows", 1)] == 1
    assert fake.calls[("nvmlDeviceGetRemappedRows", 0)] == 3
    assert fake.calls[("nvmlDeviceGetFieldValues", 1)] == 1
    h100, l40s = source.inventory().gpus
    assert h100.unsupported_fields == ["energy_joules_total"]
    assert "row_remap_pending" in l40s.unsupported_fields


def test_a_failed_field_is_none_for_that_cycle_only(fake: FakeNvml, source: NvmlSource) -> None:
    fake.errors[("nvmlDeviceGetPowerUsage", 0)] = pynvml.NVML_ERROR_UNKNOWN
    readings = by_index(source.read())
    assert readings[0].power_watts is None and readings[0].temperature_celsius == 61
    assert readings[1].power_watts == 250.0
    assert source.last_errors() == ["gpu 0 power_watts: Unknown Error"]
    del fake.errors[("nvmlDeviceGetPowerUsage", 0)]
    assert by_index(source.read())[0].power_watts == 512.345
    assert source.last_errors() == []
    assert source.inventory().gpus[0].unsupported_fields == []


def test_a_lost_gpu_is_left_out_and_reported(fake: FakeNvml, source: NvmlSource) -> None:
    source.read()
    fake.gpus[0].lost = True
    for _ in range(2):
        readings = source.read()
        assert [r.index for r in readings] == [1]
        assert source.last_errors() == ["gpu 0 lost (fallen off the bus)"]
    # A lost GPU stays lost until a reset: it is not asked again.
    calls_to_gpu0 = sum(n for (_, gpu), n in fake.calls.items() if gpu == 0)
    source.read()
    assert sum(n for (_, gpu), n in fake.calls.items() if gpu == 0) == calls_to_gpu0
    assert [g.index for g in source.inventory().gpus] == [1]


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


def test_nvlink_is_read_every_nvlink_every_cycles(fake: FakeNvml) -> None:
    with NvmlSource(nvml=fake.module, nvlink_every=3) as source:
        links_at_start = fake.calls[("nvmlDeviceGetNvLinkState", 0)]
        assert links_at_start == pynvml.NVML_NVLINK_MAX_LINKS  # counted once, at start
        seen = []
        for cycle in range(7):
            fake.gpus[0].crc = 100 * cycle
            reading = by_index(source.read())[0]
            seen.append(reading.nvlinks[0].crc_errors_total)
            assert len(reading.nvlinks) == H100_LINKS
        # Read at cycles 0, 3 and 6; the values in between are the last ones read.
        assert seen == [0, 0, 0, 300, 300, 300, 600]
        assert fake.calls[("nvmlDeviceGetNvLinkState", 0)] == links_at_start + 3 * H100_LINKS
        assert fake.calls[("nvmlDeviceGetNvLinkVersion", 0)] == 3 * (H100_LINKS - 1)  # active links only
        assert fake.calls[("nvmlDeviceGetNvLinkState", 1)] == pynvml.NVML_NVLINK_MAX_LINKS
        # Repeated values are copies: one reading's links do not change with the next.
        a, b = source.read()[0], source.read()[0]
        a.nvlinks[0].crc_errors_total = -1
        assert b.nvlinks[0].crc_errors_total == 600


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


def test_clock_event_reasons_fall_back_to_throttle_reasons(fake: FakeNvml) -> None:
    both = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonGpuIdle
    fake.errors[("nvmlDeviceGetCurrentClocksEventReasons", 0)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    with NvmlSource(nvml=fake.module) as source:  # an older driver without the new symbol
        assert source.read()[0].clock_event_reasons == both
        assert source.last_errors() == []
    del fake.module.nvmlDeviceGetCurrentClocksEventReasons
    with NvmlSource(nvml=fake.module) as source:  # an older pynvml without the function
        assert [r.clock_event_reasons for r in source.read()] == [both, both]


def test_unknown_performance_state_is_none_without_an_error(fake: FakeNvml, source: NvmlSource) -> None:
    fake.gpus[0].pstate = pynvml.NVML_PSTATE_UNKNOWN
    assert source.read()[0].performance_state is None
    assert source.last_errors() == []


def test_nvlink_every_must_be_positive(fake: FakeNvml) -> None:
    with pytest.raises(ValueError, match="nvlink_every"):
        NvmlSource(nvml=fake.module, nvlink_every=0)
    assert fake.initialised == 0


@pytest.mark.gpu
def test_real_nvml_reads_once() -> None:
    try:
        source = NvmlSource()
    except SourceError as exc:
        pytest.skip(f"NVML cannot initialise here (no NVIDIA GPU or driver): {exc}")
    with source:
        inv = source.inventory()
        readings = source.read()
        errors = source.last_errors()
    assert inv.source == "nvml" and inv.driver_version and inv.cuda_driver_version
    assert inv.gpus, "NVML started but lists no GPU"
    assert errors == []
    assert [r.uuid for r in readings] == [g.uuid for g in inv.gpus]
    for gpu, r in zip(inv.gpus, readings, strict=True):
        assert gpu.uuid.startswith(("GPU-", "MIG-")) and gpu.name and gpu.pci_bus_id
        assert r.memory_total_bytes == gpu.memory_total_bytes
        assert r.temperature_celsius is not None and 0 < r.temperature_celsius < 120
        assert r.power_watts is not None and r.power_watts > 0
        assert r.sm_clock_hz is not None and r.sm_clock_hz > 1e8
        assert len(r.nvlinks) == gpu.nvlink_count
