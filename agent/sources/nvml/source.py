"""The real GPU source: NVML through pynvml.

This is the only module that imports pynvml; the nvml_* modules beside it are handed the module.
Every NVMLError stops here: a failed start raises SourceError, a field a GPU cannot report is
remembered and skipped, any other failed field is None for that cycle and named in `last_errors`,
and a GPU that fell off the bus is left out of `read` (but for a reading carrying its XIDs).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

from agent.sources.errors import SourceError
from agent.sources.gpu import GpuInfo, GpuReading, Inventory, NvLinkReading
from agent.sources.nvml.catalogue import (
    CALL_READINGS,
    FIELD_READINGS,
    IDENTITY,
    LINK_READINGS,
    LINK_STATE,
    MEMORY,
    MIG_MODE,
)
from agent.sources.nvml.gpm import MIN_WINDOW_S, GpmSampler
from agent.sources.nvml.query import Query, error_code, fn, text
from agent.sources.nvml.runner import CounterSample, GpuLost, QueryRunner, Subject
from agent.sources.nvml.xid import XidWatcher

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
# The XID thread waits this long per call, so close() returns within about as long.
_XID_WAIT_MS = 1000
_XID_BACKOFF_S = (1.0, 30.0)  # pause after an NVML error in the XID thread, doubling up to the second
_RATES = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")


class _CountedNvml:
    """The pynvml module with every call into it counted; constants, structs and errors pass through."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.calls = 0
        self._lock = threading.Lock()  # the XID thread calls too

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.module, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls += 1
            return value(*args, **kwargs)

        return counted


# NVML is initialised once per process and module: the library keeps one state, and two sources
# (the daemon's and a probe's) must not shut it down under each other. The module object is held
# next to its count so that its id cannot be reused while the count is live.
_init_lock = threading.Lock()
_users: dict[int, tuple[Any, int]] = {}


def _acquire(nvml: _CountedNvml) -> None:
    with _init_lock:
        _, count = _users.get(id(nvml.module), (nvml.module, 0))
        if count == 0:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                raise SourceError(SOURCE, _init_message(nvml, exc)) from exc
        _users[id(nvml.module)] = (nvml.module, count + 1)


def _release(nvml: _CountedNvml) -> None:
    with _init_lock:
        _, count = _users.get(id(nvml.module), (nvml.module, 0))
        if count > 1:
            _users[id(nvml.module)] = (nvml.module, count - 1)
            return
        _users.pop(id(nvml.module), None)
        if count == 0:
            return
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            raise SourceError(SOURCE, f"nvmlShutdown failed: {exc}") from exc


def _init_message(nvml: Any, exc: Any) -> str:
    code = error_code(exc)
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return f"NVML library not found: is the NVIDIA driver installed? {_SIM_HINT}"
    if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return f"the NVIDIA driver is not loaded (nvidia-smi fails too); load it or {_SIM_HINT}"
    if code == nvml.NVML_ERROR_NO_PERMISSION:
        return f"no permission to open the GPUs (are /dev/nvidia* visible to the agent?); or {_SIM_HINT}"
    return f"nvmlInit failed: {exc}"


@dataclass(slots=True)
class _Device:
    handle: Any
    uuid: str
    links: list[int]


def _lost_message(index: int) -> str:
    return f"gpu {index} lost (fallen off the bus)"


def _rate(previous: CounterSample | None, current: CounterSample) -> float | None:
    """Bytes per second between two readings of a byte counter; None without two good readings."""
    if previous is None or current.time_us <= previous.time_us:
        return None
    delta = current.value - previous.value
    if delta < 0:
        if current.bits >= 64:
            return None  # reset (driver reload), not a wrap
        delta += 1 << current.bits
    return delta * 1e6 / (current.time_us - previous.time_us)


def _cuda_version(version: Any) -> str:
    """NVML's 12040 as "12.4"."""
    if version is None:
        return ""
    number = int(version)
    return f"{number // 1000}.{number % 1000 // 10}"


class NvmlSource:
    """GpuSource backed by NVML: inventory once, readings every cycle, in base units.

    NVML is initialised once per process however many sources are open, and shut down when the last
    one closes. Device handles are cached; a field a GPU answers NOT_SUPPORTED for is listed in its
    GpuInfo.unsupported_fields and never asked again. What NVML exposes as field values is read in
    one nvmlDeviceGetFieldValues per GPU per read. Slow queries (per-link NVLink, processes, fabric,
    limits and other settings) run every `slow_every` reads, their last values repeated in between.
    Without `gpm` the GPM metrics stay empty and no GPM call is made (the probe runner's source,
    which uses none); with it they cover at least `gpm_min_window_s` (gpm.py). With `xid_events` a
    thread waits for XID errors: each reading carries the XIDs since the previous read and the totals
    per code since the start. `calls` counts every call into pynvml.
    `nvml` replaces the pynvml module (tests).
    """

    def __init__(
        self,
        *,
        slow_every: int = 6,
        xid_events: bool = True,
        gpm: bool = True,
        gpm_min_window_s: float = MIN_WINDOW_S,
        nvml: ModuleType | None = None,
    ) -> None:
        if slow_every < 1:
            raise ValueError(f"slow_every must be at least 1, not {slow_every}")
        module: Any = nvml if nvml is not None else _pynvml
        if module is None:
            raise SourceError(
                SOURCE, f"the pynvml module is missing ({_IMPORT_ERROR}): install nvidia-ml-py or {_SIM_HINT}"
            )
        self._nvml: Any = _CountedNvml(module)
        self._slow_every = slow_every
        self._no_link_codes = {module.NVML_ERROR_NOT_SUPPORTED, module.NVML_ERROR_INVALID_ARGUMENT}
        self._open = False
        _acquire(self._nvml)
        self._open = True
        self._xids: XidWatcher | None = None
        self._gpm = GpmSampler(self._nvml, min_window_s=gpm_min_window_s)
        try:
            self._count = int(self._nvml.nvmlDeviceGetCount())
        except module.NVMLError as exc:
            self.close()
            raise SourceError(SOURCE, f"cannot count the GPUs: {exc}") from exc
        self._runner = QueryRunner(self._nvml)
        self._gpm_on = gpm
        self._queries = (*FIELD_READINGS, *CALL_READINGS, *((self._gpm.query(),) if gpm else ()))
        self._xid_query: Query | None = None
        if xid_events:
            self._xids = XidWatcher(self._nvml, wait_ms=_XID_WAIT_MS, backoff_s=_XID_BACKOFF_S)
            self._xid_query = Query("xid_events", ("xid_events", "xid_counts"), self._xids.watch)
        self._devices: dict[int, _Device] = {}
        self._uuids: dict[int, str] = {}  # kept for GPUs that are lost
        self._lost: set[int] = set()
        self._cache: dict[int, dict[str, dict[str, Any]]] = {}  # slow answers, per GPU and query
        self._links: dict[int, list[NvLinkReading]] = {}  # last per-link readings, reused between
        self._counters: dict[int, dict[str, CounterSample]] = {}  # last byte counters, for rates
        self._cycle = 0
        self._errors: list[str] = []
        # Handles are opened now; a GPU that fails here is retried on each read (unless lost).
        errors: list[str] = []
        for index in range(self._count):
            try:
                self._device(index, errors)
            except GpuLost:
                self._lost.add(index)
                errors.append(_lost_message(index))
        for message in errors:
            log.warning("nvml: %s", message)

    @property
    def calls(self) -> int:
        """Calls into pynvml so far, by this source and its XID thread."""
        return int(self._nvml.calls)

    # GpuSource

    def inventory(self) -> Inventory:
        self._check_open()
        errors: list[str] = []
        gpus: list[GpuInfo] = []
        driver = text(self._system("driver_version", fn("nvmlSystemGetDriverVersion"), errors))
        cuda = self._system(
            "cuda_driver_version",
            fn("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"),
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
                self._sample(index, device, [], slow=True)
            except GpuLost:
                self._mark_lost(index, errors)
                continue
            info.driver_version = driver
            info.unsupported_fields = self._runner.unsupported(index)
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
        slow = self._cycle % self._slow_every == 0
        self._cycle += 1
        for index in range(self._count):
            if index in self._lost:
                errors.append(_lost_message(index))
                self._xid_only(index, readings)
                continue
            try:
                device = self._device(index, errors)
                if device is not None:
                    reading = self._sample(index, device, errors, slow=slow)
                    self._attach_xids(index, reading)
                    readings.append(reading)
            except GpuLost:
                self._mark_lost(index, errors)
                self._xid_only(index, readings)
        self._errors = errors
        return readings

    def last_errors(self) -> list[str]:
        return list(self._errors)

    def gpm_ready_in(self) -> float:
        """Seconds until a read carries GPM metrics over a full window (0 without GPM). A one-off
        snapshot waits this long after the inventory, whose sample primes GPM."""
        return self._gpm.ready_in() if self._gpm_on else 0.0

    def close(self) -> None:
        """Stop the XID thread, free GPM samples and release this source's share of NVML.

        The last source to close shuts NVML down. Returns within about one XID wait (1 s).
        """
        if not self._open:
            return
        self._open = False
        if self._xids is not None:
            self._xids.stop()
        self._gpm.close()
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

    def _attach_xids(self, index: int, reading: GpuReading) -> None:
        if self._xids is not None:
            reading.xid_events, reading.xid_counts = self._xids.take(index)

    def _xid_only(self, index: int, readings: list[GpuReading]) -> None:
        """A lost GPU's XIDs (79, fallen off the bus, above all) still reach the stream: a reading
        with nothing else read."""
        if self._xids is not None and self._xids.has_any(index):
            reading = GpuReading(index=index, uuid=self._uuids.get(index, ""))
            self._attach_xids(index, reading)
            readings.append(reading)

    def _system(self, label: str, call: Any, errors: list[str]) -> Any:
        try:
            return call(self._nvml)
        except self._nvml.NVMLError as exc:
            errors.append(f"{label}: {exc}")
            return None

    def _device(self, index: int, errors: list[str]) -> _Device | None:
        """The cached handle of GPU `index`, opened (NVLinks counted, XIDs watched) on first use."""
        device = self._devices.get(index)
        if device is not None:
            return device
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            if error_code(exc) == nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost from exc
            errors.append(f"gpu {index}: cannot open: {exc}")
            return None
        device = _Device(handle, uuid, self._count_links(index, handle, errors))
        self._devices[index] = device
        self._uuids[index] = uuid
        if self._xid_query is not None:
            self._runner.ask(index, self._xid_query, errors, index, handle)
        return device

    def _count_links(self, index: int, handle: Any, errors: list[str]) -> list[int]:
        nvml = self._nvml
        links = []
        for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
            try:
                nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:
                code = error_code(exc)
                if code == nvml.NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost from exc
                if code in self._no_link_codes:
                    continue
                # The link exists but failed to answer; count it, its readings will say more.
                errors.append(f"gpu {index} nvlink {link} state: {exc}")
            links.append(link)
        return links

    def _info(self, index: int, device: _Device, errors: list[str]) -> GpuInfo:
        identity: dict[str, Any] = {}
        for query in IDENTITY:
            self._runner.fill(identity, index, query, errors, device.handle)
        memory = self._runner.ask(index, MEMORY, errors, device.handle)
        mig = self._runner.ask(index, MIG_MODE, errors, device.handle)
        return GpuInfo(
            index=index,
            uuid=device.uuid,
            **identity,
            memory_total_bytes=MEMORY.convert(memory)[1] if memory is not None else None,
            nvlink_count=len(device.links),
            mig_mode_enabled=MIG_MODE.convert(mig)[0] if mig is not None else None,
        )

    def _sample(self, index: int, device: _Device, errors: list[str], *, slow: bool) -> GpuReading:
        values: dict[str, Any] = {}
        subject = Subject(values, (device.handle,))
        cache = self._cache.setdefault(index, {})
        self._runner.run(index, device.handle, self._queries, [subject], errors, slow=slow, cache=cache)
        self._to_rates(index, values)
        reading = GpuReading(index=index, uuid=device.uuid)
        for name, value in values.items():
            if value is not None:  # None: not read; the reading's default says so (an empty list, "")
                setattr(reading, name, value)
        if slow or index not in self._links:
            self._links[index] = self._read_links(index, device, errors)
        # Copies: a reading handed out must not change when the cached links are refreshed.
        reading.nvlinks = [dataclasses.replace(link) for link in self._links[index]]
        return reading

    def _to_rates(self, index: int, values: dict[str, Any]) -> None:
        """Byte counters read as field values become rates since the previous reading."""
        previous = self._counters.setdefault(index, {})
        for name in _RATES:
            sample = values.get(name)
            if isinstance(sample, CounterSample):
                values[name] = _rate(previous.get(name), sample)
                previous[name] = sample

    def _read_links(self, index: int, device: _Device, errors: list[str]) -> list[NvLinkReading]:
        handle = device.handle
        subjects = [Subject({}, (handle, link), scope=link, where=f" (link {link})") for link in device.links]
        if not subjects:
            return []
        self._runner.run(index, handle, (LINK_STATE,), subjects, errors)
        links: list[NvLinkReading] = []
        active: list[tuple[NvLinkReading, Subject]] = []
        for link, subject in zip(device.links, subjects, strict=True):
            state = subject.values.get("active")
            if state is None:
                continue  # unknown this cycle: reporting it inactive would be a false alarm
            reading = NvLinkReading(link=link, active=bool(state))
            links.append(reading)
            if reading.active:
                active.append((reading, subject))
        if active:
            self._runner.run(index, handle, LINK_READINGS, [s for _, s in active], errors)
            for reading, subject in active:
                for name, value in subject.values.items():
                    if value is not None:
                        setattr(reading, name, value)
        return links
