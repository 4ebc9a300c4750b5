"""Per-GPU tables: `gpufleet node NAME`'s latest readings and probe results, `gpufleet probe-node`'s run."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from controller.cli.layout import Cell, Col, make_table, plain
from controller.cli.tables import age
from protos.gpufleet.v1 import telemetry_pb2
from protos.names import clock_event_reason_names


def _fmt(sample: telemetry_pb2.GpuSample, field: str, scale: float = 1.0, digits: int = 0) -> str:
    if not sample.HasField(field):  # type: ignore[arg-type]
        return "-"
    return f"{getattr(sample, field) / scale:.{digits}f}"


def _pcie(g: telemetry_pb2.GpuSample) -> str:
    if not (g.HasField("pcie_link_gen") and g.HasField("pcie_link_width")):
        return "-"
    pcie = f"gen{g.pcie_link_gen} x{g.pcie_link_width}"
    if g.pcie_link_gen < g.pcie_link_gen_max or g.pcie_link_width < g.pcie_link_width_max:
        pcie += f" (max gen{g.pcie_link_gen_max} x{g.pcie_link_width_max})"
    return pcie


def _reasons(g: telemetry_pb2.GpuSample) -> str:
    return ", ".join(clock_event_reason_names(g.clock_event_reasons)) if g.clock_event_reasons else ""


# A probe result's `during` reading (its run's slowest busy moment, every busy reading's clock-event
# reasons OR-ed in): what the GPU ran at, drew and was held back by while it was measured.
DURING_COLUMNS = ("SM MHz", "POWER W", "TEMP C", "REASONS")


def _during(r: telemetry_pb2.ProbeResult) -> tuple[str, str, str, str]:
    if not r.HasField("during"):
        return ("-", "-", "-", "-")
    d = r.during
    return (
        _fmt(d, "sm_clock_hz", 1e6),
        _fmt(d, "power_watts"),
        _fmt(d, "temperature_celsius"),
        _reasons(d) or "-",
    )


def _remap(g: telemetry_pb2.GpuSample) -> str:
    if not g.HasField("row_remap_pending"):
        return "-"
    return "pending" if g.row_remap_pending else ("failed" if g.row_remap_failure else "ok")


def gpus_table(gpus: Sequence[telemetry_pb2.GpuSample], *, wide: bool = False) -> Table:
    columns = (
        Col("GPU", key=True),
        Col("UUID", drop=13, wide=True),
        Col("UTIL %", drop=10, wide=True),
        Col("SM MHz", drop=3),
        Col("MEM MHz", drop=6),
        Col("POWER W", drop=4),
        Col("LIMIT W", drop=5),
        Col("TEMP C", drop=2),
        Col("MEM TEMP C", drop=11, wide=True),
        Col("PSTATE", drop=12, wide=True),
        Col("PCIE", drop=7, wrap=True),
        Col("NVLINK", drop=8),
        Col("ROW REMAP", drop=9),
        Col("XID", drop=0),
        Col("REASONS", drop=1, wrap=True),
    )
    rows: list[Sequence[Cell]] = []
    for g in gpus:
        links = f"{sum(1 for link in g.nvlinks if link.active)}/{len(g.nvlinks)}" if g.nvlinks else "-"
        reasons = _reasons(g)
        util = _fmt(g, "gpu_utilization_ratio", 0.01)
        pstate = f"P{g.performance_state}" if g.HasField("performance_state") else "-"
        rows.append(
            (
                str(g.index),
                g.uuid or "-",
                util,
                _fmt(g, "sm_clock_hz", 1e6),
                _fmt(g, "memory_clock_hz", 1e6),
                _fmt(g, "power_watts"),
                _fmt(g, "enforced_power_limit_watts"),
                _fmt(g, "temperature_celsius"),
                _fmt(g, "memory_temperature_celsius"),
                pstate,
                _pcie(g),
                links,
                _remap(g),
                ", ".join(f"{c.code} x{c.total}" for c in g.xid_counts) or "-",
                reasons,
            )
        )
    return make_table("GPUs (latest readings)", columns, rows, wide=wide)


def _gpu(r: telemetry_pb2.ProbeResult) -> str:
    return str(r.gpu) if r.HasField("gpu") else "node"


def _check(r: telemetry_pb2.ProbeResult) -> str:
    if not r.HasField("check_passed"):
        return "-"
    check = "ok" if r.check_passed else "FAILED"
    if r.HasField("check_relative_error"):
        check += f" ({r.check_relative_error:.1e})"
    return check


def units_of(hello: telemetry_pb2.Hello) -> dict[str, str]:
    """Each offered probe's unit, as its ProbeInfo declares it."""
    return {i.name: i.unit for i in hello.probe_infos if i.unit}


def probes_offered(hello: telemetry_pb2.Hello) -> str:
    """One line: the probes the node offers, each with its unit, which way is better and its scope
    (from its ProbeInfo; an agent older than ProbeInfo gives names only)."""
    described = {i.name: i for i in hello.probe_infos}
    parts = []
    for name in [*hello.probes, *(n for n in described if n not in hello.probes)]:
        info = described.get(name)
        if info is None:
            parts.append(name)
            continue
        better = "higher is better" if info.higher_is_better else "lower is better"
        scope = "per node" if info.node_level else "per GPU"
        parts.append(f"{name} ({', '.join(x for x in (info.unit, better, scope) if x)})")
    return "probes: " + ", ".join(parts)


def probes_table(
    probes: Sequence[telemetry_pb2.ProbeResult], *, wide: bool = False, units: dict[str, str] | None = None
) -> Table:
    """The latest result per probe, variant and GPU; `units` (probe -> unit, from the node's
    ProbeInfos) names the unit where a result carries none."""
    columns = (
        Col("PROBE", key=True),
        Col("VARIANT", key=True),
        Col("GPU", key=True),
        Col("VALUE", drop=1, wrap=True),
        Col("PEAK", drop=2),
        Col("WHEN", drop=3),
        Col("MODE", drop=4, wide=True),
        Col("SECONDS", drop=5, wide=True),
        Col("CHECK", drop=6, wide=True),
        *(Col(name, drop=7 + i, wide=True, wrap=name == "REASONS") for i, name in enumerate(DURING_COLUMNS)),
    )
    rows: list[Sequence[Cell]] = []
    for p in probes:
        unit = p.unit or (units or {}).get(p.probe, "")
        value = plain(f"failed: {p.error}", style="red") if p.error else f"{p.value:.1f} {unit}".rstrip()
        peak = f"{p.peak_ratio:.0%}" if p.HasField("peak_ratio") else "-"
        mode = (p.mode or "-") + (" (simulated)" if p.simulated else "")
        when = age(p.time.seconds)
        rows.append(
            (
                p.probe,
                p.variant,
                _gpu(p),
                value,
                peak,
                when,
                mode,
                f"{p.duration_seconds:.1f}",
                _check(p),
                *_during(p),
            )
        )
    return make_table("Probe results (latest)", columns, rows, wide=wide)


def probe_run_table(results: Sequence[telemetry_pb2.ProbeResult], title: str, *, wide: bool = False) -> Table:
    """The results of one probe command (`gpufleet probe-node`), in the order the controller sends them."""
    columns = (
        Col("PROBE", key=True),
        Col("VARIANT", key=True),
        Col("GPU", key=True),
        Col("VALUE", justify="right", drop=1, wrap=True),
        Col("UNIT", drop=2),
        Col("PEAK", justify="right", drop=3),
        Col("MODE", drop=5),
        Col("CHECK", drop=4),
        Col("SECONDS", justify="right", drop=6, wide=True),
        Col("DEVICE", drop=7, wide=True),
        *(
            Col(
                name,
                justify="left" if name == "REASONS" else "right",
                drop=8 + i,
                wide=True,
                wrap=name == "REASONS",
            )
            for i, name in enumerate(DURING_COLUMNS)
        ),
    )
    rows: list[Sequence[Cell]] = []
    for r in results:
        value: Cell = (
            plain(f"failed: {r.error}", style="red", justify="left") if r.error else f"{r.value:.1f}"
        )
        rows.append(
            (
                r.probe,
                r.variant,
                _gpu(r),
                value,
                "" if r.error else r.unit,
                f"{r.peak_ratio:.0%}" if r.HasField("peak_ratio") and not r.error else "-",
                (r.mode or "-") + (" (simulated)" if r.simulated else ""),
                _check(r),
                f"{r.duration_seconds:.1f}",
                r.device or "-",
                *_during(r),
            )
        )
    return make_table(title, columns, rows, wide=wide)
