"""The BMC section of `gpufleet node NAME`, rendered to text: a failed poll, a healthy one, odd values."""

from __future__ import annotations

import io

from rich.console import Console

from controller.cli.bmc_view import bmc_section
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import T0, bmc_sample


def render(bmc: bmc_pb2.BmcSample, gpus: list[pb.GpuSample] | None = None, now: float = T0) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(bmc_section(bmc, gpus or [], now=now))
    return [line.rstrip() for line in out.getvalue().splitlines()]


def test_a_poll_that_read_nothing_is_its_header_and_error_alone() -> None:
    bmc = bmc_pb2.BmcSample(
        endpoint="https://[fd00::12]",
        error="cannot connect: [Errno 111] Connection refused",
        poll_duration_seconds=5.04,
    )
    bmc.time.FromSeconds(int(T0 - 7200))
    bmc.sections.add(name="systems", success=False, error="unreachable")
    assert render(bmc) == [
        # brackets are text, not rich markup
        "BMC https://[fd00::12] polled 2027-01-15 06:00:00Z (2h ago, took 5.0s): "
        "failed: cannot connect: [Errno 111] Connection refused"
    ]


def test_a_healthy_poll_says_ok_and_names_nothing() -> None:
    bmc = bmc_sample(T0 - 90)
    bmc.success = True
    del bmc.sections[1]  # logs read this time
    bmc.fans[1].health = "ok"
    bmc.power_supplies[2].health = "ok"
    bmc.bios_pending.clear()
    del bmc.gpus[:]
    assert render(bmc) == [
        "BMC https://bmc-n1.example polled 2027-01-15 07:58:30Z (1m ago, took 1.4s): ok",
        "  system ok, chassis critical; power 5230 W; intake 24-26 C, exhaust 41 C",
        "  PSUs 3 ok; fans 2 ok",  # the empty bays are not counted
        "  BIOS 2.1.4, 0 pending BIOS settings; BMC firmware 7.10.30",
    ]


def test_missing_readings_and_unknown_health_show_as_such() -> None:
    bmc = bmc_pb2.BmcSample(endpoint="http://10.0.0.12", success=False)
    bmc.temperatures.add(name="Inlet", context="intake")  # no reading
    bmc.temperatures.add(name="Exhaust", context="exhaust", reading_celsius=40.6)
    bmc.temperatures.add(name="Exhaust 2", context="exhaust", reading_celsius=41.2)  # the same when rounded
    bmc.power_supplies.add(name="PSU 1")  # health not reported
    bmc.sections.add(name="thermal", success=True)
    bmc.sections.add(name="power", success=False, error="HTTP 404")
    bmc.sections.add(name="bios", success=False, error="timeout")
    bmc.gpus.add(index=3, power_watts=300.4)
    gpus = [pb.GpuSample(index=0, power_watts=100.0), pb.GpuSample(index=3, temperature_celsius=50.0)]
    lines = render(bmc, gpus)
    assert lines[:5] == [
        "BMC http://10.0.0.12: partial",  # no poll time: no age either
        "  system unknown, chassis unknown; power -; intake -, exhaust 41 C",
        "  PSUs 1, not ok: PSU 1 unknown; fans 0",
        "  BIOS -, 0 pending BIOS settings; BMC firmware -",
        "  failed sections: power, bios",
    ]
    rows = [line for line in lines if line.startswith("│")]
    assert [[c.strip() for c in row.strip("│").split("│")] for row in rows] == [
        ["3", "50", "-", "-", "300", "unknown"]  # only the GPUs the BMC maps
    ]
