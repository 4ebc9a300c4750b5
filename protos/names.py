"""Names for the contract's enums, as the CLI, configs and JSON spell them.

Enum values are written in lower case without their type prefix: `Cause.CAUSE_THERMAL_THROTTLE`
is "thermal_throttle", `Severity.SEVERITY_CRITICAL` is "critical". Both agent and controller use
these so a name means the same on both sides of the wire.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from protos.gpufleet.v1 import findings_pb2, operator_pb2, telemetry_pb2

# A node's name: 1 to this many characters, a DNS name's limit, as Kubernetes node names are. The
# controller refuses a Hello with a longer one; the agent refuses it in its config, at start.
MAX_NODE_NAME = 253


def _prefix(enum: Any) -> str:
    return str(enum.DESCRIPTOR.values[0].name).removesuffix("UNSPECIFIED")


def enum_name(enum: Any, value: int) -> str:
    """Lower-case name of an enum value without its prefix; "" for the UNSPECIFIED value."""
    if value == 0:
        return ""
    return str(enum.Name(value)).removeprefix(_prefix(enum)).lower()


def enum_value(enum: Any, name: str) -> int:
    """Inverse of enum_name; ValueError naming the valid choices for an unknown name."""
    full = _prefix(enum) + name.upper()
    if not name or full not in enum.keys():  # noqa: SIM118 - EnumTypeWrapper has no __contains__
        raise ValueError(f"unknown {enum.DESCRIPTOR.name} {name!r}; expected one of {enum_names(enum)}")
    return int(enum.Value(full))


def enum_names(enum: Any) -> list[str]:
    """Every name but UNSPECIFIED, in declaration order."""
    return [enum_name(enum, v.number) for v in enum.DESCRIPTOR.values if v.number != 0]


def cause_name(value: int) -> str:
    return enum_name(findings_pb2.Cause, value)


def cause_value(name: str) -> int:
    return enum_value(findings_pb2.Cause, name)


CAUSES: tuple[str, ...] = tuple(enum_names(findings_pb2.Cause))


def severity_name(value: int) -> str:
    return enum_name(findings_pb2.Severity, value)


def severity_value(name: str) -> int:
    return enum_value(findings_pb2.Severity, name)


def health_name(value: int) -> str:
    return enum_name(operator_pb2.NodeHealth, value)


_REASON_BITS: tuple[tuple[int, str], ...] = tuple(
    (v.number, enum_name(telemetry_pb2.ClockEventReason, v.number))
    for v in telemetry_pb2.ClockEventReason.DESCRIPTOR.values
    if v.number != 0
)


def clock_event_reason_names(bits: int) -> list[str]:
    """Decode an NVML clock-event reasons bitmask into names such as "hw_thermal_slowdown".

    Bits the contract does not name are reported as "bit_0x...", so nothing is silently dropped.
    """
    return list(_reason_names(bits))


@lru_cache(maxsize=1024)
def _reason_names(bits: int) -> tuple[str, ...]:
    """clock_event_reason_names, worked out once per bitmask (every GPU of every frame asks; a
    fleet shows a handful of masks)."""
    names = [name for bit, name in _REASON_BITS if bits & bit]
    unknown = bits & ~sum(bit for bit, _ in _REASON_BITS)
    bit = 1
    while unknown:
        if unknown & bit:
            names.append(f"bit_{bit:#x}")
            unknown &= ~bit
        bit <<= 1
    return tuple(names)


def clock_event_reason_bit(name: str) -> int:
    """The bit of one reason name; ValueError for an unknown name."""
    return enum_value(telemetry_pb2.ClockEventReason, name)
