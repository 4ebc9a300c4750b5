"""The real GPU source: NVML through pynvml.

This is the only module that imports pynvml. Every NVMLError stops here: a failed start raises
SourceError, a field a GPU cannot report is remembered and skipped, any other failed field is None
for that cycle and named in `last_errors`, and a GPU that fell off the bus is left out of `read`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

from agent.sources.errors import SourceError
from agent.sources.gpu import GpuInfo, GpuReading, Inventory, NvLinkReading

try:
    import pynvml as _pynvml
except ImportError as exc:  # the agent still starts with --sim; only NvmlSource() fails
    _pynvml = None
    _IMPORT_ERROR = str(exc)
else:
    _IMPORT_ERROR = ""

log = logging.getLogger(__name__)

SOURCE = "nvml"
_SIM_HINT = "run with --sim to use the simulator"

# Called as call(nvml_module, *args) and returning pynvml's answer; Convert turns that answer into
# the values of a query's fields, in order.
Call = Callable[..., Any]
Convert = Callable[[Any], tuple[Any, ...]]

# NVML is initialised once per process and module: the library keeps one state, and two sources
# (the daemon's and a probe's) must not shut it down under each other. The module object is held
# next to its count so that its id cannot be reused while the count is live.
_init_lock = threading.Lock()
_users: dict[int, tuple[Any, int]] = {}


def _acquire(nvml: Any) -> None:
    with _init_lock:
        _, count = _users.get(id(nvml), (nvml, 0))
        if count == 0:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                raise SourceError(SOURCE, _init_message(nvml, exc)) from exc
        _users[id(nvml)] = (nvml, count + 1)


def _release(nvml: Any) -> None:
    with _init_lock:
        _, count = _users.get(id(nvml), (nvml, 0))
        if count > 1:
            _users[id(nvml)] = (nvml, count - 1)
            return
        _users.pop(id(nvml), None)
        if count == 0:
            return
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            raise SourceError(SOURCE, f"nvmlShutdown failed: {exc}") from exc


def _init_message(nvml: Any, exc: Any) -> str:
    code = getattr(exc, "value", None)
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return f"NVML library not found: is the NVIDIA driver installed? {_SIM_HINT}"
    if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return f"the NVIDIA driver is not loaded (nvidia-smi fails too); load it or {_SIM_HINT}"
    if code == nvml.NVML_ERROR_NO_PERMISSION:
        return f"no permission to open the GPUs (are /dev/nvidia* visible to the agent?); or {_SIM_HINT}"
    return f"nvmlInit failed: {exc}"


def _text(value: Any) -> str:
    """pynvml returns str from some versions and functions, bytes from others."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _fn(*names: str, consts: tuple[str, ...] = ()) -> Call:
    """Call the first of `names` that this pynvml and driver have, newest first.

    The NVML constants named in `consts` follow the caller's arguments. A function missing from
    both reads as FUNCTION_NOT_FOUND, which the source treats like NOT_SUPPORTED.
    """

    def call(nvml: Any, *args: Any) -> Any:
        missing: Exception = nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        for name in names:
            fn = getattr(nvml, name, None)
            if fn is None:
                continue
            try:
                return fn(*args, *(getattr(nvml, c) for c in consts))
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                missing = exc
        raise missing

    return call


# Union members of c_nvmlValue_t, by the field value's valueType.
_VALUE_MEMBERS = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}


def _memory_temperature(nvml: Any, handle: Any) -> Any:
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_MEMORY_TEMP])
    # The call as a whole succeeds; each field value carries its own status.
    if value.nvmlReturn != nvml.NVML_SUCCESS:
        raise nvml.NVMLError(value.nvmlReturn)
    for const, member in _VALUE_MEMBERS.items():
        if value.valueType == getattr(nvml, const, None):
            return getattr(value.value, member)
    raise nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)


def _performance_state(nvml: Any, handle: Any) -> Any:
    state = nvml.nvmlDeviceGetPerformanceState(handle)
    return None if state == nvml.NVML_PSTATE_UNKNOWN else state


def _int(value: Any) -> tuple[Any, ...]:
    return (None if value is None else int(value),)


def _float(value: Any) -> tuple[Any, ...]:
    return (float(value),)


def _hz(mhz: Any) -> tuple[Any, ...]:
    return (float(mhz) * 1e6,)


def _from_milli(value: Any) -> tuple[Any, ...]:
    # Division, not * 1e-3, so that 700000 mW reads exactly 700.0 W.
    return (float(value) / 1000.0,)


def _bus_id(pci: Any) -> tuple[Any, ...]:
    return (_text(pci.busId),)


@dataclass(frozen=True, slots=True)
class _Query:
    """One NVML call and the reading fields its answer fills.

    `label` names the query in errors and in the per-GPU NOT_SUPPORTED memory; `prefix` is how its
    fields are named in GpuInfo.unsupported_fields ("nvlinks." for per-link fields).
    """

    label: str
    fields: tuple[str, ...]
    call: Call
    convert: Convert = _int
    prefix: str = ""

    @property
    def unsupported_names(self) -> tuple[str, ...]:
        return tuple(self.prefix + f for f in self.fields)


def _q(field: str, call: Call, convert: Convert = _int) -> _Query:
    return _Query(field, (field,), call, convert)


def _link(field: str, call: Call, convert: Convert = _int) -> _Query:
    return _Query(f"nvlinks.{field}", (field,), call, convert, prefix="nvlinks.")


def _volatile_ecc(error_type: str) -> Call:
    return _fn("nvmlDeviceGetTotalEccErrors", consts=(error_type, "NVML_VOLATILE_ECC"))


_MEMORY = _Query(
    "memory",
    ("memory_used_bytes", "memory_total_bytes"),
    _fn("nvmlDeviceGetMemoryInfo"),
    lambda m: (int(m.used), int(m.total)),
)

_READINGS: tuple[_Query, ...] = (
    _Query(
        "utilization",
        ("gpu_utilization_ratio", "memory_utilization_ratio"),
        _fn("nvmlDeviceGetUtilizationRates"),
        lambda u: (u.gpu / 100.0, u.memory / 100.0),
    ),
    _MEMORY,
    _q("sm_clock_hz", _fn("nvmlDeviceGetClockInfo", consts=("NVML_CLOCK_SM",)), _hz),
    _q("memory_clock_hz", _fn("nvmlDeviceGetClockInfo", consts=("NVML_CLOCK_MEM",)), _hz),
    _q("graphics_clock_hz", _fn("nvmlDeviceGetClockInfo", consts=("NVML_CLOCK_GRAPHICS",)), _hz),
    _q("max_sm_clock_hz", _fn("nvmlDeviceGetMaxClockInfo", consts=("NVML_CLOCK_SM",)), _hz),
    _q("max_memory_clock_hz", _fn("nvmlDeviceGetMaxClockInfo", consts=("NVML_CLOCK_MEM",)), _hz),
    _q("applications_sm_clock_hz", _fn("nvmlDeviceGetApplicationsClock", consts=("NVML_CLOCK_SM",)), _hz),
    _q("power_watts", _fn("nvmlDeviceGetPowerUsage"), _from_milli),
    _q("enforced_power_limit_watts", _fn("nvmlDeviceGetEnforcedPowerLimit"), _from_milli),
    _q("default_power_limit_watts", _fn("nvmlDeviceGetPowerManagementDefaultLimit"), _from_milli),
    _q("energy_joules_total", _fn("nvmlDeviceGetTotalEnergyConsumption"), _from_milli),
    _q("temperature_celsius", _fn("nvmlDeviceGetTemperature", consts=("NVML_TEMPERATURE_GPU",)), _float),
    _q("memory_temperature_celsius", _memory_temperature, _float),
    _q(
        "slowdown_temperature_celsius",
        _fn("nvmlDeviceGetTemperatureThreshold", consts=("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",)),
        _float,
    ),
    _q(
        "clock_event_reasons",
        _fn("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
    ),
    _q("performance_state", _performance_state),
    _q("pcie_link_gen", _fn("nvmlDeviceGetCurrPcieLinkGeneration")),
    _q("pcie_link_gen_max", _fn("nvmlDeviceGetMaxPcieLinkGeneration")),
    _q("pcie_link_width", _fn("nvmlDeviceGetCurrPcieLinkWidth")),
    _q("pcie_link_width_max", _fn("nvmlDeviceGetMaxPcieLinkWidth")),
    _q("ecc_corrected_volatile_total", _volatile_ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED")),
    _q("ecc_uncorrected_volatile_total", _volatile_ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED")),
    _Query(
        "row_remap",
        (
            "row_remap_correctable_total",
            "row_remap_uncorrectable_total",
            "row_remap_pending",
            "row_remap_failure",
        ),
        _fn("nvmlDeviceGetRemappedRows"),
        lambda r: (int(r[0]), int(r[1]), bool(r[2]), bool(r[3])),
    ),
)

_LINK_STATE = _link("active", _fn("nvmlDeviceGetNvLinkState"))


def _nvlink_errors(counter: str) -> Call:
    return _fn("nvmlDeviceGetNvLinkErrorCounter", consts=(counter,))


# Asked of active links only: a link that is down answers errors for everything but its state.
_LINK_READINGS: tuple[_Query, ...] = (
    _link("version", _fn("nvmlDeviceGetNvLinkVersion")),
    _link("crc_errors_total", _nvlink_errors("NVML_NVLINK_ERROR_DL_CRC_FLIT")),
    _link("replay_errors_total", _nvlink_errors("NVML_NVLINK_ERROR_DL_REPLAY")),
    _link("recovery_errors_total", _nvlink_errors("NVML_NVLINK_ERROR_DL_RECOVERY")),
    _link("remote_pci_bus_id", _fn("nvmlDeviceGetNvLinkRemotePciInfo"), _bus_id),
)


class _GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU is gone until it is reset; stop asking it anything."""


@dataclass(slots=True)
class _Device:
    handle: Any
    uuid: str
    links: list[int]


def _lost_message(index: int) -> str:
    return f"gpu {index} lost (fallen off the bus)"


class NvmlSource:
    """GpuSource backed by NVML: inventory once, readings every cycle, in base units.

    NVML is initialised once per process however many sources are open, and shut down when the last
    one closes. Device handles are cached; a field a GPU answers NOT_SUPPORTED for is listed in its
    GpuInfo.unsupported_fields and never asked again. Per-link NVLink queries are slow, so they run
    every `nvlink_every` reads and the last values are repeated in between. `nvml` replaces the
    pynvml module (tests).
    """

    def __init__(self, *, nvlink_every: int = 6, nvml: ModuleType | None = None) -> None:
        if nvlink_every < 1:
            raise ValueError(f"nvlink_every must be at least 1, not {nvlink_every}")
        module: Any = nvml if nvml is not None else _pynvml
        if module is None:
            raise SourceError(
                SOURCE, f"the pynvml module is missing ({_IMPORT_ERROR}): install nvidia-ml-py or {_SIM_HINT}"
            )
        self._nvml: Any = module
        self._nvlink_every = nvlink_every
        self._unsupported_codes = {module.NVML_ERROR_NOT_SUPPORTED, module.NVML_ERROR_FUNCTION_NOT_FOUND}
        self._no_link_codes = {module.NVML_ERROR_NOT_SUPPORTED, module.NVML_ERROR_INVALID_ARGUMENT}
        self._open = False
        _acquire(module)
        self._open = True
        try:
            self._count = int(module.nvmlDeviceGetCount())
        except module.NVMLError as exc:
            self.close()
            raise SourceError(SOURCE, f"cannot count the GPUs: {exc}") from exc
        self._devices: dict[int, _Device] = {}
        self._lost: set[int] = set()
        self._skip: set[tuple[int, str]] = set()  # (gpu, query label) answered NOT_SUPPORTED
        self._unsupported: dict[int, list[str]] = {i: [] for i in range(self._count)}
        self._links: dict[int, list[NvLinkReading]] = {}  # last per-link readings, reused between
        self._cycle = 0
        self._errors: list[str] = []
        # Handles are opened now; a GPU that fails here is retried on each read (unless lost).
        errors: list[str] = []
        for index in range(self._count):
            try:
                self._device(index, errors)
            except _GpuLost:
                self._lost.add(index)
                errors.append(_lost_message(index))
        for message in errors:
            log.warning("nvml: %s", message)

    # GpuSource

    def inventory(self) -> Inventory:
        self._check_open()
        errors: list[str] = []
        gpus: list[GpuInfo] = []
        driver = _text(self._system("driver_version", _fn("nvmlSystemGetDriverVersion"), errors))
        cuda = self._system(
            "cuda_driver_version",
            _fn("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"),
            errors,
        )
        for index in range(self._count):
            if index in self._lost:
                errors.append(_lost_message(index))
                continue
            try:
                device = self._device(index, errors)
                if device is None:
                    continue
                info = self._info(index, device, errors)
                # One full sample now, so that unsupported_fields is complete before the first read.
                self._sample(index, device, [], with_nvlink=True)
            except _GpuLost:
                self._mark_lost(index, errors)
                continue
            info.driver_version = driver
            info.unsupported_fields = list(self._unsupported[index])
            gpus.append(info)
        for message in errors:
            log.warning("nvml inventory: %s", message)
        return Inventory(
            source=SOURCE,
            gpus=gpus,
            driver_version=driver,
            cuda_driver_version=_cuda_version(cuda),
            # What NVML enumerates, lost GPUs included; the config may know better.
            expected_gpu_count=self._count,
        )

    def read(self) -> list[GpuReading]:
        self._check_open()
        errors: list[str] = []
        readings: list[GpuReading] = []
        with_nvlink = self._cycle % self._nvlink_every == 0
        self._cycle += 1
        for index in range(self._count):
            if index in self._lost:
                errors.append(_lost_message(index))
                continue
            try:
                device = self._device(index, errors)
                if device is not None:
                    readings.append(self._sample(index, device, errors, with_nvlink=with_nvlink))
            except _GpuLost:
                self._mark_lost(index, errors)
        self._errors = errors
        return readings

    def last_errors(self) -> list[str]:
        return list(self._errors)

    def close(self) -> None:
        """Release this source's share of NVML; the last one to close shuts NVML down."""
        if self._open:
            self._open = False
            _release(self._nvml)

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # Internals

    def _check_open(self) -> None:
        if not self._open:
            raise SourceError(SOURCE, "the source is closed")

    def _mark_lost(self, index: int, errors: list[str]) -> None:
        self._lost.add(index)
        self._devices.pop(index, None)
        self._links.pop(index, None)
        errors.append(_lost_message(index))

    def _ask(self, index: int, query: _Query, errors: list[str], *args: Any, where: str = "") -> Any:
        """`query.call(*args)`, or None when it failed.

        NOT_SUPPORTED is remembered per (gpu, query) so later cycles skip the call, and its fields
        join the GPU's unsupported list; other errors are appended to `errors`; GPU_IS_LOST raises
        _GpuLost.
        """
        if (index, query.label) in self._skip:
            return None
        nvml = self._nvml
        try:
            return query.call(nvml, *args)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from exc
            if code in self._unsupported_codes:
                self._skip.add((index, query.label))
                unsupported = self._unsupported[index]
                unsupported.extend(n for n in query.unsupported_names if n not in unsupported)
                return None
            errors.append(f"gpu {index} {query.label}{where}: {exc}")
            return None

    def _fill(
        self, target: Any, index: int, query: _Query, errors: list[str], *args: Any, where: str = ""
    ) -> None:
        """Set `query`'s fields on `target` from its answer; leave them as they are when it failed."""
        raw = self._ask(index, query, errors, *args, where=where)
        if raw is not None:
            for name, value in zip(query.fields, query.convert(raw), strict=True):
                setattr(target, name, value)

    def _system(self, label: str, call: Call, errors: list[str]) -> Any:
        try:
            return call(self._nvml)
        except self._nvml.NVMLError as exc:
            errors.append(f"{label}: {exc}")
            return None

    def _device(self, index: int, errors: list[str]) -> _Device | None:
        """The cached handle of GPU `index`, opened (and its NVLinks counted) on first use."""
        device = self._devices.get(index)
        if device is not None:
            return device
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from exc
            errors.append(f"gpu {index}: cannot open: {exc}")
            return None
        device = _Device(handle, uuid, self._count_links(index, handle, errors))
        self._devices[index] = device
        return device

    def _count_links(self, index: int, handle: Any, errors: list[str]) -> list[int]:
        nvml = self._nvml
        links = []
        for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
            try:
                nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == nvml.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost from exc
                if code in self._no_link_codes:
                    continue
                # The link exists but failed to answer; count it, its readings will say more.
                errors.append(f"gpu {index} nvlink {link} state: {exc}")
            links.append(link)
        return links

    def _info(self, index: int, device: _Device, errors: list[str]) -> GpuInfo:
        handle = device.handle

        def text(label: str, function: str) -> str:
            return _text(self._ask(index, _Query(label, (), _fn(function)), errors, handle))

        pci = self._ask(index, _Query("pci_bus_id", (), _fn("nvmlDeviceGetPciInfo")), errors, handle)
        memory = self._ask(index, _MEMORY, errors, handle)
        return GpuInfo(
            index=index,
            uuid=device.uuid,
            name=text("name", "nvmlDeviceGetName"),
            serial=text("serial", "nvmlDeviceGetSerial"),
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            vbios_version=text("vbios_version", "nvmlDeviceGetVbiosVersion"),
            board_part_number=text("board_part_number", "nvmlDeviceGetBoardPartNumber"),
            memory_total_bytes=int(memory.total) if memory is not None else None,
            nvlink_count=len(device.links),
        )

    def _sample(self, index: int, device: _Device, errors: list[str], *, with_nvlink: bool) -> GpuReading:
        reading = GpuReading(index=index, uuid=device.uuid)
        for query in _READINGS:
            self._fill(reading, index, query, errors, device.handle)
        if with_nvlink or index not in self._links:
            self._links[index] = self._read_links(index, device, errors)
        # Copies: a reading handed out must not change when the cached links are refreshed.
        reading.nvlinks = [dataclasses.replace(link) for link in self._links[index]]
        return reading

    def _read_links(self, index: int, device: _Device, errors: list[str]) -> list[NvLinkReading]:
        links = []
        for link in device.links:
            where = f" (link {link})"
            link_reading = NvLinkReading(link=link, active=False)
            state = self._ask(index, _LINK_STATE, errors, device.handle, link, where=where)
            if state is None:
                continue  # unknown this cycle: reporting it inactive would be a false alarm
            link_reading.active = bool(state)
            if link_reading.active:
                for query in _LINK_READINGS:
                    self._fill(link_reading, index, query, errors, device.handle, link, where=where)
            links.append(link_reading)
        return links


def _cuda_version(version: Any) -> str:
    """NVML's 12040 as "12.4"."""
    if version is None:
        return ""
    number = int(version)
    return f"{number // 1000}.{number % 1000 // 10}"
