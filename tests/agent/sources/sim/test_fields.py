"""The simulator fills the whole GPU contract, as NVML would on an HGX H100, and faults move only
the fields a real GPU would move.

Fault checks compare the faulty node with its twin (same node name and seed, no fault) read at the
same moments: the faulty GPU must differ in its fault's fields and nowhere else, and every other GPU
of the node must read exactly as in the twin.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Callable, Sequence

import pytest

from agent.sources.gpu import ComputeProcess, GpuInfo, GpuReading, NvLinkReading, XidCount, XidEvent
from agent.sources.sim import FAULTS, FaultSpec, SimNode
from agent.sources.sim.profile import H100_SXM
from agent.stream import frames
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_names, enum_name

GPU = 3
START = 1_800_000_000.0
# What NVML answers NOT_SUPPORTED for on an H100 SXM: no fan on an SXM module, and Hopper
# retires no pages (row remapping replaced page retirement).
UNSUPPORTED = {
    "fan_speed_ratio",
    "retired_pages_sbe_total",
    "retired_pages_dbe_total",
    "retired_pages_pending",
}
# Empty as a reading, not as a gap: no XIDs on a healthy GPU, and HGX H100 is a single-node NVLink
# domain whose fabric cluster UUID is all zeros, which the NVML source reads as unset.
MAY_BE_EMPTY = {"xid_events", "xid_counts", "fabric_cluster_uuid"}


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def reads(node: SimNode, clock: Clock, count: int, step: float = 10.0) -> list[list[GpuReading]]:
    out = []
    for _ in range(count):
        out.append(node.read())
        clock.now += step
    return out


def node_and_clock(faults: list[FaultSpec] | None = None, **kwargs: typing.Any) -> tuple[SimNode, Clock]:
    clock = Clock()
    return SimNode("node-a", seed=7, faults=faults or [], clock=clock, **kwargs), clock


def fields(obj: object) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]  # type: ignore[arg-type]


def missing(value: object) -> bool:
    return value is None or value in ("", [])


# Every field produced


def test_inventory_lists_what_an_h100_sxm_cannot_report() -> None:
    node, _ = node_and_clock()
    reading_fields = set(fields(GpuReading))
    for info in node.inventory().gpus:
        assert set(info.unsupported_fields) == UNSUPPORTED
        assert set(info.unsupported_fields) <= reading_fields
        assert [
            name for name in fields(info) if missing(getattr(info, name)) and name != "unsupported_fields"
        ] == []
        assert info.mig_mode_enabled is False


@pytest.mark.parametrize("load", [0.95, 0.0])
def test_every_reading_field_is_produced_unless_unsupported(load: float) -> None:
    node, clock = node_and_clock(load=load)
    for reading in reads(node, clock, 2)[-1]:
        for name in fields(reading):
            value = getattr(reading, name)
            if name in UNSUPPORTED:
                assert value is None, name
            elif name == "processes":
                assert bool(value) == (load > 0), (
                    "a process holds each GPU while the job runs, none when idle"
                )
            elif name not in MAY_BE_EMPTY:
                assert not missing(value), name
        assert len(reading.nvlinks) == 18
        for link in reading.nvlinks:
            assert [name for name in fields(link) if missing(getattr(link, name))] == []
        for process in reading.processes:
            assert process.pid > 0 and process.kind == "compute" and process.used_memory_bytes


def test_healthy_gpus_raise_no_xids() -> None:
    node, clock = node_and_clock()
    for readings in reads(node, clock, 3):
        assert all(r.xid_events == [] and r.xid_counts == [] for r in readings)


def test_every_produced_field_reaches_the_wire() -> None:
    """Names and types match the proto one for one: the agent's generic copy sets every field."""
    node, clock = node_and_clock([FaultSpec("ecc_row_remap_pending", GPU)])
    reading = reads(node, clock, 1)[0][GPU]
    msg = frames.fill(pb.GpuSample(), reading)
    for name in fields(reading):
        value = getattr(reading, name)
        if isinstance(value, list):
            assert len(getattr(msg, name)) == len(value), name
        elif value is not None:
            assert getattr(msg, name) == value, name
            if msg.DESCRIPTOR.fields_by_name[name].has_presence:
                assert msg.HasField(name), name
    info = frames.fill(pb.GpuInfo(), node.inventory().gpus[0])
    assert list(info.unsupported_fields) == node.inventory().gpus[0].unsupported_fields  # type: ignore[attr-defined]


# Types as the dataclasses declare them


def conforms(value: object, hint: object) -> bool:
    """`value` is of type `hint` exactly: an int where a float is declared does not pass."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(conforms(value, arg) for arg in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(conforms(v, item) for v in value)
    return type(value) is hint


def check_types(obj: object) -> list[str]:
    hints = typing.get_type_hints(type(obj))
    wrong = [
        f"{type(obj).__name__}.{n}: {getattr(obj, n)!r}"
        for n in fields(obj)
        if not conforms(getattr(obj, n), hints[n])
    ]
    for name in fields(obj):
        for item in getattr(obj, name) if isinstance(getattr(obj, name), list) else []:
            if dataclasses.is_dataclass(item):
                wrong += check_types(item)
    return wrong


def test_types_match_the_dataclass_annotations() -> None:
    node, clock = node_and_clock([FaultSpec("ecc_row_remap_pending", GPU), FaultSpec("power_cap", 1)])
    first = reads(node, clock, 2)[0]
    assert first[GPU].xid_events and first[GPU].xid_counts and first[GPU].processes  # items get checked too
    wrong = [w for reading in first for w in check_types(reading)]
    wrong += [w for info in node.inventory().gpus for w in check_types(info)]
    assert wrong == []
    assert {type(x) for x in (first[GPU].nvlinks[0], first[GPU].processes[0])} == {
        NvLinkReading,
        ComputeProcess,
    }
    assert {type(x) for x in (first[GPU].xid_events[0], first[GPU].xid_counts[0])} == {XidEvent, XidCount}
    assert type(node.inventory().gpus[0]) is GpuInfo


# Physical consistency of a healthy node


def test_healthy_readings_are_consistent() -> None:
    node, clock = node_and_clock()
    for r in reads(node, clock, 3)[-1]:
        assert r.memory_total_bytes == 81559 * 1024**2
        assert r.memory_free_bytes == (r.memory_total_bytes or 0) - (r.memory_reserved_bytes or 0) - (
            r.memory_used_bytes or 0
        )
        assert sum(p.used_memory_bytes or 0 for p in r.processes) <= (r.memory_used_bytes or 0)
        assert (r.power_limit_min_watts, r.power_limit_max_watts, r.default_power_limit_watts) == (
            200,
            700,
            700,
        )
        assert r.power_management_limit_watts == r.enforced_power_limit_watts == 700
        assert (
            (r.power_limit_min_watts or 0)
            < (r.power_watts or 0)
            <= (r.enforced_power_limit_watts or 0) * 1.02
        )
        # nvidia-smi on an H100 SXM: max operating 87 C < slowdown 89 C < shutdown 92 C; HBM3 95 C.
        assert (
            r.max_operating_temperature_celsius,
            r.slowdown_temperature_celsius,
            r.shutdown_temperature_celsius,
            r.memory_max_operating_temperature_celsius,
        ) == (87, 89, 92, 95)
        assert (r.temperature_celsius or 0) < (r.max_operating_temperature_celsius or 0)
        assert (r.memory_temperature_celsius or 0) < (r.memory_max_operating_temperature_celsius or 0)
        assert r.sm_clock_hz == r.graphics_clock_hz == r.max_sm_clock_hz == r.max_graphics_clock_hz == 1980e6
        assert r.memory_clock_hz == r.applications_memory_clock_hz == r.max_memory_clock_hz == 2619e6
        assert (r.pcie_link_gen, r.pcie_link_width) == (5, 16)
        assert r.ecc_mode_enabled and r.persistence_mode_enabled
        assert (r.ecc_corrected_aggregate_total or 0) >= (r.ecc_corrected_volatile_total or 0)
        assert enum_name(pb.ComputeMode, r.compute_mode or 0) == "default"
        assert enum_name(pb.FabricState, r.fabric_state or 0) == "completed" and r.fabric_status == 0
        assert r.fabric_cluster_uuid == "" and r.fabric_clique_id == 0
        assert r.encoder_utilization_ratio == r.decoder_utilization_ratio == 0.0
        assert (r.nvlink_tx_bytes_total, r.nvlink_rx_bytes_total) == (
            sum(link.tx_bytes_total or 0 for link in r.nvlinks),
            sum(link.rx_bytes_total or 0 for link in r.nvlinks),
        )
        assert all(link.active and link.version == 4 for link in r.nvlinks)
        ratios = [getattr(r, n) for n in fields(r) if n.endswith("_ratio") and getattr(r, n) is not None]
        assert all(0.0 <= x <= 1.0 for x in ratios)


def test_activity_and_traffic_follow_the_load() -> None:
    busy, busy_clock = node_and_clock()
    idle, idle_clock = node_and_clock(load=0.0)
    b, i = reads(busy, busy_clock, 3), reads(idle, idle_clock, 3)
    for r in b[-1]:
        assert (r.gpm_sm_activity_ratio or 0) > 0.8 and (r.gpm_graphics_activity_ratio or 0) > 0.85
        assert 0.3 < (r.gpm_tensor_activity_ratio or 0) < 0.6 and 0.4 < (r.gpm_dram_activity_ratio or 0) < 0.7
        assert (r.pcie_rx_bytes_per_second or 0) > 1e9 and (r.pcie_tx_bytes_per_second or 0) > 1e9
    for r in i[-1]:
        assert r.gpm_sm_activity_ratio == r.gpm_tensor_activity_ratio == r.gpm_dram_activity_ratio == 0.0
        assert r.pcie_tx_bytes_per_second == r.pcie_rx_bytes_per_second == 0.0
        assert r.processes == [] and r.gpu_utilization_ratio == 0.0
    busy_bytes = (b[-1][0].nvlink_tx_bytes_total or 0) - (b[0][0].nvlink_tx_bytes_total or 0)
    idle_bytes = (i[-1][0].nvlink_tx_bytes_total or 0) - (i[0][0].nvlink_tx_bytes_total or 0)
    # 18 links x 25 GB/s x 30% busy for 20 s, give or take the load noise.
    assert 2.2e12 < busy_bytes < 3.0e12 and idle_bytes == 0


# Counters


COUNTERS: dict[str, Callable[[GpuReading], Sequence[float]]] = {
    "energy": lambda r: [r.energy_joules_total or 0.0],
    "ecc": lambda r: [
        r.ecc_corrected_volatile_total or 0,
        r.ecc_uncorrected_volatile_total or 0,
        r.ecc_corrected_aggregate_total or 0,
        r.ecc_uncorrected_aggregate_total or 0,
        r.row_remap_correctable_total or 0,
        r.row_remap_uncorrectable_total or 0,
    ],
    "pcie": lambda r: [r.pcie_replay_errors_total or 0],
    "nvlink": lambda r: (
        [r.nvlink_tx_bytes_total or 0, r.nvlink_rx_bytes_total or 0]
        + [
            value or 0
            for link in r.nvlinks
            for value in (
                link.tx_bytes_total,
                link.rx_bytes_total,
                link.crc_errors_total,
                link.replay_errors_total,
                link.recovery_errors_total,
            )
        ]
    ),
    "xid": lambda r: [c.total for c in r.xid_counts],
}


def test_counters_never_go_back() -> None:
    faults = [FaultSpec("nvlink_down", 1), FaultSpec("ecc_row_remap_pending", GPU)]
    node, clock = node_and_clock(faults)
    history = reads(node, clock, 40, step=7.0)
    for before, after in itertools.pairwise(history):
        for a, b in zip(before, after, strict=True):
            for family, values in COUNTERS.items():
                old, new = values(a), values(b)
                assert len(old) <= len(new) and all(x <= y for x, y in zip(old, new, strict=False)), family
    assert all(
        (after.energy_joules_total or 0) > (before.energy_joules_total or 0)
        and (after.nvlink_tx_bytes_total or 0) > (before.nvlink_tx_bytes_total or 0)
        for before, after in zip(history[0], history[-1], strict=True)
    )


def test_energy_integrates_power() -> None:
    node, clock = node_and_clock()
    history = reads(node, clock, 5, step=10.0)
    for before, after in itertools.pairwise(history):
        for a, b in zip(before, after, strict=True):
            gained = (b.energy_joules_total or 0) - (a.energy_joules_total or 0)
            assert abs(gained - 10.0 * (b.power_watts or 0)) < 0.01


def test_counters_start_where_the_driver_left_them() -> None:
    """NVML counts from the driver load, days before the agent; a one-shot read still has totals."""
    node, _ = node_and_clock()
    first = node.read()
    assert all((r.energy_joules_total or 0) > 1e6 and (r.nvlink_tx_bytes_total or 0) > 1e12 for r in first)


# Faults: the faulty GPU moves in its fault's fields only; its neighbours do not move at all


CLOCK_EFFECTS = {
    "sm_clock_hz",
    "graphics_clock_hz",
    "clock_event_reasons",
    "power_watts",
    "energy_joules_total",
    "temperature_celsius",
    "memory_temperature_celsius",
    "gpm_dram_activity_ratio",  # kernels move memory as fast as they progress
    "memory_utilization_ratio",
}
# fault: (fields that must differ from the twin, fields that may)
MOVES: dict[str, tuple[set[str], set[str]]] = {
    "thermal_throttle": (
        {
            "temperature_celsius",
            "memory_temperature_celsius",
            "clock_event_reasons",
            "sm_clock_hz",
            "power_watts",
        },
        CLOCK_EFFECTS,
    ),
    "power_brake": (
        {"clock_event_reasons", "sm_clock_hz", "power_watts", "energy_joules_total"},
        CLOCK_EFFECTS,
    ),
    "power_cap": (
        {"power_management_limit_watts", "enforced_power_limit_watts", "clock_event_reasons", "sm_clock_hz"},
        CLOCK_EFFECTS | {"power_management_limit_watts", "enforced_power_limit_watts"},
    ),
    "clocks_locked_low": (
        {"applications_sm_clock_hz", "sm_clock_hz", "clock_event_reasons", "power_watts"},
        CLOCK_EFFECTS | {"applications_sm_clock_hz"},
    ),
    "pcie_downtrained": (
        {"pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"},
        {"pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "pcie_link_gen", "pcie_link_width"},
    ),
    "nvlink_down": (
        {"nvlinks", "nvlink_tx_bytes_total", "nvlink_rx_bytes_total"},
        {"nvlinks", "nvlink_tx_bytes_total", "nvlink_rx_bytes_total"},
    ),
    "ecc_row_remap_pending": (
        {
            "ecc_uncorrected_volatile_total",
            "ecc_uncorrected_aggregate_total",
            "row_remap_uncorrectable_total",
            "row_remap_pending",
            "xid_counts",
        },
        {
            "ecc_uncorrected_volatile_total",
            "ecc_uncorrected_aggregate_total",
            "row_remap_uncorrectable_total",
            "row_remap_pending",
            "xid_counts",
            "xid_events",
        },
    ),
    "hbm_degraded": (
        {"gpm_dram_activity_ratio", "memory_utilization_ratio"},
        {"gpm_dram_activity_ratio", "memory_utilization_ratio"},
    ),
    "nvlink_crc_errors": ({"nvlinks"}, {"nvlinks"}),  # up and carrying traffic: only error counters move
    # Off the bus: nothing but the XIDs is read, so every field but those goes missing.
    "xid_79": ({"sm_clock_hz", "power_watts", "nvlinks", "xid_counts"}, set(fields(GpuReading))),
    "xid_48": (
        {"ecc_uncorrected_volatile_total", "ecc_uncorrected_aggregate_total", "xid_counts"},
        {"ecc_uncorrected_volatile_total", "ecc_uncorrected_aggregate_total", "xid_counts", "xid_events"},
    ),
    "vbios_drift": (set(), set()),  # the inventory shows it (test_vbios_drift_changes_the_inventory_only)
}
GPU_FAULTS = sorted(name for name, fault in FAULTS.items() if fault.level == "gpu")


def test_every_gpu_fault_has_its_fields() -> None:
    assert set(MOVES) == set(GPU_FAULTS)


def twin_histories(fault: str, count: int = 4) -> tuple[list[list[GpuReading]], list[list[GpuReading]]]:
    faulty, faulty_clock = node_and_clock([FaultSpec(fault, GPU)])
    twin, twin_clock = node_and_clock()
    if fault != "vbios_drift":
        assert faulty.inventory() == twin.inventory()  # a fault changes readings, not the inventory
    return reads(faulty, faulty_clock, count), reads(twin, twin_clock, count)


@pytest.mark.parametrize("fault", GPU_FAULTS)
def test_fault_moves_its_fields_and_nothing_else(fault: str) -> None:
    faulty, twin = twin_histories(fault)
    must, may = MOVES[fault]
    for f_reads, t_reads in zip(faulty, twin, strict=True):
        for index, (f, t) in enumerate(zip(f_reads, t_reads, strict=True)):
            if index != GPU:
                assert f == t, f"healthy GPU {index} moved"
        moved = {
            name
            for name in fields(f_reads[GPU])
            if getattr(f_reads[GPU], name) != getattr(t_reads[GPU], name)
        }
        assert moved <= may, sorted(moved - may)
    # Counters need time to part: by the last read, every field of the fault has moved.
    assert must <= moved, sorted(must - moved)


def test_thermal_throttle_runs_hot_and_slow() -> None:
    (*_, f), (*_, t) = twin_histories("thermal_throttle")
    a, b = f[GPU], t[GPU]
    assert (a.temperature_celsius or 0) >= 85 and (a.temperature_celsius or 0) > (
        b.temperature_celsius or 0
    ) + 5
    assert (a.memory_temperature_celsius or 0) > (b.memory_temperature_celsius or 0) + 5
    assert {"hw_slowdown", "hw_thermal_slowdown"} <= set(clock_event_reason_names(a.clock_event_reasons or 0))
    assert (a.sm_clock_hz or 0) < (b.sm_clock_hz or 0)


def test_power_brake_draws_well_under_an_unchanged_limit() -> None:
    (*_, f), (*_, t) = twin_histories("power_brake")
    a, b = f[GPU], t[GPU]
    assert a.enforced_power_limit_watts == a.power_management_limit_watts == a.default_power_limit_watts
    assert (a.power_watts or 0) < 0.7 * (a.enforced_power_limit_watts or 0) < (b.power_watts or 0)
    assert "hw_power_brake_slowdown" in clock_event_reason_names(a.clock_event_reasons or 0)


def test_power_cap_lowers_the_set_and_enforced_limit_within_constraints() -> None:
    (*_, f), _ = twin_histories("power_cap")
    a = f[GPU]
    limit = a.enforced_power_limit_watts or 0
    assert a.power_management_limit_watts == limit
    assert (a.power_limit_min_watts or 0) <= limit < 0.7 * (a.default_power_limit_watts or 0)
    assert (a.power_watts or 0) <= limit * 1.02
    assert "sw_power_cap" in clock_event_reason_names(a.clock_event_reasons or 0)


def test_clocks_locked_low_pins_the_clock_at_the_setting() -> None:
    (*_, f), _ = twin_histories("clocks_locked_low")
    a = f[GPU]
    assert a.sm_clock_hz == a.graphics_clock_hz == a.applications_sm_clock_hz
    assert (a.applications_sm_clock_hz or 0) < 0.8 * (a.max_sm_clock_hz or 0)
    assert clock_event_reason_names(a.clock_event_reasons or 0) == ["applications_clocks_setting"]


def test_pcie_downtrained_cuts_host_traffic_with_the_link() -> None:
    (*_, f), (*_, t) = twin_histories("pcie_downtrained")
    a, b = f[GPU], t[GPU]
    assert (a.pcie_link_gen or 0) < (a.pcie_link_gen_max or 0) or (a.pcie_link_width or 0) < (
        a.pcie_link_width_max or 0
    )
    assert (a.pcie_rx_bytes_per_second or 0) < 0.6 * (b.pcie_rx_bytes_per_second or 0)
    assert (a.pcie_tx_bytes_per_second or 0) < 0.6 * (b.pcie_tx_bytes_per_second or 0)
    assert a.pcie_replay_errors_total == b.pcie_replay_errors_total


def test_nvlink_down_links_carry_nothing_and_keep_erroring() -> None:
    faulty, twin = twin_histories("nvlink_down", count=5)
    first, last = faulty[0][GPU], faulty[-1][GPU]
    down = [link.link for link in last.nvlinks if not link.active]
    assert 2 <= len(down) <= 6
    for link in down:
        a, b = first.nvlinks[link], last.nvlinks[link]
        assert (a.tx_bytes_total, a.rx_bytes_total) == (b.tx_bytes_total, b.rx_bytes_total)
        assert (a.crc_errors_total or 0) < (b.crc_errors_total or 0)
        assert (a.replay_errors_total or 0) < (b.replay_errors_total or 0)
        assert (b.recovery_errors_total or 0) > 0
    for link in set(range(18)) - set(down):
        assert last.nvlinks[link] == twin[-1][GPU].nvlinks[link]

    def moved(readings: list[list[GpuReading]]) -> int:
        return (readings[-1][GPU].nvlink_tx_bytes_total or 0) - (readings[0][GPU].nvlink_tx_bytes_total or 0)

    assert moved(faulty) == pytest.approx(moved(twin) * (18 - len(down)) / 18, rel=0.01)


def test_ecc_row_remap_pending_counts_the_error_and_raises_its_xids_once() -> None:
    faulty, _ = twin_histories("ecc_row_remap_pending")
    first, later = faulty[0][GPU], faulty[-1][GPU]
    errors = first.ecc_uncorrected_volatile_total or 0
    assert (
        errors >= 1 and first.ecc_uncorrected_aggregate_total == errors == first.row_remap_uncorrectable_total
    )
    assert first.row_remap_pending is True and first.row_remap_failure is False
    # 94: contained ECC error; 63: row remapping recorded, active after a reset.
    assert sorted(e.code for e in first.xid_events) == [63] * errors + [94] * errors
    assert all(e.unix_time_seconds == START for e in first.xid_events)
    assert later.xid_events == []
    assert [(c.code, c.total) for c in later.xid_counts] == [(63, errors), (94, errors)]


def test_hbm_degraded_lowers_dram_activity_only() -> None:
    (*_, f), (*_, t) = twin_histories("hbm_degraded")
    a, b = f[GPU], t[GPU]
    assert (a.gpm_dram_activity_ratio or 0) < 0.9 * (b.gpm_dram_activity_ratio or 0)
    assert (a.sm_clock_hz, a.memory_clock_hz, a.gpm_sm_activity_ratio) == (
        b.sm_clock_hz,
        b.memory_clock_hz,
        b.gpm_sm_activity_ratio,
    )


def test_nvlink_crc_errors_keep_the_links_up_and_their_errors_rising() -> None:
    faulty, twin = twin_histories("nvlink_crc_errors", count=5)
    first, last, healthy = faulty[0][GPU], faulty[-1][GPU], twin[-1][GPU]
    erroring = [
        link.link
        for link in last.nvlinks
        if link.crc_errors_total != healthy.nvlinks[link.link].crc_errors_total
    ]
    assert 1 <= len(erroring) <= 3
    assert all(link.active for link in last.nvlinks)
    for link in erroring:
        a, b, t = first.nvlinks[link], last.nvlinks[link], healthy.nvlinks[link]
        assert (a.crc_errors_total or 0) < (b.crc_errors_total or 0)
        assert (a.replay_errors_total or 0) < (b.replay_errors_total or 0)
        assert (b.tx_bytes_total, b.rx_bytes_total, b.recovery_errors_total) == (
            t.tx_bytes_total,
            t.rx_bytes_total,
            t.recovery_errors_total,
        )
    assert last.nvlink_tx_bytes_total == healthy.nvlink_tx_bytes_total


def test_xid_79_leaves_only_the_xids_of_a_gpu_off_the_bus() -> None:
    node, clock = node_and_clock([FaultSpec("xid_79", GPU)])
    first, later = reads(node, clock, 3)[0::2]
    lost = first[GPU]
    assert [e.code for e in lost.xid_events] == [79] and lost.xid_events[0].unix_time_seconds == START
    assert lost.uuid == node.inventory().gpus[GPU].uuid
    assert all(
        missing(getattr(lost, name))
        for name in set(fields(lost)) - {"index", "uuid", "xid_events", "xid_counts"}
    )
    assert later[GPU].xid_events == [] and [(c.code, c.total) for c in later[GPU].xid_counts] == [(79, 1)]
    assert node.last_errors() == [f"gpu {GPU} lost (fallen off the bus)"]
    gemm = node.probe("gemm", "bf16", GPU)
    assert gemm.value == 0.0 and "fallen off the bus" in gemm.error
    assert "fallen off the bus" in node.probe("nccl", "all_reduce", None).error
    assert node.probe("nccl", "all_reduce", None, ranks=[0, 1]).error == ""  # the others still work


def test_xid_48_counts_one_uncorrected_error_and_remaps_no_row() -> None:
    faulty, twin = twin_histories("xid_48")
    first, last, healthy = faulty[0][GPU], faulty[-1][GPU], twin[-1][GPU]
    assert [e.code for e in first.xid_events] == [48]
    assert last.xid_events == [] and [(c.code, c.total) for c in last.xid_counts] == [(48, 1)]
    assert last.ecc_uncorrected_volatile_total == (healthy.ecc_uncorrected_volatile_total or 0) + 1
    assert (last.row_remap_pending, last.row_remap_uncorrectable_total) == (False, 0)


def test_vbios_drift_changes_the_inventory_only() -> None:
    faulty, _ = node_and_clock([FaultSpec("vbios_drift", GPU)])
    twin, _ = node_and_clock()
    drifted, healthy = faulty.inventory(), twin.inventory()
    assert drifted.gpus[GPU].vbios_version != H100_SXM.vbios_version
    assert dataclasses.replace(drifted.gpus[GPU], vbios_version=H100_SXM.vbios_version) == healthy.gpus[GPU]
    assert drifted.gpus[:GPU] + drifted.gpus[GPU + 1 :] == healthy.gpus[:GPU] + healthy.gpus[GPU + 1 :]
