"""A fake NVML built from the real pynvml's constants, errors and structures, and tests that keep it true.

Only the library functions are simulated (two GPUs: an HGX H100 with 18 NVLinks on an NVSwitch
fabric, and a PCIe L40S without NVLink, GPM or row remapping). Everything else is taken from the
installed pynvml, device handles are real `c_nvmlDevice_t` pointers, and every simulated call is
bound against the real function's signature, so a renamed symbol or a wrong argument list fails in
the tests rather than on a GPU node.

Settings can be changed as on a GPU: setters answer NO_PERMISSION unless the fake is `root` (a
normal user by default), NOT_SUPPORTED for a setting the GPU's `unsupported` names, and
INVALID_ARGUMENT for a power limit outside the constraints or locked clocks outside the supported
range. The enforced power limit is the lower of the limit set and `power_cap_mw` (a cap from
elsewhere: the BMC, a system power budget).
"""

from __future__ import annotations

import ctypes
import inspect
import queue
import threading
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from agent.sources.nvml import catalogue as nvml_catalogue
from agent.sources.nvml import source as nvml_module
from agent.sources.nvml.gpm import METRICS
from agent.sources.nvml.query import ALL_LINKS, Fn, Query

H100_LINKS = 18
DOWN_LINK = 5
CLUSTER_UUID = bytes(range(1, 17))
GPM_PERCENT = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 62.5,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 41.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 55.0,
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 90.0,
}
UINT: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
ULL: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


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
    retired_pages: bool = False
    memory_temperature: bool = True
    fan_percent: int | None = None  # None: no fan (SXM)
    gpm: bool = True
    fabric_state: int | None = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED  # None: no fabric (NOT_SUPPORTED)
    mig: bool = True
    memory_v2: bool = True  # the driver has nvmlDeviceGetMemoryInfo_v2
    xid: bool = True
    lost: bool = False
    pstate: int = 0
    power_mw: int = 512_345
    limit_mw: int = 700_000  # the power management limit, as set
    default_limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    power_cap_mw: int | None = None  # a lower limit from elsewhere: the enforced one is the lower
    persistence: bool = True
    ecc: tuple[bool, bool] = (True, True)  # (current, pending)
    memory_clocks: list[int] = field(default_factory=lambda: [2619])
    graphics_clocks: list[int] = field(default_factory=lambda: list(range(1980, 344, -15)))
    locked: dict[str, tuple[int, int]] = field(default_factory=dict)  # "gpu" / "memory" -> (min, max)
    unsupported: set[str] = field(default_factory=set)  # settings NOT_SUPPORTED: "power_limit", "ecc", ...
    crc: int = 7
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    processes: list[tuple[int, int | None]] = field(default_factory=lambda: [(4242, 8 << 30), (4343, None)])
    pcie_tx: int = 10_000_000  # byte counters behind NVML_FI_DEV_PCIE_COUNT_*
    pcie_rx: int = 20_000_000
    pcie_counter_type: int = ULL
    field_time_us: int = 1_700_000_000_000_000  # the field values' timestamp
    handle: Any = field(init=False)

    def __post_init__(self) -> None:
        self.handle = pynvml.c_nvmlDevice_t(pynvml.struct_c_nvmlDevice_t())

    def text(self, value: str) -> str | bytes:
        return value.encode() if self.as_bytes else value

    @property
    def enforced_mw(self) -> int:
        return self.limit_mw if self.power_cap_mw is None else min(self.limit_mw, self.power_cap_mw)

    def link_tx_kib(self, link: int) -> int:
        return 1000 * (link + 1)

    def field(self, field_id: int, scope: int) -> tuple[int, Any] | int:
        """(value type, value) of one field value, or the NVML error code it answers."""
        p = pynvml
        if field_id in _LINK_FIELDS:
            return self._link_field(field_id, scope)
        table: dict[int, tuple[int, Any] | int] = {
            p.NVML_FI_DEV_MEMORY_TEMP: (UINT, 70) if self.memory_temperature else p.NVML_ERROR_NOT_SUPPORTED,
            p.NVML_FI_DEV_POWER_AVERAGE: (UINT, self.power_mw),
            p.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (ULL, 123_456_789),
            p.NVML_FI_DEV_POWER_CURRENT_LIMIT: (UINT, self.enforced_mw),
            p.NVML_FI_DEV_POWER_REQUESTED_LIMIT: (UINT, self.limit_mw),
            p.NVML_FI_DEV_POWER_DEFAULT_LIMIT: (UINT, self.default_limit_mw),
            p.NVML_FI_DEV_POWER_MIN_LIMIT: (UINT, self.min_limit_mw),
            p.NVML_FI_DEV_POWER_MAX_LIMIT: (UINT, self.max_limit_mw),
            p.NVML_FI_DEV_ECC_CURRENT: (UINT, int(self.ecc[0])),
            p.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (ULL, 3),
            p.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (ULL, 0),
            p.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ULL, 12),
            p.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ULL, 1),
            p.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (UINT, 5),
            p.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (self.pcie_counter_type, self.pcie_tx),
            p.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (self.pcie_counter_type, self.pcie_rx),
        }
        retired = {
            p.NVML_FI_DEV_RETIRED_SBE: 1,
            p.NVML_FI_DEV_RETIRED_DBE: 0,
            p.NVML_FI_DEV_RETIRED_PENDING: 0,
        }
        remapped = {
            p.NVML_FI_DEV_REMAPPED_COR: 2,
            p.NVML_FI_DEV_REMAPPED_UNC: 1,
            p.NVML_FI_DEV_REMAPPED_PENDING: 1,
            p.NVML_FI_DEV_REMAPPED_FAILURE: 0,
        }
        for ids, supported in ((retired, self.retired_pages), (remapped, self.row_remap)):
            for fid, value in ids.items():
                table[fid] = (UINT, value) if supported else p.NVML_ERROR_NOT_SUPPORTED
        return table.get(field_id, NOT_SUPPORTED)

    def _link_field(self, field_id: int, scope: int) -> tuple[int, Any] | int:
        p = pynvml
        if self.nvlinks == 0:
            return NOT_SUPPORTED
        throughput = {p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 1, p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 2}
        if field_id in throughput and scope == ALL_LINKS:
            return (ULL, sum(self.link_tx_kib(link) * throughput[field_id] for link in range(self.nvlinks)))
        if scope >= self.nvlinks:
            return int(p.NVML_ERROR_INVALID_ARGUMENT)
        if field_id == p.NVML_FI_DEV_NVLINK_GET_STATE:
            return (UINT, p.NVML_NVLINK_STATE_INACTIVE if scope == DOWN_LINK else p.NVML_NVLINK_STATE_ACTIVE)
        if scope == DOWN_LINK:
            return NOT_SUPPORTED  # a link that is down answers nothing but its state
        if field_id in throughput:
            return (ULL, self.link_tx_kib(scope) * throughput[field_id])
        return (UINT, self.link_counter(field_id, scope))

    def link_counter(self, field_id: int, link: int) -> int:
        p = pynvml
        counters: dict[int, int] = {
            p.NVML_FI_DEV_NVLINK_GET_VERSION: p.NVML_NVLINK_VERSION_4_0,
            p.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: self.crc + link,
            p.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: 2,
            p.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: 1,
        }
        return counters[field_id]


_LINK_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    pynvml.NVML_FI_DEV_NVLINK_GET_VERSION,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
}


def _module_attributes() -> list[str]:
    """What the fake module takes from pynvml as is: constants, structures, errors, not functions."""
    names = []
    for name in dir(pynvml):
        if name.startswith(("NVML", "nvml", "c_nvml", "struct_c_nvml")) and not inspect.isfunction(
            getattr(pynvml, name)
        ):
            names.append(name)
    return names


class FakeNvml:
    """Two simulated GPUs behind a module that otherwise is the real pynvml."""

    def __init__(self, *, root: bool = False) -> None:
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
                retired_pages=True,
                memory_temperature=False,
                fan_percent=30,
                gpm=False,
                fabric_state=None,
                mig=False,
                pstate=8,
                power_mw=250_000,
                limit_mw=350_000,
                default_limit_mw=350_000,
                min_limit_mw=100_000,
                max_limit_mw=350_000,
                compute_mode=pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
                processes=[],
                memory_clocks=[9001, 5001, 810, 405],
                graphics_clocks=list(range(2520, 209, -15)),
            ),
        ]
        self.root = root  # setters answer NO_PERMISSION unless root, as for a normal user
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.errors: dict[tuple[str, int | None], int] = {}  # (function, gpu) -> NVML error code
        self.field_errors: dict[tuple[int, int], int] = {}  # (gpu, field id) -> its status
        self.field_requests: list[tuple[int, list[Any]]] = []  # (gpu, ids) of each nvmlDeviceGetFieldValues
        self.initialised = 0
        self.shut_down = 0
        self.events: queue.Queue[tuple[int, int] | int] = queue.Queue()  # (gpu, xid) or an NVML error code
        self.registered: list[tuple[int, int]] = []  # (gpu, event types)
        self.wait_timeouts: set[int] = set()
        self.event_sets = 0
        self.event_sets_freed = 0
        self.samples: dict[int, tuple[int, dict[int, float]] | None] = {}  # GPM sample address -> snapshot
        self.samples_freed = 0
        self._keep: list[Any] = []  # ctypes objects handed out, kept alive
        self._lock = threading.Lock()  # the XID thread calls too
        self.module = types.ModuleType("fake_pynvml")
        for name in _module_attributes():
            setattr(self.module, name, getattr(pynvml, name))
        for name, function in inspect.getmembers(self, inspect.ismethod):
            if name.startswith("nvml"):
                setattr(self.module, name, self._wrap(name, function))

    def _wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        real = inspect.signature(getattr(pynvml, name))  # AttributeError: pynvml has no such function

        def call(*args: Any, **kwargs: Any) -> Any:
            real.bind(*args, **kwargs)  # TypeError: the source calls it with the wrong arguments
            if args and isinstance(args[0], pynvml.c_nvmlDevice_t):
                args = (self.gpu_of(args[0]), *args[1:])
            gpu = args[0] if args and isinstance(args[0], FakeGpu) else None
            index = gpu.index if gpu else (args[0] if name == "nvmlDeviceGetHandleByIndex" else None)
            with self._lock:
                self.calls[(name, index)] += 1
            if gpu is not None and gpu.lost:
                raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
            code = self.errors.get((name, index))
            if code is not None:
                raise nvml_error(code)
            return function(*args, **kwargs)

        return call

    def gpu_of(self, handle: Any) -> FakeGpu:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for gpu in self.gpus:
            if ctypes.cast(gpu.handle, ctypes.c_void_p).value == address:
                return gpu
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def calls_to(self, gpu: int) -> int:
        return sum(n for (_, index), n in self.calls.items() if index == gpu)

    def not_supported(self) -> None:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def xid(self, gpu: int, code: int) -> None:
        """The driver reports XID `code` on GPU `gpu`."""
        self.events.put((gpu, code))

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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        gpu = self.gpus[index]
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu.handle

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

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        if not gpu.mig:
            self.not_supported()
        return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]

    # Field values

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[Any]) -> Any:
        self.field_requests.append((gpu.index, list(field_ids)))
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, requested in zip(values, field_ids, strict=True):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            value.fieldId, value.scopeId = field_id, scope
            value.timestamp = gpu.field_time_us
            answer = self.field_errors.get((gpu.index, field_id), gpu.field(field_id, scope))
            if isinstance(answer, int):
                value.nvmlReturn = answer
                continue
            value.nvmlReturn = pynvml.NVML_SUCCESS
            value.valueType, number = answer
            member = {UINT: "uiVal", ULL: "ullVal", pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal"}[value.valueType]
            setattr(value.value, member, number)
        return values

    # Calls that field values stand in for

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        return gpu.enforced_mw

    def nvmlDeviceGetPowerManagementLimit(self, gpu: FakeGpu) -> int:
        return gpu.limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu: FakeGpu) -> int:
        return gpu.default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, gpu: FakeGpu) -> list[int]:
        return [gpu.min_limit_mw, gpu.max_limit_mw]

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        return 123_456_789

    def nvmlDeviceGetEccMode(self, gpu: FakeGpu) -> list[int]:
        if "ecc" in gpu.unsupported:
            self.not_supported()
        return [int(gpu.ecc[0]), int(gpu.ecc[1])]

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter_type: int) -> int:
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter_type == pynvml.NVML_VOLATILE_ECC:
            return 3 if corrected else 0
        assert counter_type == pynvml.NVML_AGGREGATE_ECC
        return 12 if corrected else 1

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        if not gpu.row_remap:
            self.not_supported()
        return (2, 1, 1, 0)

    def nvmlDeviceGetPcieReplayCounter(self, gpu: FakeGpu) -> int:
        return 5

    def nvmlDeviceGetPcieThroughput(self, gpu: FakeGpu, counter: int) -> int:
        return {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1500, pynvml.NVML_PCIE_UTIL_RX_BYTES: 2500}[counter]

    # Calls only

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        return pynvml.c_nvmlUtilization_t(gpu=87, memory=43)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: Any = None) -> Any:
        used, reserved = 1 << 30, 512 << 20
        if version is None:
            return pynvml.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - used, used=used)
        assert version == pynvml.nvmlMemory_v2
        if not gpu.memory_v2:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        free = gpu.memory_total - used - reserved
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=gpu.memory_total, reserved=reserved, free=free, used=used
        )

    def nvmlDeviceGetEncoderUtilization(self, gpu: FakeGpu) -> list[int]:
        return [5, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, gpu: FakeGpu) -> list[int]:
        return [7, 167_000]

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        clocks = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619, pynvml.NVML_CLOCK_GRAPHICS: 1965}
        return clocks[clock]

    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619, pynvml.NVML_CLOCK_GRAPHICS: 1980}[
            clock
        ]

    def nvmlDeviceGetApplicationsClock(self, gpu: FakeGpu, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1755, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 61

    def nvmlDeviceGetTemperatureThreshold(self, gpu: FakeGpu, threshold: int) -> int:
        return {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 87,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 85,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
        }[threshold]

    def nvmlDeviceGetFanSpeed(self, gpu: FakeGpu) -> int:
        if gpu.fan_percent is None:
            self.not_supported()
        return int(gpu.fan_percent or 0)

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

    def nvmlDeviceGetPersistenceMode(self, gpu: FakeGpu) -> int:
        return int(pynvml.NVML_FEATURE_ENABLED if gpu.persistence else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetComputeMode(self, gpu: FakeGpu) -> int:
        return gpu.compute_mode

    def nvmlDeviceGetComputeRunningProcesses_v3(self, gpu: FakeGpu) -> list[Any]:
        procs = []
        for pid, used in gpu.processes:
            info = pynvml.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=0 if used is None else used)
            proc = pynvml.nvmlStructToFriendlyObject(info)
            if used is None:
                proc.usedGpuMemory = None  # what pynvml answers for NVML_VALUE_NOT_AVAILABLE
            procs.append(proc)
        return procs

    def nvmlDeviceGetGpuFabricInfoV(self, gpu: FakeGpu, info: Any) -> int:
        struct = info._obj  # the source passes ctypes.byref(struct)
        assert struct.version == pynvml.nvmlGpuFabricInfo_v2
        return self._fabric(gpu, struct)

    def nvmlDeviceGetGpuFabricInfo(self, gpu: FakeGpu, info: Any) -> int:
        return self._fabric(gpu, info._obj)

    def _fabric(self, gpu: FakeGpu, struct: Any) -> int:
        if gpu.fabric_state is None:
            self.not_supported()
        struct.state = gpu.fabric_state
        if gpu.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            struct.status = pynvml.NVML_SUCCESS
            struct.clusterUuid[:] = list(CLUSTER_UUID)
            struct.cliqueId = 7
        return int(pynvml.NVML_SUCCESS)

    # Settings

    def _may_set(self, gpu: FakeGpu, setting: str) -> None:
        if setting in gpu.unsupported:
            self.not_supported()
        if not self.root:
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)

    def nvmlDeviceSetPersistenceMode(self, gpu: FakeGpu, mode: int) -> None:
        self._may_set(gpu, "persistence_mode")
        gpu.persistence = mode == pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceSetPowerManagementLimit(self, gpu: FakeGpu, limit: int) -> None:
        self._may_set(gpu, "power_limit")
        if not gpu.min_limit_mw <= limit <= gpu.max_limit_mw:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.limit_mw = limit

    def nvmlDeviceGetSupportedMemoryClocks(self, gpu: FakeGpu) -> list[int]:
        if "locked_memory_clocks" in gpu.unsupported:
            self.not_supported()
        return list(gpu.memory_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, gpu: FakeGpu, memoryClockMHz: int) -> list[int]:
        if "locked_gpu_clocks" in gpu.unsupported:
            self.not_supported()
        if memoryClockMHz not in gpu.memory_clocks:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return list(gpu.graphics_clocks)

    def _set_lock(self, gpu: FakeGpu, domain: str, low: int, high: int) -> None:
        self._may_set(gpu, f"locked_{domain}_clocks")
        supported = gpu.graphics_clocks if domain == "gpu" else gpu.memory_clocks
        if not min(supported) <= low <= high <= max(supported):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.locked[domain] = (low, high)

    def _reset_lock(self, gpu: FakeGpu, domain: str) -> None:
        self._may_set(gpu, f"locked_{domain}_clocks")
        gpu.locked.pop(domain, None)

    def nvmlDeviceSetGpuLockedClocks(self, gpu: FakeGpu, minGpuClockMHz: int, maxGpuClockMHz: int) -> None:
        self._set_lock(gpu, "gpu", minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, gpu: FakeGpu) -> None:
        self._reset_lock(gpu, "gpu")

    def nvmlDeviceSetMemoryLockedClocks(self, gpu: FakeGpu, minMemClockMHz: int, maxMemClockMHz: int) -> None:
        self._set_lock(gpu, "memory", minMemClockMHz, maxMemClockMHz)

    def nvmlDeviceResetMemoryLockedClocks(self, gpu: FakeGpu) -> None:
        self._reset_lock(gpu, "memory")

    def nvmlDeviceSetComputeMode(self, gpu: FakeGpu, mode: int) -> None:
        self._may_set(gpu, "compute_mode")
        if not 0 <= mode < pynvml.NVML_COMPUTEMODE_COUNT:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.compute_mode = mode

    def nvmlDeviceSetEccMode(self, gpu: FakeGpu, mode: int) -> None:
        self._may_set(gpu, "ecc")
        gpu.ecc = (gpu.ecc[0], mode == pynvml.NVML_FEATURE_ENABLED)  # the current mode changes at reboot

    # NVLink

    def _check_link(self, gpu: FakeGpu, link: int) -> None:
        if gpu.nvlinks == 0:
            self.not_supported()
        if link >= gpu.nvlinks:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        self._check_link(gpu, link)
        return 0 if link == DOWN_LINK else 1

    def nvmlDeviceGetNvLinkVersion(self, gpu: FakeGpu, link: int) -> int:
        self._check_link(gpu, link)
        return int(pynvml.NVML_NVLINK_VERSION_4_0)

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

    # GPM

    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> Any:
        return pynvml.c_nvmlGpmSupport_t(
            version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm)
        )

    def nvmlGpmSampleAlloc(self) -> Any:
        sample = pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t())
        self._keep.append(sample)
        self.samples[ctypes.cast(sample, ctypes.c_void_p).value or 0] = None
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        address = ctypes.cast(sample, ctypes.c_void_p).value or 0
        assert address in self.samples, "freeing a sample that was never allocated"
        del self.samples[address]
        self.samples_freed += 1

    def nvmlGpmSampleGet(self, gpu: FakeGpu, sample: Any) -> Any:
        address = ctypes.cast(sample, ctypes.c_void_p).value or 0
        assert address in self.samples, "sampling into a sample that was not allocated"
        self.samples[address] = (gpu.index, dict(GPM_PERCENT))
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        first = self.samples[ctypes.cast(request.sample1, ctypes.c_void_p).value or 0]
        second = self.samples[ctypes.cast(request.sample2, ctypes.c_void_p).value or 0]
        assert first is not None and second is not None, "metrics between samples never taken"
        assert first is not second and first[0] == second[0], "two samples of one GPU"
        for metric in request.metrics[: request.numMetrics]:
            value = second[1].get(metric.metricId)
            metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if value is None else pynvml.NVML_SUCCESS
            metric.value = value or 0.0
        return request

    # Events

    def nvmlEventSetCreate(self) -> Any:
        self.event_sets += 1
        event_set = pynvml.c_nvmlEventSet_t(pynvml.struct_c_nvmlEventSet_t())
        self._keep.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, event_types: int, event_set: Any) -> None:
        if not gpu.xid:
            self.not_supported()
        self.registered.append((gpu.index, event_types))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self.wait_timeouts.add(timeout_ms)
        try:
            item = self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT) from None
        if isinstance(item, int):
            raise nvml_error(item)
        index, code = item
        data = pynvml.c_nvmlEventData_t()
        data.device = self.gpus[index].handle
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = code
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.event_sets_freed += 1


def fast_xid_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the XID thread wait and back off in milliseconds, so that tests close at once."""
    monkeypatch.setattr(nvml_module, "_XID_WAIT_MS", 10)
    monkeypatch.setattr(nvml_module, "_XID_BACKOFF_S", (0.01, 0.04))


# The fake and the catalogue stay true to the installed pynvml.


def _catalogue() -> list[Query]:
    return [
        *nvml_catalogue.FIELD_READINGS,
        *nvml_catalogue.CALL_READINGS,
        nvml_catalogue.LINK_STATE,
        *nvml_catalogue.LINK_READINGS,
        *nvml_catalogue.IDENTITY,
        nvml_catalogue.MIG_MODE,  # MEMORY is among the CALL_READINGS
    ]


def test_every_name_the_catalogue_asks_for_exists_in_pynvml() -> None:
    missing = []
    for query in _catalogue():
        names = list(query.field_ids)
        if isinstance(query.call, Fn):
            names += [*query.call.names, *query.call.consts]
        missing += [f"{query.label}: {n}" for n in names if not hasattr(pynvml, n)]
    assert missing == []
    missing_metrics = [metric for _, metric in METRICS if not hasattr(pynvml, metric)]
    assert missing_metrics == []


def test_query_labels_are_unique_and_fields_match_their_units() -> None:
    labels = [q.label for q in _catalogue() if q.label]
    assert len(labels) == len(set(labels))
    for query in _catalogue():
        if query.field_ids:
            assert len(query.field_ids) == len(query.units) == len(query.fields), query.label


def test_catalogue_enum_values_are_pynvml_s() -> None:
    assert nvml_catalogue.MIG_ENABLED == pynvml.NVML_DEVICE_MIG_ENABLE
    assert nvml_catalogue.FABRIC_COMPLETED == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert nvml_catalogue.LINK_UP == (pynvml.NVML_NVLINK_STATE_ACTIVE, pynvml.NVML_NVLINK_STATE_SLEEP)
    versions = {
        getattr(pynvml, name): int(name.split("_")[3])
        for name in dir(pynvml)
        if name.startswith("NVML_NVLINK_VERSION_") and name != "NVML_NVLINK_VERSION_INVALID"
    }
    assert versions == nvml_catalogue.NVLINK_GENERATION


def test_the_fake_simulates_only_functions_pynvml_has() -> None:
    fake = FakeNvml()  # _wrap raises AttributeError for a function pynvml lacks
    simulated = [n for n in dir(fake.module) if inspect.isfunction(getattr(fake.module, n))]
    assert simulated and all(inspect.isfunction(getattr(pynvml, n)) for n in simulated)
    with pytest.raises(TypeError):
        fake.module.nvmlDeviceGetTemperature(fake.gpus[0].handle)  # pynvml's signature is enforced
