"""Physically impossible readings are not readings: each is cleared (stored as missing, like NaN) at
ingest, and counted per field by the caller.

The ranges are wide on purpose: they catch what no GPU, host or BMC can report (a broken sensor, a
unit error, a hostile node), never what an unusual but real machine does. A field is matched by its
name in the wire messages (protos/gpufleet/v1/telemetry.proto, bmc.proto): an exact name in RANGES
first, else the longest suffix in SUFFIX_RANGES. Labels are "Message.field".

| field (name or suffix)                      | range             | why                                    |
|---------------------------------------------|-------------------|----------------------------------------|
| *_celsius (GPU, HBM, BMC sensors, limits)   | -40 .. 150 °C     | silicon and boards shut down far below |
| *_watts (a GPU's power and limits)          | 0 .. 5000 W       | largest accelerator modules ~2.7 kW    |
| BmcSample.power_consumed_watts (a node)     | 0 .. 200 kW       | a rack-scale system as one node        |
| BmcPowerSupply input/output/capacity_watts  | 0 .. 20 kW        | one power supply                       |
| *_hz (clocks, CPU frequency)                | 0 .. 10 GHz       | 10000 MHz                              |
| *_ratio (utilisation, fan, activity)        | 0 .. 1 (+1%)      | 0..100 %, a little rounding allowed    |
| pcie_link_gen(_max) / pcie_link_width(_max) | 1 .. 7 / 1 .. 32  | PCIe 1.0-7.0, x1..x32                  |
| performance_state                           | 0 .. 32           | P0-P15, 32 = unknown                   |
| speed_rpm                                   | 0 .. 100000 rpm   | server fans spin below 40000           |
| rate_gbps (InfiniBand port)                 | 0 .. 10000 Gb/s   | XDR is 800 Gb/s                        |
| *_bytes_per_second                          | 0 .. 1e12 B/s     | 1 TB/s: beyond any PCIe link           |
| load1/load5/load15, *_seconds, *_total (f)  | >= 0              | never negative                         |
| memory used/free/reserved/available, swap   | <= the total      | the same message's *_total_bytes       |
| ProbeResult.peak_ratio                      | 0 .. 100          | 100x the datasheet peak                |
| ProbeResult.value                           | > 0, <= 100x peak | the whole result is dropped otherwise  |

ProbeResult.value: the controller holds no datasheet (the agent does: agent/probes/datasheet.yaml),
so "100x the model's peak" is read from the result's own peak_ratio where the agent knows the model,
and otherwise bounded per unit by 100x the fastest figure of any model (PROBE_CEILINGS).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from operator import attrgetter

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from controller.fleet.bounds_test import bounds_test
from controller.fleet.repeated import each
from protos.gpufleet.v1 import telemetry_pb2 as pb


@dataclass(frozen=True, slots=True)
class Range:
    low: float
    high: float = math.inf

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high


NON_NEGATIVE = Range(0.0)
RATIO = Range(0.0, 1.01)
RANGES: dict[str, Range] = {
    "power_consumed_watts": Range(0.0, 200_000.0),
    "input_watts": Range(0.0, 20_000.0),
    "output_watts": Range(0.0, 20_000.0),
    "capacity_watts": Range(0.0, 20_000.0),
    "pcie_link_gen": Range(1, 7),
    "pcie_link_gen_max": Range(1, 7),
    "pcie_link_width": Range(1, 32),
    "pcie_link_width_max": Range(1, 32),
    "performance_state": Range(0, 32),
    "speed_rpm": Range(0.0, 100_000.0),
    "rate_gbps": Range(0.0, 10_000.0),
    "peak_ratio": Range(0.0, 100.0),
    "load1": NON_NEGATIVE,
    "load5": NON_NEGATIVE,
    "load15": NON_NEGATIVE,
    "check_relative_error": NON_NEGATIVE,
    "unix_time_seconds": NON_NEGATIVE,
}
SUFFIX_RANGES: dict[str, Range] = {
    "_celsius": Range(-40.0, 150.0),
    "_watts": Range(0.0, 5000.0),
    "_hz": Range(0.0, 10e9),
    "_ratio": RATIO,
    "_bytes_per_second": Range(0.0, 1e12),
    "_seconds": NON_NEGATIVE,
    "_seconds_total": NON_NEGATIVE,
    "_joules_total": NON_NEGATIVE,
}
# Parts of a whole, within one message: (part, whole). A part above its whole is impossible.
WITHIN = (
    ("memory_used_bytes", "memory_total_bytes"),
    ("memory_free_bytes", "memory_total_bytes"),
    ("memory_reserved_bytes", "memory_total_bytes"),
    ("memory_available_bytes", "memory_total_bytes"),
    ("swap_used_bytes", "swap_total_bytes"),
    ("hugepages_free", "hugepages_total"),
)
# 100x the fastest datasheet figure of any model, per probe unit (B200/B300 dense FP4 is ~10 PFLOP/s,
# HBM3e 8 TB/s): a result above this is a unit error or a lie on any GPU.
PROBE_CEILINGS = {"TFLOP/s": 100 * 10_000.0, "GB/s": 100 * 10_000.0}
PEAK_RATIO_CEILING = 100.0
PROBE_VALUE = "ProbeResult.value"

_NUMBERS = frozenset(
    {
        FieldDescriptor.TYPE_DOUBLE,
        FieldDescriptor.TYPE_FLOAT,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
    }
)


_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


@cache
def range_of(name: str) -> Range | None:
    """The plausible range of a field named `name`, or None when any value is possible."""
    if name in RANGES:
        return RANGES[name]
    suffixes = [s for s in SUFFIX_RANGES if name.endswith(s)]
    return SUFFIX_RANGES[max(suffixes, key=len)] if suffixes else None


def clear_implausible(msg: Message) -> list[str]:
    """Clear every impossible reading of `msg` and its nested messages; return their labels
    ("GpuSample.temperature_celsius"), one per cleared value (NaN/Inf are cleared too, not listed)."""
    return screen(msg)[1]


def screen(msg: Message) -> tuple[list[str], list[str]]:
    """Clear each NaN/Inf float and each impossible reading of `msg` and its nested messages; return
    the labels of each ("GpuSample.gpm_dram_activity_ratio"), one per cleared value: (non-finite,
    impossible). Ingest's hot path: each message type's fields are known, so its check is worked out
    once (_screener) and reads the fields by name, rather than walking ListFields; nested types with
    nothing to screen (NvLinkSample, most of a frame's messages) are not visited."""
    non_finite: list[str] = []
    labels: list[str] = []
    _screener(msg.DESCRIPTOR)(msg, labels, non_finite)
    return non_finite, labels


Screener = Callable[[Message, list[str], list[str]], None]  # (message, impossible, non-finite)
Check = tuple[str, float, float, bool, bool]  # field, low, high, is a float, has presence
BULK_ITEMS = 8  # a repeated field with this many items is tested a column at a time first, if it can be
_FLOAT_MAX = sys.float_info.max


@cache
def _checks(descriptor: Descriptor) -> tuple[Check, ...]:
    """The bounds of each singular number field of a message type with a rule, in field order (a
    float's bounds are finite, so NaN and Inf fail them too)."""
    rules = _rules(descriptor)
    checks: list[Check] = []
    for field in sorted(descriptor.fields, key=lambda f: f.number):
        name = field.name
        is_float = name in rules.floats
        bounds = rules.ranges.get(name)
        if not is_float and bounds is None:
            continue
        low, high = (bounds.low, bounds.high) if bounds is not None else (-math.inf, math.inf)
        if is_float:
            low, high = max(low, -_FLOAT_MAX), min(high, _FLOAT_MAX)
        checks.append((name, low, high, is_float, field.has_presence))
    return tuple(checks)


@cache
def _screener(descriptor: Descriptor) -> Screener:
    """The check of one message type: every singular number field with a rule and every part of a
    whole read in one C call (attrgetter) and tested in one more, a test compiled for the type
    (bounds_test.py); only a message it fails is looked at field by field. A long repeated field of
    a type with checks alone (a host's CPUs: 224 on a DGX H100) is tested a column at a time first
    (_all_within)."""
    rules = _rules(descriptor)
    checks = _checks(descriptor)
    walks = [
        (f.name, f.is_repeated, f.message_type, _all_within(f.message_type) if f.is_repeated else None)
        for f in sorted(descriptor.fields, key=lambda f: f.number)
        if f.name in rules.walk and f.message_type is not None
    ]
    inners: list[Screener | None] = [None] * len(walks)  # each walked type's check, once first needed
    type_name = rules.type_name
    presence = {f.name: f.has_presence for f in descriptor.fields}
    # Parts of a whole: read with the checked fields, and a part's and its whole's presence asked
    # only when the part reads above the whole (an unset field reads 0, which is above no whole).
    within_names = tuple(dict.fromkeys(name for pair in rules.within for name in pair))
    within = tuple((part, whole, presence[part], presence[whole]) for part, whole in rules.within)
    read = _reader(tuple(c[0] for c in checks) + within_names)
    fine = _compiled(checks, rules.within, within_names)
    tested = bool(checks or within)

    def clear_one(msg: Message, rule: Check, value: float, labels: list[str], non_finite: list[str]) -> None:
        """Clear one value out of bounds unless unset (the default is no reading), and label it."""
        name, _, _, is_float, presence = rule
        if not (msg.HasField(name) if presence else value != 0):
            return
        msg.ClearField(name)
        (non_finite if is_float and not math.isfinite(value) else labels).append(f"{type_name}.{name}")

    def clear(msg: Message, values: tuple[float, ...], labels: list[str], non_finite: list[str]) -> None:
        for rule, value in zip(checks, values, strict=False):  # (the parts of a whole follow)
            if not rule[1] <= value <= rule[2]:
                clear_one(msg, rule, value, labels, non_finite)

    def clear_parts(msg: Message, labels: list[str]) -> None:
        amounts = dict(zip(within_names, _reader(within_names)(msg), strict=True))
        for part, whole, part_presence, whole_presence in within:
            if (
                amounts[part] > amounts[whole]
                and (not part_presence or msg.HasField(part))
                and (not whole_presence or msg.HasField(whole))
            ):
                msg.ClearField(part)
                labels.append(f"{type_name}.{part}")

    def check(msg: Message, labels: list[str], non_finite: list[str]) -> None:
        if tested:
            values = read(msg)
            if fine(values):
                values = ()  # nothing to clear: the parts of a whole need no second look
            else:
                clear(msg, values, labels, non_finite)
        for position, (name, repeated, child, all_within) in enumerate(walks):
            inner = inners[position]
            if inner is None:
                inner = inners[position] = _screener(child)
            if repeated:
                items = each(getattr(msg, name))  # each item wrapped once: for the columns, any look
                if all_within is not None and len(items) >= BULK_ITEMS and all_within(items):
                    continue
                for item in items:
                    inner(item, labels, non_finite)
            elif msg.HasField(name):
                inner(getattr(msg, name), labels, non_finite)
        if tested and values and within:
            clear_parts(msg, labels)  # read again: after any value cleared above

    return check


def _compiled(
    checks: tuple[Check, ...], within: tuple[tuple[str, str], ...], within_names: tuple[str, ...]
) -> Callable[[tuple[float, ...]], bool]:
    """The test of the values _screener reads (the checked fields', then the parts' and wholes')."""
    at = len(checks)
    return bounds_test(
        at + len(within_names),
        [(low, high, is_float) for _, low, high, is_float, _ in checks],
        [(at + within_names.index(part), at + within_names.index(whole)) for part, whole in within],
    )


def _all_within(descriptor: Descriptor) -> Callable[[Sequence[Message]], bool] | None:
    """For a repeated field of this type, a test that every item's every value is within its bounds,
    read a column (one field of every item) at a time: the floats' sum is finite only if each is (an
    overflow of finite values fails too, and is then looked at item by item), and then the column's
    least and greatest hold the bounds. None for a type with messages to walk or parts of a whole,
    or with nothing to check."""
    rules = _rules(descriptor)
    checks = _checks(descriptor)
    if rules.walk or rules.within or not checks:
        return None
    columns = tuple((attrgetter(name), low, high, is_float) for name, low, high, is_float, _ in checks)

    def all_within(items: Sequence[Message]) -> bool:
        for read, low, high, is_float in columns:
            column = list(map(read, items))
            if (is_float and not math.isfinite(sum(column))) or min(column) < low or max(column) > high:
                return False
        return True

    return all_within


def _reader(names: tuple[str, ...]) -> Callable[[Message], tuple[float, ...]]:
    """The values of these fields of a message, as a tuple, read in one call."""
    if len(names) >= 2:
        return attrgetter(*names)
    if names:
        one = names[0]
        return lambda msg: (getattr(msg, one),)
    return lambda msg: ()


@dataclass(frozen=True, slots=True)
class _Rules:
    """What screening a message type takes, worked out once per type."""

    type_name: str
    floats: frozenset[str]  # singular float/double fields: NaN and Inf are cleared
    ranges: dict[str, Range]  # ranged singular number fields
    within: tuple[tuple[str, str], ...]  # (part, whole) pairs
    walk: frozenset[str]  # message fields whose type has something to screen (map entries never)

    @property
    def needed(self) -> bool:
        return bool(self.floats or self.ranges or self.within or self.walk)


@cache
def _rules(descriptor: Descriptor) -> _Rules:
    ranges: dict[str, Range] = {}
    floats: set[str] = set()
    walk: set[str] = set()
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            child = field.message_type
            if child is not None and not child.GetOptions().map_entry and _needed(child):
                walk.add(field.name)
            continue
        if field.is_repeated:
            continue
        if field.type in _FLOATS:
            floats.add(field.name)
        bounds = range_of(field.name)
        if field.type in _NUMBERS and bounds is not None:
            ranges[field.name] = bounds
    names = set(descriptor.fields_by_name)
    within = tuple((part, whole) for part, whole in WITHIN if part in names and whole in names)
    return _Rules(descriptor.name, frozenset(floats), ranges, within, frozenset(walk))


_SEEN: set[str] = set()  # types whose need is being worked out (a recursive type needs no second look)


def _needed(descriptor: Descriptor) -> bool:
    """Whether a message type, or any type below it, has something to screen."""
    if descriptor.full_name in _SEEN:
        return True  # a recursive type, being worked out higher up: walk it (walking is always safe)
    _SEEN.add(descriptor.full_name)
    try:
        return _rules(descriptor).needed
    finally:
        _SEEN.discard(descriptor.full_name)


def probe_value_plausible(result: pb.ProbeResult) -> bool:
    """Whether a (finite) probe result can be real: positive, and not above 100x the peak."""
    if result.value <= 0:
        return False
    if result.HasField("peak_ratio") and result.peak_ratio > PEAK_RATIO_CEILING:
        return False
    ceiling = PROBE_CEILINGS.get(result.unit)
    return ceiling is None or result.value <= ceiling


def _present(msg: Message, name: str) -> bool:
    field = msg.DESCRIPTOR.fields_by_name[name]
    return msg.HasField(name) if field.has_presence else True
