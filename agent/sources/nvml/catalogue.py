"""What NvmlSource asks NVML, per GPU and per NVLink, and where each answer lands.

Field values come first wherever NVML exposes the value as one (one batched nvmlDeviceGetFieldValues
per GPU per cycle), with the equivalent call as the fallback for drivers that lack the field. Values
that only change by an operator's hand or a reboot (limits, max clocks, thresholds, modes) and the
slow queries (processes, fabric) are `slow`: asked every slow cycle and repeated in between.
"""

from __future__ import annotations

import ctypes
import uuid
from typing import Any

from agent.sources.gpu import ComputeProcess
from agent.sources.nvml.query import (
    ALL_LINKS,
    Call,
    Query,
    asked,
    field,
    flag,
    fn,
    hz,
    integer,
    kib,
    milli,
    number,
    one,
    ratio,
    text,
    versioned,
)

# NVML enum values that the source compares against; tests check them against pynvml's names.
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
LINK_UP = (1, 2)  # NVML_NVLINK_STATE_ACTIVE, NVML_NVLINK_STATE_SLEEP (idle, not down)
# nvmlNvlinkVersion_t -> NVLink generation: NVML_NVLINK_VERSION_2_2 = 3 is NVLink 2, 6 is NVLink 4.
NVLINK_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}


def _memory_info(nvml: Any, handle: Any) -> tuple[Any, ...]:
    """(used, total, free, reserved); v1 of the call, older drivers, knows no reserved memory."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            m = nvml.nvmlDeviceGetMemoryInfo(handle, version)
            return (m.used, m.total, m.free, m.reserved)
        except nvml.NVMLError as exc:
            if not versioned(nvml, exc):
                raise
    m = nvml.nvmlDeviceGetMemoryInfo(handle)
    return (m.used, m.total, m.free, None)


def _fabric_info(nvml: Any, handle: Any) -> tuple[Any, ...]:
    """(state + 1, status, cluster uuid, clique id); all but the state only once registered."""
    calls = (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    )
    info: Any = None
    for function, struct in calls:
        if getattr(nvml, function, None) is None or getattr(nvml, struct, None) is None:
            continue
        info = getattr(nvml, struct)()  # the versioned struct sets its own version
        try:
            getattr(nvml, function)(handle, ctypes.byref(info))
            break
        except nvml.NVMLError as exc:
            if not versioned(nvml, exc):
                raise
            info = None
    if info is None:
        raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    state = int(info.state)
    if state != FABRIC_COMPLETED:
        return (state + 1, None, "", None)
    cluster = bytes(info.clusterUuid)
    return (
        state + 1,
        int(info.status),
        str(uuid.UUID(bytes=cluster)) if any(cluster) else "",
        int(info.cliqueId),
    )


def _processes(procs: Any) -> tuple[Any, ...]:
    return ([ComputeProcess(int(p.pid), integer(p.usedGpuMemory)) for p in procs],)


def _performance_state(nvml: Any, handle: Any) -> Any:
    state = nvml.nvmlDeviceGetPerformanceState(handle)
    return None if state == nvml.NVML_PSTATE_UNKNOWN else state


def _bus_id(pci: Any) -> str:
    return text(pci.busId)


def _generation(version: Any) -> int | None:
    return NVLINK_GENERATION.get(int(version))


def _link_up(state: Any) -> bool:
    return int(state) in LINK_UP


def _ecc(error_type: str, counter: str) -> Call:
    return fn("nvmlDeviceGetTotalEccErrors", consts=(error_type, counter))


def _clock(function: str, clock: str) -> Call:
    return fn(function, consts=(clock,))


def _threshold(threshold: str) -> Call:
    return fn("nvmlDeviceGetTemperatureThreshold", consts=(threshold,))


def _nvlink_errors(counter: str) -> Call:
    return fn("nvmlDeviceGetNvLinkErrorCounter", consts=(counter,))


MEMORY = Query(
    "memory",
    ("memory_used_bytes", "memory_total_bytes", "memory_free_bytes", "memory_reserved_bytes"),
    _memory_info,
    lambda m: tuple(integer(v) for v in m),
)
MIG_MODE = Query(
    "mig_mode_enabled", ("mig_mode_enabled",), fn("nvmlDeviceGetMigMode"), lambda m: (m[0] == MIG_ENABLED,)
)

_CORRECTED, _UNCORRECTED = "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"
_VOLATILE, _AGGREGATE = "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"

# Read in the per-GPU field-value batch (calls only where the driver lacks the field).
FIELD_READINGS: tuple[Query, ...] = (
    field("memory_temperature_celsius", "NVML_FI_DEV_MEMORY_TEMP", number),
    field("power_watts", "NVML_FI_DEV_POWER_AVERAGE", milli, fallback=fn("nvmlDeviceGetPowerUsage")),
    field(
        "energy_joules_total",
        "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        milli,
        fallback=fn("nvmlDeviceGetTotalEnergyConsumption"),
    ),
    field(
        "enforced_power_limit_watts",
        "NVML_FI_DEV_POWER_CURRENT_LIMIT",
        milli,
        fallback=fn("nvmlDeviceGetEnforcedPowerLimit"),
    ),
    field(
        "power_management_limit_watts",
        "NVML_FI_DEV_POWER_REQUESTED_LIMIT",
        milli,
        fallback=fn("nvmlDeviceGetPowerManagementLimit"),
        slow=True,
    ),
    field(
        "default_power_limit_watts",
        "NVML_FI_DEV_POWER_DEFAULT_LIMIT",
        milli,
        fallback=fn("nvmlDeviceGetPowerManagementDefaultLimit"),
        slow=True,
    ),
    Query(
        "power_limit_constraints",
        ("power_limit_min_watts", "power_limit_max_watts"),
        fn("nvmlDeviceGetPowerManagementLimitConstraints"),
        lambda c: (milli(c[0]), milli(c[1])),
        ("NVML_FI_DEV_POWER_MIN_LIMIT", "NVML_FI_DEV_POWER_MAX_LIMIT"),
        (milli, milli),
        slow=True,
    ),
    field(
        "ecc_mode_enabled",
        "NVML_FI_DEV_ECC_CURRENT",
        flag,
        fallback=fn("nvmlDeviceGetEccMode"),
        convert=lambda m: (bool(m[0]),),
        slow=True,
    ),
    field(
        "ecc_corrected_volatile_total", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", fallback=_ecc(_CORRECTED, _VOLATILE)
    ),
    field(
        "ecc_uncorrected_volatile_total",
        "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
        fallback=_ecc(_UNCORRECTED, _VOLATILE),
    ),
    field(
        "ecc_corrected_aggregate_total",
        "NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
        fallback=_ecc(_CORRECTED, _AGGREGATE),
    ),
    field(
        "ecc_uncorrected_aggregate_total",
        "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
        fallback=_ecc(_UNCORRECTED, _AGGREGATE),
    ),
    field("retired_pages_sbe_total", "NVML_FI_DEV_RETIRED_SBE"),
    field("retired_pages_dbe_total", "NVML_FI_DEV_RETIRED_DBE"),
    field("retired_pages_pending", "NVML_FI_DEV_RETIRED_PENDING", flag),
    Query(
        "row_remap",
        (
            "row_remap_correctable_total",
            "row_remap_uncorrectable_total",
            "row_remap_pending",
            "row_remap_failure",
        ),
        fn("nvmlDeviceGetRemappedRows"),
        lambda r: (int(r[0]), int(r[1]), bool(r[2]), bool(r[3])),
        (
            "NVML_FI_DEV_REMAPPED_COR",
            "NVML_FI_DEV_REMAPPED_UNC",
            "NVML_FI_DEV_REMAPPED_PENDING",
            "NVML_FI_DEV_REMAPPED_FAILURE",
        ),
        (integer, integer, flag, flag),
    ),
    field(
        "pcie_replay_errors_total",
        "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
        fallback=fn("nvmlDeviceGetPcieReplayCounter"),
    ),
    # Byte counters, turned into rates between cycles. The fallback blocks 20 ms per direction and
    # answers NVML's "KB/s", so it is asked on the slow cadence only.
    Query(
        "pcie_tx_bytes_per_second",
        ("pcie_tx_bytes_per_second",),
        fn("nvmlDeviceGetPcieThroughput", consts=("NVML_PCIE_UTIL_TX_BYTES",)),
        one(lambda kb: float(kb) * 1000.0),
        ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES",),
        (integer,),
        slow=True,
        counter=True,
    ),
    Query(
        "pcie_rx_bytes_per_second",
        ("pcie_rx_bytes_per_second",),
        fn("nvmlDeviceGetPcieThroughput", consts=("NVML_PCIE_UTIL_RX_BYTES",)),
        one(lambda kb: float(kb) * 1000.0),
        ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES",),
        (integer,),
        slow=True,
        counter=True,
    ),
    field("nvlink_tx_bytes_total", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", kib, scope=ALL_LINKS),
    field("nvlink_rx_bytes_total", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", kib, scope=ALL_LINKS),
)

# NVML exposes these only through calls.
CALL_READINGS: tuple[Query, ...] = (
    Query(
        "utilization",
        ("gpu_utilization_ratio", "memory_utilization_ratio"),
        fn("nvmlDeviceGetUtilizationRates"),
        lambda u: (ratio(u.gpu), ratio(u.memory)),
    ),
    MEMORY,
    asked("encoder_utilization_ratio", fn("nvmlDeviceGetEncoderUtilization"), lambda u: ratio(u[0])),
    asked("decoder_utilization_ratio", fn("nvmlDeviceGetDecoderUtilization"), lambda u: ratio(u[0])),
    asked("sm_clock_hz", _clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"), hz),
    asked("memory_clock_hz", _clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"), hz),
    asked("graphics_clock_hz", _clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_GRAPHICS"), hz),
    asked("max_sm_clock_hz", _clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"), hz, slow=True),
    asked("max_memory_clock_hz", _clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"), hz, slow=True),
    asked("max_graphics_clock_hz", _clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_GRAPHICS"), hz, slow=True),
    asked(
        "applications_sm_clock_hz", _clock("nvmlDeviceGetApplicationsClock", "NVML_CLOCK_SM"), hz, slow=True
    ),
    asked(
        "applications_memory_clock_hz",
        _clock("nvmlDeviceGetApplicationsClock", "NVML_CLOCK_MEM"),
        hz,
        slow=True,
    ),
    asked("temperature_celsius", fn("nvmlDeviceGetTemperature", consts=("NVML_TEMPERATURE_GPU",)), number),
    # Absolute thresholds. The NVML_FI_DEV_TEMPERATURE_*_TLIMIT field values are on the T.Limit
    # scale (degrees relative to the limit), not Celsius, so they do not stand in for these.
    asked(
        "slowdown_temperature_celsius", _threshold("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"), number, slow=True
    ),
    asked(
        "shutdown_temperature_celsius", _threshold("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"), number, slow=True
    ),
    asked(
        "max_operating_temperature_celsius",
        _threshold("NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
        number,
        slow=True,
    ),
    asked(
        "memory_max_operating_temperature_celsius",
        _threshold("NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
        number,
        slow=True,
    ),
    asked("fan_speed_ratio", fn("nvmlDeviceGetFanSpeed"), ratio),
    asked(
        "clock_event_reasons",
        fn("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
    ),
    asked("performance_state", _performance_state),
    asked("pcie_link_gen", fn("nvmlDeviceGetCurrPcieLinkGeneration")),
    asked("pcie_link_width", fn("nvmlDeviceGetCurrPcieLinkWidth")),
    asked("pcie_link_gen_max", fn("nvmlDeviceGetMaxPcieLinkGeneration"), slow=True),
    asked("pcie_link_width_max", fn("nvmlDeviceGetMaxPcieLinkWidth"), slow=True),
    asked("persistence_mode_enabled", fn("nvmlDeviceGetPersistenceMode"), flag, slow=True),
    # The contract's ComputeMode is NVML's shifted by one, so that 0 stays "not read".
    asked("compute_mode", fn("nvmlDeviceGetComputeMode"), lambda m: int(m) + 1, slow=True),
    Query(
        "processes",
        ("processes",),
        fn("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
        _processes,
        slow=True,
    ),
    Query(
        "fabric",
        ("fabric_state", "fabric_status", "fabric_cluster_uuid", "fabric_clique_id"),
        _fabric_info,
        tuple,
        slow=True,
    ),
)

_LINK = "nvlinks."

# Asked of every NVLink the GPU has, every slow cycle.
LINK_STATE = field(
    "active", "NVML_FI_DEV_NVLINK_GET_STATE", _link_up, fallback=fn("nvmlDeviceGetNvLinkState"), prefix=_LINK
)

# Asked of active links only: a link that is down answers errors for everything but its state.
LINK_READINGS: tuple[Query, ...] = (
    field(
        "version",
        "NVML_FI_DEV_NVLINK_GET_VERSION",
        _generation,
        fallback=fn("nvmlDeviceGetNvLinkVersion"),
        prefix=_LINK,
    ),
    field(
        "crc_errors_total",
        "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
        fallback=_nvlink_errors("NVML_NVLINK_ERROR_DL_CRC_FLIT"),
        prefix=_LINK,
    ),
    field(
        "replay_errors_total",
        "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
        fallback=_nvlink_errors("NVML_NVLINK_ERROR_DL_REPLAY"),
        prefix=_LINK,
    ),
    field(
        "recovery_errors_total",
        "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
        fallback=_nvlink_errors("NVML_NVLINK_ERROR_DL_RECOVERY"),
        prefix=_LINK,
    ),
    field("tx_bytes_total", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", kib, prefix=_LINK),
    field("rx_bytes_total", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", kib, prefix=_LINK),
    asked("remote_pci_bus_id", fn("nvmlDeviceGetNvLinkRemotePciInfo"), _bus_id, prefix=_LINK),
)

# GpuInfo, asked once per GPU for the inventory.
IDENTITY: tuple[Query, ...] = (
    asked("name", fn("nvmlDeviceGetName"), text),
    asked("serial", fn("nvmlDeviceGetSerial"), text),
    asked("pci_bus_id", fn("nvmlDeviceGetPciInfo"), _bus_id),
    asked("vbios_version", fn("nvmlDeviceGetVbiosVersion"), text),
    asked("board_part_number", fn("nvmlDeviceGetBoardPartNumber"), text),
    # The board's default limit (its power class), also read every slow cycle as a GpuSample field:
    # its own label, so that either's NOT_SUPPORTED memory leaves the other asked.
    Query(
        "identity.default_power_limit_watts",
        ("default_power_limit_watts",),
        fn("nvmlDeviceGetPowerManagementDefaultLimit"),
        one(milli),
    ),
)
