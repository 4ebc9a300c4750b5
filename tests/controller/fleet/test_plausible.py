"""Issue 15, bad input 8 (plausibility): a physically impossible reading is stored as missing,
counted per field on the controller's /metrics, and logged once per node and field; a probe result
with an impossible value is dropped and never becomes a baseline."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import generate_latest

from controller.app import ControllerApp
from controller.fleet.model import Fleet
from controller.fleet.plausible import Range, clear_implausible, probe_value_plausible, range_of
from controller.ingest import Ingest
from controller.metrics import controller_registry
from controller.store.store import Store
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import config

E = 1_700_000_000.0


def hello() -> pb.Hello:
    msg = pb.Hello(node="n1", boot_id="b1")
    msg.inventory.gpus.add(index=0, name="NVIDIA H100 80GB HBM3")
    return msg


def frame(seq: int, temperature: float = 60.0) -> pb.TelemetryFrame:
    msg = pb.TelemetryFrame(node="n1", boot_id="b1", seq=seq)
    msg.time.FromSeconds(int(E + 1000 + seq))
    msg.gpus.add(index=0, temperature_celsius=temperature, power_watts=400.0)
    return msg


def test_1e9_celsius_is_not_stored_and_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        store = Store(":memory:")
        await store.open()
        try:
            ingest = Ingest(Fleet(), store, clock=lambda: E + 5000.0)
            await ingest.hello(hello())
            await ingest.frame("n1", frame(1, temperature=1e9))
            await ingest.frame("n1", frame(2, temperature=-300.0))
            sample = ingest.fleet.nodes["n1"].gpus[0].sample
            assert not sample.HasField("temperature_celsius") and sample.power_watts == 400.0
            stored, _ = await store.load()
            assert not stored.nodes["n1"].gpus[0].sample.HasField("temperature_celsius")
            assert ingest.fleet.implausible == {"GpuSample.temperature_celsius": 2}
            await ingest.frame("n1", frame(3, temperature=61.0))  # a real reading is kept
            assert ingest.fleet.nodes["n1"].gpus[0].sample.temperature_celsius == 61.0
        finally:
            store.close()

    with caplog.at_level(logging.WARNING, logger="gpufleet.controller.ingest"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if "impossible" in r.getMessage()]
    assert lines == ["node n1: impossible GpuSample.temperature_celsius readings are stored as missing"]


def test_impossible_probe_results_are_dropped() -> None:
    async def go() -> Fleet:
        store = Store(":memory:")
        await store.open()
        try:
            ingest = Ingest(Fleet(), store, clock=lambda: E + 5000.0)
            await ingest.hello(hello())
            f = frame(1)
            f.probes.add(probe="gemm", variant="bf16", gpu=0, value=1e12, unit="TFLOP/s")
            f.probes.add(probe="gemm", variant="fp16", gpu=0, value=900.0, unit="TFLOP/s", peak_ratio=500.0)
            f.probes.add(probe="membw", variant="d2d", gpu=0, value=3000.0, unit="GB/s", peak_ratio=0.9)
            await ingest.frame("n1", f)
            return ingest.fleet
        finally:
            store.close()

    fleet = asyncio.run(go())
    assert list(fleet.probes) == [("n1", 0, "membw", "d2d")]
    assert fleet.implausible == {"ProbeResult.value": 2}


def test_the_counter_is_on_the_controller_registry() -> None:
    app = ControllerApp(config())
    app.fleet.implausible.update({"GpuSample.temperature_celsius": 3, "BmcFan.speed_rpm": 1})
    text = generate_latest(controller_registry(app)).decode()
    assert 'gpufleet_controller_readings_implausible_total{field="GpuSample.temperature_celsius"} 3.0' in text
    assert 'gpufleet_controller_readings_implausible_total{field="BmcFan.speed_rpm"} 1.0' in text


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("temperature_celsius", 150.0, True),
        ("temperature_celsius", 150.5, False),
        ("temperature_celsius", -41.0, False),
        ("power_watts", 4999.0, True),
        ("power_watts", 5001.0, False),
        ("power_watts", -1.0, False),
        ("sm_clock_hz", 9.9e9, True),
        ("sm_clock_hz", 1.1e10, False),
        ("gpu_utilization_ratio", 1.0, True),
        ("gpu_utilization_ratio", 1.5, False),
        ("fan_speed_ratio", -0.1, False),
        ("pcie_link_gen", 7, True),
        ("pcie_link_gen", 8, False),
        ("pcie_link_gen", 0, False),
        ("pcie_link_width", 32, True),
        ("pcie_link_width", 64, False),
    ],
)
def test_gpu_ranges(field: str, value: float, ok: bool) -> None:
    sample = pb.GpuSample(index=0)
    setattr(sample, field, value)
    cleared = clear_implausible(sample)
    assert (field in {f.name for f, _ in sample.ListFields()}) is ok
    assert cleared == ([] if ok else [f"GpuSample.{field}"])


def test_memory_within_total() -> None:
    sample = pb.GpuSample(
        index=0, memory_total_bytes=80 << 30, memory_used_bytes=90 << 30, memory_free_bytes=1
    )
    assert clear_implausible(sample) == ["GpuSample.memory_used_bytes"]
    assert sample.memory_free_bytes == 1 and not sample.HasField("memory_used_bytes")
    host = pb.HostSample(
        memory_total_bytes=100, memory_available_bytes=200, swap_total_bytes=0, swap_used_bytes=5
    )
    assert sorted(clear_implausible(host)) == [
        "HostSample.memory_available_bytes",
        "HostSample.swap_used_bytes",
    ]


def test_bmc_nested_readings() -> None:
    sample = bmc_pb2.BmcSample(power_consumed_watts=10_400.0)  # an 8-GPU node draws well over 5 kW
    sample.temperatures.add(name="Inlet", reading_celsius=1e9)
    sample.fans.add(name="Fan 1", speed_rpm=9000.0, speed_ratio=7.0)
    sample.power_supplies.add(name="PSU 1", input_watts=1e7)
    sample.gpus.add(index=0, power_watts=700.0, temperature_celsius=64.0)
    assert sorted(clear_implausible(sample)) == [
        "BmcFan.speed_ratio",
        "BmcPowerSupply.input_watts",
        "BmcTemperature.reading_celsius",
    ]
    assert sample.power_consumed_watts == 10_400.0 and sample.fans[0].speed_rpm == 9000.0


def test_probe_values() -> None:
    assert probe_value_plausible(pb.ProbeResult(value=990.0, unit="TFLOP/s", peak_ratio=1.0))
    assert not probe_value_plausible(pb.ProbeResult(value=990.0, unit="TFLOP/s", peak_ratio=101.0))
    assert not probe_value_plausible(pb.ProbeResult(value=2e6, unit="TFLOP/s"))
    assert probe_value_plausible(pb.ProbeResult(value=2e6, unit="widgets"))  # unknown unit: > 0 only
    assert not probe_value_plausible(pb.ProbeResult(value=0.0, unit="us"))


def test_range_lookup_prefers_exact_names_then_longest_suffix() -> None:
    assert range_of("power_consumed_watts") == Range(0.0, 200_000.0)
    assert range_of("power_watts") == Range(0.0, 5000.0)
    assert range_of("io_time_seconds_total") == Range(0.0)
    assert range_of("seq") is None and range_of("ecc_corrected_volatile_total") is None
