"""The simulated BMC: a complete sample that agrees with the node's GPUs, varies like a real chassis,
and never disturbs the node it reads (the agent polls it beside the sampling thread)."""

from __future__ import annotations

import dataclasses
import statistics
import threading

import pytest

from agent.sources.bmc import SECTIONS, BmcSample, BmcSource, BmcTemperature
from agent.sources.gpu import GpuReading
from agent.sources.sim import SimNode
from agent.sources.sim.bmc import SimBmc
from agent.stream import frames
from protos.gpufleet.v1 import bmc_pb2

START = 1_800_000_000.0


def _node(
    name: str = "n1", *, seed: int = 0, load: float = 0.95, gpus: int = 8, at: float = START
) -> SimNode:
    return SimNode(name, seed=seed, load=load, gpus=gpus, clock=lambda: at)


def _poll(node: SimNode, seed: int = 0) -> BmcSample:
    return SimBmc(node, seed=seed).poll(node.inventory().gpus)


def _temps(sample: BmcSample, context: str) -> list[BmcTemperature]:
    return [t for t in sample.temperatures if t.context == context]


def _reading(sample: BmcSample, context: str) -> float:
    (sensor,) = _temps(sample, context)
    assert sensor.reading_celsius is not None
    return sensor.reading_celsius


def test_every_section_succeeds_and_the_sample_is_complete() -> None:
    node = _node()
    bmc: BmcSource = SimBmc(node)
    sample = bmc.poll()
    assert bmc.endpoint == sample.endpoint == "sim://n1"
    assert sample.success and sample.error == "" and sample.time == START
    assert [s.name for s in sample.sections] == list(SECTIONS)
    assert all(s.success and s.error == "" and 0 < s.duration_seconds < 1 for s in sample.sections)
    assert sum(s.duration_seconds for s in sample.sections) < sample.poll_duration_seconds < 3
    assert (sample.auth, sample.requests) == ("", 0)
    assert all(
        (sample.manufacturer, sample.model, sample.serial, sample.bios_version, sample.bmc_firmware_version)
    )
    assert (sample.system_health, sample.chassis_health, sample.power_supply_redundancy_health) == ("ok",) * 3
    assert 10 <= len(sample.bios_attributes) <= 20
    assert all(isinstance(v, str) and v for v in sample.bios_attributes.values())
    assert sample.bios_pending == {} and sample.bios_apply_times == ["OnReset"]
    assert len(sample.log_entries) <= 5 and all(e.severity == "ok" for e in sample.log_entries)
    firmware = {f.id: f.version for f in sample.firmware}
    assert {"BMC_0", "BIOS_0", "CPLD_0"} <= firmware.keys()
    assert firmware["BMC_0"] == sample.bmc_firmware_version and firmware["BIOS_0"] == sample.bios_version
    for info in node.inventory().gpus:
        assert firmware[f"HGX_FW_GPU_SXM_{info.index + 1}"] == info.vbios_version
    bmc.close()  # nothing to release, and it must not raise


def test_healthy_sensors_sit_below_their_thresholds() -> None:
    sample = _poll(_node(seed=4))
    counts = {ctx: len(_temps(sample, ctx)) for ctx in ("intake", "exhaust", "cpu", "memory", "gpu")}
    assert counts["intake"] == counts["exhaust"] == 1 and counts["cpu"] == 2 and counts["memory"] >= 4
    assert counts["gpu"] == 8 and sum(counts.values()) == len(sample.temperatures)
    for t in sample.temperatures:
        assert t.reading_celsius is not None and t.upper_caution_celsius is not None
        assert t.upper_caution_celsius < (t.upper_critical_celsius or 0) < (t.upper_fatal_celsius or 0)
        assert t.reading_celsius < t.upper_caution_celsius, t
        assert (t.health, t.state) == ("ok", "enabled") and t.chassis and t.source.endswith(t.name)
    assert 6 <= len(sample.fans) <= 12 and all(f.health == "ok" for f in sample.fans)
    assert [(p.health, p.capacity_watts) for p in sample.power_supplies] == [("ok", 3000.0)] * 6


@pytest.mark.parametrize(("seed", "load"), [(0, 0.95), (5, 0.95), (5, 0.0), (9, 0.5)])
def test_each_gpu_board_reads_what_its_gpu_shows(seed: int, load: float) -> None:
    node = _node(seed=seed, load=load)
    reads = [node.read() for _ in range(21)]  # the median steps over the node's rare power spikes
    sample = _poll(node, seed)
    infos = node.inventory().gpus
    assert [g.index for g in sample.gpus] == [i.index for i in infos]
    gpu_sensors = {t.chassis: t.reading_celsius for t in _temps(sample, "gpu")}
    for board, info in zip(sample.gpus, infos, strict=True):
        assert board.chassis == f"HGX_GPU_SXM_{info.index + 1}" and board.matched_by == "serial"
        assert board.serial == info.serial and f"GPU-{board.uuid}" == info.uuid and board.health == "ok"
        assert board.temperature_celsius is not None and board.memory_temperature_celsius is not None
        assert board.power_watts is not None
        power = statistics.median(r[info.index].power_watts or 0.0 for r in reads)
        temp = statistics.median(r[info.index].temperature_celsius or 0.0 for r in reads)
        assert abs(board.power_watts - power) / power < 0.05, (board, power)
        assert abs(board.temperature_celsius - temp) <= 3.0, (board, temp)
        assert 1.0 <= board.memory_temperature_celsius - board.temperature_celsius <= 8.0
        assert gpu_sensors[board.chassis] == board.temperature_celsius


def test_boards_take_the_callers_gpu_indices_by_serial() -> None:
    node = _node()
    infos = node.inventory().gpus
    # NVML's order need not be slot order: the caller's index wins where the serial matches.
    swapped = [dataclasses.replace(i, index=len(infos) - 1 - i.index) for i in infos]
    sample = SimBmc(node).poll(swapped)
    assert [(g.serial, g.index) for g in sample.gpus] == [(i.serial, i.index) for i in swapped]
    strangers = [dataclasses.replace(i, serial=f"X{i.index}") for i in infos]
    assert {g.matched_by for g in SimBmc(node).poll(strangers).gpus} == {"index"}


def test_exhaust_and_fans_rise_with_the_load() -> None:
    idle, loaded = _poll(_node(load=0.0)), _poll(_node(load=0.95))
    for sample in (idle, loaded):
        assert _reading(sample, "exhaust") > _reading(sample, "intake") + 3
        gpu_watts = sum(g.power_watts or 0.0 for g in sample.gpus)
        host = (sample.power_consumed_watts or 0.0) - gpu_watts
        assert 1000 < host < 2200, host  # CPUs, memory, NICs, NVSwitches, board, fans
    assert abs(_reading(idle, "intake") - _reading(loaded, "intake")) < 1.0
    assert _reading(loaded, "exhaust") > _reading(idle, "exhaust") + 2
    assert (loaded.power_consumed_watts or 0.0) > (idle.power_consumed_watts or 0.0) + 3000
    for cold, hot in zip(idle.fans, loaded.fans, strict=True):
        assert (cold.speed_rpm or 0.0) < (hot.speed_rpm or 0.0) and (cold.speed_ratio or 0.0) < (
            hot.speed_ratio or 1.0
        )
    for cold_cpu, hot_cpu in zip(_temps(idle, "cpu"), _temps(loaded, "cpu"), strict=True):
        assert (cold_cpu.reading_celsius or 0.0) < (hot_cpu.reading_celsius or 0.0)


def test_intake_follows_the_nodes_diurnal_inlet() -> None:
    day = START - START % 86400
    warm, cool = day + 21600, day + 64800  # the peak and the trough of the daily swing
    for at in (warm, cool):
        node = _node(at=at)
        assert abs(_reading(_poll(node), "intake") - node.inlet_celsius(at)) < 1.0
    assert _reading(_poll(_node(at=warm)), "intake") - _reading(_poll(_node(at=cool)), "intake") > 4


def test_psus_share_the_consumed_power() -> None:
    sample = _poll(_node(seed=7))
    outputs = [p.output_watts or 0.0 for p in sample.power_supplies]
    consumed = sample.power_consumed_watts or 0.0
    assert abs(sum(outputs) - consumed) / consumed < 0.015
    assert max(outputs) / min(outputs) < 1.2 and len(set(outputs)) == len(outputs)  # shared, not evenly
    for psu in sample.power_supplies:
        assert psu.input_watts is not None and psu.output_watts is not None
        assert 0.90 < psu.output_watts / psu.input_watts < 0.97
        assert psu.model and psu.serial and psu.firmware_version and psu.state == "enabled"
    assert sample.power_supply_redundancy_mode


def test_same_seed_same_sample_and_other_nodes_differ() -> None:
    a, b = _poll(_node("n1", seed=3), 3), _poll(_node("n1", seed=3), 3)
    assert a == b
    other = _poll(_node("n2", seed=3), 3)
    assert a.serial != other.serial
    assert not {g.serial for g in a.gpus} & {g.serial for g in other.gpus}
    assert not {p.serial for p in a.power_supplies} & {p.serial for p in other.power_supplies}
    assert [t.reading_celsius for t in a.temperatures] != [t.reading_celsius for t in other.temperatures]


def test_readings_vary_from_poll_to_poll() -> None:
    t = [START]
    node = SimNode("n1", clock=lambda: t[0])
    bmc = SimBmc(node)
    first = bmc.poll()
    t[0] += 60.0
    second = bmc.poll()
    assert [f.speed_rpm for f in first.fans] != [f.speed_rpm for f in second.fans]
    assert [p.output_watts for p in first.power_supplies] != [p.output_watts for p in second.power_supplies]
    assert first.firmware == second.firmware and first.bios_attributes == second.bios_attributes


def _reads(
    node: SimNode, t: list[float], count: int, between: SimBmc | None = None
) -> list[list[GpuReading]]:
    out = []
    for _ in range(count):
        t[0] += 10.0
        out.append(node.read())
        if between is not None:
            between.poll(node.inventory().gpus)
    return out


def test_polls_between_reads_leave_the_node_readings_alone() -> None:
    t = [START]
    polled, quiet = SimNode("n1", seed=2, clock=lambda: t[0]), SimNode("n1", seed=2, clock=lambda: t[0])
    got = _reads(polled, t, 50, between=SimBmc(polled))
    t[0] = START
    assert got == _reads(quiet, t, 50)


def test_polling_from_another_thread_leaves_the_node_readings_alone() -> None:
    t = [START]
    polled, quiet = SimNode("n1", seed=2, clock=lambda: t[0]), SimNode("n1", seed=2, clock=lambda: t[0])
    bmc, polls, started, stop = SimBmc(polled), [0], threading.Event(), threading.Event()

    def poller() -> None:
        while not stop.is_set():
            bmc.poll(polled.inventory().gpus)
            polls[0] += 1
            started.set()

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    try:
        assert started.wait(5)
        before = polls[0]
        got = _reads(polled, t, 300)
        during = polls[0] - before
    finally:
        stop.set()
        thread.join(5)
    assert during > 0, "the poller never ran while the node was read"
    t[0] = START
    assert got == _reads(quiet, t, 300)


def test_a_node_of_any_gpu_count() -> None:
    node = _node(gpus=4)
    sample = _poll(node)
    assert [g.index for g in sample.gpus] == [0, 1, 2, 3] and len(_temps(sample, "gpu")) == 4
    assert sum(f.id.startswith("HGX_FW_GPU_SXM_") for f in sample.firmware) == 4


def test_failed_fans_and_psus_show_where_a_real_bmc_shows_them() -> None:
    node = _node(seed=1)
    bmc = SimBmc(node)
    healthy = bmc.poll()
    bmc.condition.failed_fans.add(2)
    bmc.condition.failed_psus.add(0)
    broken = bmc.poll()  # same moment, same sensor noise: only the condition differs
    assert (broken.fans[2].speed_rpm, broken.fans[2].health) == (0.0, "critical")
    assert [f.speed_rpm for i, f in enumerate(broken.fans) if i != 2] == [
        f.speed_rpm for i, f in enumerate(healthy.fans) if i != 2
    ]
    assert _reading(broken, "exhaust") > _reading(healthy, "exhaust")  # less air through the chassis
    psu = broken.power_supplies[0]
    assert (psu.output_watts, psu.input_watts, psu.health) == (0.0, 0.0, "critical")
    outputs = sum(p.output_watts or 0.0 for p in broken.power_supplies)
    assert abs(outputs - (broken.power_consumed_watts or 0.0)) / outputs < 0.015  # the rest carry it
    assert broken.power_supply_redundancy_health == "warning" and broken.chassis_health == "critical"


def test_the_sample_converts_to_the_wire_message() -> None:
    sample = _poll(_node(seed=6))
    msg = bmc_pb2.BmcSample()
    frames.fill(msg, dataclasses.replace(sample, time=None))  # type: ignore[arg-type]
    assert [s.name for s in msg.sections] == list(SECTIONS) and all(s.success for s in msg.sections)
    assert msg.endpoint == "sim://n1" and msg.success and msg.serial == sample.serial
    assert msg.HasField("power_consumed_watts") and msg.power_consumed_watts == sample.power_consumed_watts
    assert dict(msg.bios_attributes) == sample.bios_attributes and list(msg.bios_apply_times) == ["OnReset"]
    assert [(g.index, g.serial, g.matched_by) for g in msg.gpus] == [
        (g.index, g.serial, g.matched_by) for g in sample.gpus
    ]
    assert [t.reading_celsius for t in msg.temperatures] == [t.reading_celsius for t in sample.temperatures]
    assert [p.output_watts for p in msg.power_supplies] == [p.output_watts for p in sample.power_supplies]
    assert [f.speed_rpm for f in msg.fans] == [f.speed_rpm for f in sample.fans]
    assert [f.version for f in msg.firmware] == [f.version for f in sample.firmware]
    assert msg.log_entries[0].message_id == sample.log_entries[0].message_id
