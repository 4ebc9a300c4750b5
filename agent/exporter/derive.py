"""Named derivations: metric values that are not one field scaled (catalogue.yaml `derive:`).

Each takes the rows of its metric's scope and yields (labels, value) pairs; the labels it adds to
the row's are declared beside it, so the catalogue's label lists can be checked at load time.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent import version
from protos.gpufleet.v1 import telemetry_pb2
from protos.names import clock_event_reason_names, enum_name, enum_names

if TYPE_CHECKING:
    from agent.exporter.view import ExportView, Labels, Row

Sample = tuple["Labels", float]

HEALTH = {"ok": 0.0, "warning": 1.0, "critical": 2.0}  # Redfish health, numeric everywhere
CLOCK_EVENT_REASONS: tuple[str, ...] = tuple(enum_names(telemetry_pb2.ClockEventReason))


@dataclass(frozen=True, slots=True)
class Derive:
    labels: tuple[str, ...]  # labels added to the row's
    fn: Callable[[ExportView, list[Row]], Iterable[Sample]]


def _per_row(
    value: Callable[[ExportView, Any], float | None],
) -> Callable[[ExportView, list[Row]], Iterable[Sample]]:
    def fn(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
        for labels, obj in rows:
            v = value(view, obj)
            if v is not None:
                yield labels, v

    return fn


def _info(**facts: Callable[[ExportView, Any], str]) -> Derive:
    """An info-style series (value 1) per row, the facts as labels."""

    def fn(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
        for labels, obj in rows:
            yield {**labels, **{k: f(view, obj) for k, f in facts.items()}}, 1.0

    return Derive(tuple(facts), fn)


def _clock_event_reasons(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
    """One series per reason the contract names (1 active, 0 not), plus any unnamed bit that is set."""
    for labels, reading in rows:
        bits = reading.clock_event_reasons
        if bits is None:
            continue
        active = clock_event_reason_names(bits)
        for reason in CLOCK_EVENT_REASONS:
            yield {**labels, "reason": reason}, 1.0 if reason in active else 0.0
        for reason in active:
            if reason not in CLOCK_EVENT_REASONS:
                yield {**labels, "reason": reason}, 1.0


def _xid_codes(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
    for labels, reading in rows:
        for count in reading.xid_counts:
            yield {**labels, "xid": str(count.code)}, float(count.total)


def _enum_state(label: str, enum: Any, attr: str) -> Derive:
    """1 on the current value of an enum field, named as protos.names names it."""

    def fn(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
        for labels, reading in rows:
            value = getattr(reading, attr)
            if not value:  # None (not read) or 0 (UNSPECIFIED)
                continue
            try:
                name = enum_name(enum, value)
            except ValueError:
                name = f"unknown_{value}"
            yield {**labels, label: name}, 1.0

    return Derive((label,), fn)


def _governor_cores(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
    for labels, host in rows:
        counts = collections.Counter(c.governor for c in host.cpus if c.governor)
        for governor in sorted(counts):
            yield {**labels, "governor": governor}, float(counts[governor])


def _transparent_hugepage(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
    for labels, host in rows:
        if host.transparent_hugepage:
            yield {**labels, "mode": host.transparent_hugepage}, 1.0


def _bmc_health(view: ExportView, rows: list[Row]) -> Iterable[Sample]:
    for labels, bmc in rows:
        for component, health in (("system", bmc.system_health), ("chassis", bmc.chassis_health)):
            if health in HEALTH:
                yield {**labels, "component": component}, HEALTH[health]


def _nvlink_bytes(view: ExportView, reading: Any) -> float | None:
    """Sent plus received; no sample unless both were read (NVML answers each field on its own).

    One direction alone would make the counter drop for one read and jump back the next: to
    rate() a reset and a spike of the whole count.
    """
    tx, rx = reading.nvlink_tx_bytes_total, reading.nvlink_rx_bytes_total
    return None if tx is None or rx is None else float(tx + rx)


def _facts(attr: str) -> Callable[[ExportView, Any], str]:
    return lambda view, facts: str(getattr(facts, attr) or "")


DERIVES: dict[str, Derive] = {
    "agent_info": _info(version=lambda view, _: version()),
    "gpu_info": _info(
        driver_version=lambda view, info: view.driver_version(info),
        vbios_version=_facts("vbios_version"),
        serial=_facts("serial"),
        board_part_number=_facts("board_part_number"),
    ),
    "host_info": _info(kernel=_facts("kernel"), os=_facts("os"), cpu_model=_facts("cpu_model")),
    "clock_event_reasons": Derive(("reason",), _clock_event_reasons),
    # The XID totals are since the agent started: present at 0 on a GPU that has had none.
    "xid_errors_total": Derive((), _per_row(lambda view, r: float(sum(c.total for c in r.xid_counts)))),
    "xid_code_errors_total": Derive(("xid",), _xid_codes),
    "xid_last_code": Derive((), _per_row(lambda view, r: float(view.xid_last.get(r.uuid, 0)))),
    "compute_mode": _enum_state("mode", telemetry_pb2.ComputeMode, "compute_mode"),
    "fabric_state": _enum_state("state", telemetry_pb2.FabricState, "fabric_state"),
    "compute_processes": Derive((), _per_row(lambda view, r: float(len(r.processes)))),
    "governor_cores": Derive(("governor",), _governor_cores),
    "transparent_hugepage": Derive(("mode",), _transparent_hugepage),
    "bmc_health": Derive(("component",), _bmc_health),
    "probe_success": Derive((), _per_row(lambda view, o: 0.0 if o.error else 1.0)),
    "nvlink_bytes_total": Derive((), _per_row(_nvlink_bytes)),
}
