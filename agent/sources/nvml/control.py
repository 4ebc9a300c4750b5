"""The GpuControl of a real node: the GPU settings the tuning actuators read and write, through
NVML (pynvml). NVML counts in milliwatts, this in watts. Application clocks are never used
(deprecated in NVML 13, removed in CUDA 14): clocks are locked and reset with the locked-clock calls.

NVML has no getter for locked clocks, so `locked_clocks` answers what this process last set on
that GPU (whichever NvmlControl set it; kept by UUID until the process ends) and "unknown" before
that: the actuators then always write them, and roll a lock back to "reset". A driver reload or
GPU reset also unlocks the clocks without this process knowing. NVML reports no base clock in MHz
either (it locks at it only through the symbolic NVML_CLOCK_LIMIT_ID_TDP, and the base clock
itself is not read without application clocks): `base_clocks` maps GPU model names (as NVML
names them) to their base clock; other models answer None, and a profile's `base` is refused there.

Every NVMLError becomes a one-line TuningError naming the GPU: no permission, not supported,
refused as outside the driver's constraints, or the error itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from agent.sources.nvml import source
from agent.sources.nvml.query import error_code, fn, text
from agent.tuning.base import TuningError
from agent.tuning.gpu_control import NOT_LOCKED, UNKNOWN, ClockDomain, PowerLimits, clock_text

COMPUTE_MODES = {
    "default": "NVML_COMPUTEMODE_DEFAULT",
    "exclusive_thread": "NVML_COMPUTEMODE_EXCLUSIVE_THREAD",  # deprecated: read, never asked for
    "exclusive_process": "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS",
    "prohibited": "NVML_COMPUTEMODE_PROHIBITED",
}
# Per clock domain: the setting as errors name it, the call that locks it and the one that resets it.
_LOCK_CALLS: dict[str, tuple[str, str, str]] = {
    "gpu": ("locked gpu clocks", "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"),
    "memory": (
        "locked memory clocks",
        "nvmlDeviceSetMemoryLockedClocks",
        "nvmlDeviceResetMemoryLockedClocks",
    ),
}

# Locked clocks this process set, by (GPU UUID, domain): NVML cannot read them back.
_locked: dict[tuple[str, ClockDomain], str] = {}
_locked_guard = threading.Lock()


def _library() -> Any:
    """pynvml as source.py imported it (the one module that does), or None where it is missing."""
    return vars(source).get("_pynvml")


def _watts(milliwatts: Any) -> float:
    return float(milliwatts) / 1000.0


class NvmlControl:
    """GpuControl over NVML. NVML is initialised here and shut down by `close` (the library counts
    its users: an NvmlSource open beside this keeps its own). `nvml` replaces the pynvml module
    (tests)."""

    def __init__(
        self, *, nvml: ModuleType | None = None, base_clocks: Mapping[str, int] | None = None
    ) -> None:
        module: Any = nvml if nvml is not None else _library()
        if module is None:
            missing = source._IMPORT_ERROR
            raise TuningError(
                f"cannot tune GPUs: the pynvml module is missing ({missing}): install nvidia-ml-py"
            )
        self._nvml = module
        self._base_clocks = dict(base_clocks or {})
        self._handles: dict[int, Any] = {}
        self._uuids: dict[int, str] = {}
        self._unsupported = (module.NVML_ERROR_NOT_SUPPORTED, module.NVML_ERROR_FUNCTION_NOT_FOUND)
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise TuningError(self._init_message(exc)) from None
        self._open = True

    def _init_message(self, exc: Any) -> str:
        nvml, code = self._nvml, error_code(exc)
        if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return "cannot tune GPUs: NVML library not found (is the NVIDIA driver installed?)"
        if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
            return "cannot tune GPUs: the NVIDIA driver is not loaded"
        if code == nvml.NVML_ERROR_NO_PERMISSION:
            return "cannot tune GPUs: no permission to open them (are /dev/nvidia* visible to the agent?)"
        return f"cannot tune GPUs: nvmlInit failed: {exc}"

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            raise TuningError(f"nvmlShutdown failed: {exc}") from None

    # NVML calls, errors translated

    def _handle(self, gpu: int) -> Any:
        if not self._open:
            raise TuningError("the NVML control is closed")
        handle = self._handles.get(gpu)
        if handle is None:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(gpu)
            except self._nvml.NVMLError as exc:
                if error_code(exc) == self._nvml.NVML_ERROR_GPU_IS_LOST:
                    raise TuningError(f"gpu {gpu}: lost (fallen off the bus)") from None
                raise TuningError(f"gpu {gpu}: cannot open: {exc}") from None
            self._handles[gpu] = handle
        return handle

    def _call(self, gpu: int, setting: str, value: str | None, function: str, *args: Any) -> Any:
        """NVML `function` on GPU `gpu`'s handle: a read of `setting`, or its write of `value`."""
        handle = self._handle(gpu)
        try:
            return fn(function)(self._nvml, handle, *args)
        except self._nvml.NVMLError as exc:
            raise self._error(gpu, setting, value, exc) from None

    def _error(self, gpu: int, setting: str, value: str | None, exc: Any) -> TuningError:
        nvml, code = self._nvml, error_code(exc)
        doing = f"read {setting}" if value is None else f"set {setting} to {value}"
        if code == nvml.NVML_ERROR_NO_PERMISSION:
            return TuningError(f"gpu {gpu}: needs root (or CAP_SYS_ADMIN) to {doing}")
        if code in self._unsupported:
            return TuningError(f"gpu {gpu}: {setting} not supported on this GPU")
        if code == nvml.NVML_ERROR_INVALID_ARGUMENT and value is not None:
            return TuningError(f"gpu {gpu}: {setting} {value} refused: outside the driver's constraints")
        if code == nvml.NVML_ERROR_GPU_IS_LOST:
            return TuningError(f"gpu {gpu}: lost (fallen off the bus)")
        return TuningError(f"gpu {gpu}: cannot {doing}: {exc}")

    def _enabled(self, on: bool) -> int:
        return int(self._nvml.NVML_FEATURE_ENABLED if on else self._nvml.NVML_FEATURE_DISABLED)

    def _uuid(self, gpu: int) -> str:
        if gpu not in self._uuids:
            self._uuids[gpu] = text(self._call(gpu, "the UUID", None, "nvmlDeviceGetUUID"))
        return self._uuids[gpu]

    # GpuControl

    def gpus(self) -> list[int]:
        try:
            return list(range(int(self._nvml.nvmlDeviceGetCount())))
        except self._nvml.NVMLError as exc:
            raise TuningError(f"cannot count the GPUs: {exc}") from None

    def persistence(self, gpu: int) -> bool:
        mode = self._call(gpu, "persistence mode", None, "nvmlDeviceGetPersistenceMode")
        return bool(mode == self._nvml.NVML_FEATURE_ENABLED)

    def set_persistence(self, gpu: int, on: bool) -> None:
        value = "on" if on else "off"
        self._call(gpu, "persistence mode", value, "nvmlDeviceSetPersistenceMode", self._enabled(on))

    def power_limits(self, gpu: int) -> PowerLimits:
        what = "the power limits"
        low, high = self._call(gpu, what, None, "nvmlDeviceGetPowerManagementLimitConstraints")
        return PowerLimits(
            current_watts=_watts(self._call(gpu, what, None, "nvmlDeviceGetPowerManagementLimit")),
            enforced_watts=_watts(self._call(gpu, what, None, "nvmlDeviceGetEnforcedPowerLimit")),
            default_watts=_watts(self._call(gpu, what, None, "nvmlDeviceGetPowerManagementDefaultLimit")),
            min_watts=_watts(low),
            max_watts=_watts(high),
        )

    def set_power_limit(self, gpu: int, watts: float) -> None:
        self._call(
            gpu, "power limit", f"{watts:g} W", "nvmlDeviceSetPowerManagementLimit", round(watts * 1000)
        )

    def locked_clocks(self, gpu: int, domain: ClockDomain) -> str:
        key = (self._uuid(gpu), domain)
        with _locked_guard:
            return _locked.get(key, UNKNOWN)

    def supported_clocks(self, gpu: int, domain: ClockDomain) -> list[int]:
        memory = self._listed(gpu, "supported memory clocks", "nvmlDeviceGetSupportedMemoryClocks")
        if domain == "memory":
            return sorted(set(memory), reverse=True)
        graphics: set[int] = set()
        for mhz in memory:  # the graphics clocks a memory clock allows: all of them, across them all
            graphics.update(
                self._listed(gpu, "supported gpu clocks", "nvmlDeviceGetSupportedGraphicsClocks", mhz)
            )
        return sorted(graphics, reverse=True)

    def _listed(self, gpu: int, what: str, function: str, *args: Any) -> list[int]:
        """A list of clocks; [] where the driver does not list them."""
        handle = self._handle(gpu)
        try:
            return [int(mhz) for mhz in fn(function)(self._nvml, handle, *args)]
        except self._nvml.NVMLError as exc:
            if error_code(exc) in self._unsupported:
                return []
            raise self._error(gpu, what, None, exc) from None

    def base_clock(self, gpu: int) -> int | None:
        if not self._base_clocks:
            return None
        return self._base_clocks.get(text(self._call(gpu, "the model name", None, "nvmlDeviceGetName")))

    def lock_clocks(self, gpu: int, domain: ClockDomain, min_mhz: int, max_mhz: int) -> None:
        setting, setter, _ = _LOCK_CALLS[domain]
        value = clock_text(min_mhz, max_mhz)
        self._call(gpu, setting, f"{value} MHz", setter, min_mhz, max_mhz)
        self._remember(gpu, domain, value)

    def reset_clocks(self, gpu: int, domain: ClockDomain) -> None:
        setting, _, resetter = _LOCK_CALLS[domain]
        self._call(gpu, setting, NOT_LOCKED, resetter)
        self._remember(gpu, domain, NOT_LOCKED)

    def _remember(self, gpu: int, domain: ClockDomain, value: str) -> None:
        key = (self._uuid(gpu), domain)
        with _locked_guard:
            _locked[key] = value

    def compute_mode(self, gpu: int) -> str:
        mode = self._call(gpu, "compute mode", None, "nvmlDeviceGetComputeMode")
        for name, constant in COMPUTE_MODES.items():
            if mode == getattr(self._nvml, constant, None):
                return name
        return f"unknown ({mode})"

    def set_compute_mode(self, gpu: int, mode: str) -> None:
        constant = getattr(self._nvml, COMPUTE_MODES.get(mode, ""), None)
        if constant is None:
            raise TuningError(f"gpu {gpu}: compute mode {mode!r} is not one of {', '.join(COMPUTE_MODES)}")
        self._call(gpu, "compute mode", mode, "nvmlDeviceSetComputeMode", constant)

    def ecc(self, gpu: int) -> tuple[bool, bool]:
        current, pending = self._call(gpu, "ECC mode", None, "nvmlDeviceGetEccMode")
        enabled = self._nvml.NVML_FEATURE_ENABLED
        return current == enabled, pending == enabled

    def set_ecc(self, gpu: int, on: bool) -> None:
        self._call(gpu, "ECC mode", "on" if on else "off", "nvmlDeviceSetEccMode", self._enabled(on))
