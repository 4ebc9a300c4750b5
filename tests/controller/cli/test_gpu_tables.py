"""controller/cli/gpu_tables.py: a probe result's `during` reading in the wide tables."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from controller.cli import gpu_tables
from protos.gpufleet.v1 import telemetry_pb2 as pb


def rendered(table: Table) -> list[list[str]]:
    """The table's rows (header first) as stripped cells."""
    out = io.StringIO()
    Console(file=out, width=400).print(table)
    lines = [line for line in out.getvalue().splitlines() if line.startswith(("┃", "│"))]
    return [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]] for line in lines]


def results() -> list[pb.ProbeResult]:
    held = pb.ProbeResult(probe="gemm", variant="bf16", gpu=0, value=672.4, unit="TFLOP/s")
    held.during.sm_clock_hz, held.during.power_watts, held.during.temperature_celsius = 1449e6, 691.8, 58.0
    held.during.clock_event_reasons = pb.CLOCK_EVENT_REASON_SW_POWER_CAP | pb.CLOCK_EVENT_REASON_HW_SLOWDOWN
    unread = pb.ProbeResult(probe="membw", variant="d2d", gpu=0, value=4234.0, unit="GB/s")
    return [held, unread]


def test_wide_tables_show_what_the_gpu_ran_at_while_measured() -> None:
    for table in (
        gpu_tables.probes_table(results(), wide=True),
        gpu_tables.probe_run_table(results(), "Probe results of n1", wide=True),
    ):
        header, held, unread = rendered(table)
        assert header[-4:] == ["SM MHz", "POWER W", "TEMP C", "REASONS"]
        assert held[-4:] == ["1449", "692", "58", "sw_power_cap, hw_slowdown"]
        assert unread[-4:] == ["-", "-", "-", "-"]  # no reading during the run: said, not blank


def test_narrow_tables_leave_the_reading_out() -> None:
    header, *_ = rendered(gpu_tables.probes_table(results()))
    assert not {"SM MHz", "POWER W", "REASONS"} & set(header)
