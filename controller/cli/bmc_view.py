"""The BMC (Redfish) section of `gpufleet node NAME`: a few summary lines, and BMC beside NVML per GPU.

Everything is built as rich Text, never markup: endpoints and BMC error messages may hold brackets
(and control characters: what the BMC said goes through `plain`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from controller.cli.layout import plain
from controller.cli.tables import age
from protos.gpufleet.v1 import bmc_pb2, telemetry_pb2

HEALTH_STYLE = {"ok": "green", "warning": "yellow", "critical": "bold red"}


def _health(value: str) -> Text:
    shown = value or "unknown"
    return plain(shown, style=HEALTH_STYLE.get(shown, "dim"))


def _number(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.0f} {unit}"


def _span(readings: Sequence[float], unit: str) -> str:
    """One reading as is; several (one per chassis or zone) as their range."""
    if not readings:
        return "-"
    low, high = min(readings), max(readings)
    return f"{low:.0f} {unit}" if round(low) == round(high) else f"{low:.0f}-{high:.0f} {unit}"


def _temperatures(bmc: bmc_pb2.BmcSample, context: str) -> str:
    sensors = [t for t in bmc.temperatures if t.context == context]
    return _span([t.reading_celsius for t in sensors if t.HasField("reading_celsius")], "C")


def _parts(items: Iterable[bmc_pb2.BmcPowerSupply | bmc_pb2.BmcFan], label: str) -> Text:
    """ "PSUs 6 ok", or "PSUs 6, not ok: PSU 3 critical" naming each present part not reported ok."""
    present = [p for p in items if p.state != "absent"]  # an empty bay is not a failed part
    bad = [p for p in present if p.health != "ok"]
    line = Text(f"{label} {len(present)}")
    if not bad:
        return line.append(" ok" if present else "")
    line.append(", not ok: ")
    for i, part in enumerate(bad):
        line.append(", " if i else "").append_text(plain(f"{part.name} ")).append_text(_health(part.health))
    return line


def _header(bmc: bmc_pb2.BmcSample, now: float | None) -> Text:
    line = plain(f"BMC {bmc.endpoint or '-'}", style="bold")
    if bmc.HasField("time"):
        polled = datetime.fromtimestamp(bmc.time.seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        line.append(f" polled {polled} ({age(bmc.time.seconds, now)}, took {bmc.poll_duration_seconds:.1f}s)")
    line.append(": ")
    if bmc.success:
        return line.append("ok", style="green")
    if bmc.error:
        return line.append_text(plain(f"failed: {bmc.error}", style="red"))
    return line.append("partial", style="yellow")  # some sections failed: named below


def _summary(bmc: bmc_pb2.BmcSample) -> list[Text]:
    health = Text("  system ").append_text(_health(bmc.system_health))
    health.append(", chassis ").append_text(_health(bmc.chassis_health))
    power = bmc.power_consumed_watts if bmc.HasField("power_consumed_watts") else None
    health.append(f"; power {_number(power, 'W')}")
    health.append(f"; intake {_temperatures(bmc, 'intake')}, exhaust {_temperatures(bmc, 'exhaust')}")
    parts = Text("  ").append_text(_parts(bmc.power_supplies, "PSUs"))
    parts.append("; ").append_text(_parts(bmc.fans, "fans"))
    pending = len(bmc.bios_pending)
    firmware = plain(f"  BIOS {bmc.bios_version or '-'}, ")
    plural = "" if pending == 1 else "s"
    firmware.append(f"{pending} pending BIOS setting{plural}", style="yellow" if pending else "")
    firmware.append_text(plain(f"; BMC firmware {bmc.bmc_firmware_version or '-'}"))
    return [health, parts, firmware]


def _gpus_table(bmc: bmc_pb2.BmcSample, gpus: Sequence[telemetry_pb2.GpuSample]) -> Table:
    nvml = {g.index: g for g in gpus}
    table = Table(title="GPUs, NVML beside BMC", title_justify="left")
    for column in ("GPU", "NVML TEMP C", "BMC TEMP C", "NVML POWER W", "BMC POWER W", "BMC HEALTH"):
        table.add_column(column)
    for b in sorted(bmc.gpus, key=lambda g: g.index):
        g = nvml.get(b.index)
        table.add_row(
            str(b.index),
            _reading(g, "temperature_celsius"),
            _reading(b, "temperature_celsius"),
            _reading(g, "power_watts"),
            _reading(b, "power_watts"),
            _health(b.health),
        )
    return table


def _reading(msg: telemetry_pb2.GpuSample | bmc_pb2.BmcGpu | None, field: str) -> str:
    if msg is None or not msg.HasField(field):  # type: ignore[arg-type]
        return "-"
    return f"{getattr(msg, field):.0f}"


def bmc_section(
    bmc: bmc_pb2.BmcSample, gpus: Sequence[telemetry_pb2.GpuSample], now: float | None = None
) -> RenderableType:
    """The node's latest BMC poll in a few lines; per GPU the BMC maps, its readings beside NVML's.

    A poll that read nothing (unreachable, refused) is its header line alone.
    """
    lines: list[RenderableType] = [_header(bmc, now)]
    if bmc.error and not any(s.success for s in bmc.sections):
        return Group(*lines)
    lines.extend(_summary(bmc))
    failed = [s.name for s in bmc.sections if not s.success]
    if failed:
        lines.append(Text("  failed sections: ").append_text(plain(", ".join(failed), style="red")))
    if bmc.gpus:
        lines.append(_gpus_table(bmc, gpus))
    return Group(*lines)
