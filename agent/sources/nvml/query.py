"""How one NVML question is asked and what its answer means, without importing pynvml.

Functions and constants are named as strings and looked up on the module the source passes in, so
that a pynvml or driver without one reads as FUNCTION_NOT_FOUND (unsupported), never as an import
or attribute error. The catalogue of questions itself is in catalogue.py.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Called as call(nvml_module, *args) and returning pynvml's answer; Convert turns that answer into
# the values of a query's fields, in order; Unit turns one field value into its reading value.
Call = Callable[..., Any]
Convert = Callable[[Any], tuple[Any, ...]]
Unit = Callable[[Any], Any]

ALL_LINKS = 0xFFFFFFFF  # a field value's scope id meaning "summed over every NVLink" (UINT_MAX)


def integer(value: Any) -> int | None:
    return None if value is None else int(value)


def number(value: Any) -> float:
    return float(value)


def flag(value: Any) -> bool:
    return bool(value)


def hz(mhz: Any) -> float:
    return float(mhz) * 1e6


def milli(value: Any) -> float:
    # Division, not * 1e-3, so that 700000 mW reads exactly 700.0 W.
    return float(value) / 1000.0


def ratio(percent: Any) -> float:
    return float(percent) / 100.0


def kib(value: Any) -> int:
    return int(value) * 1024


def text(value: Any) -> str:
    """pynvml returns str from some versions and functions, bytes from others."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def one(unit: Unit) -> Convert:
    """The Convert of a single-field query: its answer through `unit`."""
    return lambda raw: (unit(raw),)


def one_integer(raw: Any) -> tuple[Any, ...]:
    """The default Convert: a single field's answer as an int."""
    return (integer(raw),)


def error_code(exc: BaseException) -> Any:
    return getattr(exc, "value", None)


def address(handle: Any) -> int:
    """A device handle's identity: the pointer NVML hands back in event data and takes in calls."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):  # not a ctypes pointer (a test double)
        return id(handle)


@dataclass(frozen=True, slots=True)
class Query:
    """One NVML question and the reading fields its answer fills.

    `field_ids` (NVML_FI_* names, one per field) are read in the GPU's one batched
    nvmlDeviceGetFieldValues per cycle, each through its `units`; `scope` is their scope id (an
    NVLink, or ALL_LINKS), None for none. `call` answers the query alone where it has no field ids,
    and stands in for them where the driver lacks them. A `slow` query's call is made only on slow
    cycles and its answer repeated in between; field values are read every cycle. A `counter`
    keeps its raw field value (a CounterSample) for the source to turn into a rate. `label` names
    the query in errors and in the per-GPU NOT_SUPPORTED memory; `prefix` is how its fields are
    named in GpuInfo.unsupported_fields ("nvlinks." for per-link fields).
    """

    label: str
    fields: tuple[str, ...]
    call: Call | None = None
    convert: Convert = one_integer
    field_ids: tuple[str, ...] = ()
    units: tuple[Unit, ...] = ()
    scope: int | None = None
    slow: bool = False
    counter: bool = False
    prefix: str = ""

    @property
    def unsupported_names(self) -> tuple[str, ...]:
        return tuple(self.prefix + f for f in self.fields)


def asked(field: str, call: Call, unit: Unit = integer, *, slow: bool = False, prefix: str = "") -> Query:
    """A single-field query answered by a call."""
    return Query(prefix + field, (field,), call, one(unit), slow=slow, prefix=prefix)


def field(
    name: str,
    field_id: str,
    unit: Unit = integer,
    *,
    fallback: Call | None = None,
    convert: Convert | None = None,
    scope: int | None = None,
    slow: bool = False,
    prefix: str = "",
) -> Query:
    """A single-field query read as a field value; `fallback` (through `convert`) where it is missing."""
    return Query(
        prefix + name,
        (name,),
        fallback,
        convert or one(unit),
        (field_id,),
        (unit,),
        scope,
        slow,
        prefix=prefix,
    )


@dataclass(frozen=True, slots=True)
class Fn:
    """Call the first of `names` that this pynvml and driver have, newest first.

    The NVML constants named in `consts` follow the caller's arguments. A function missing from
    both reads as FUNCTION_NOT_FOUND, which the source treats like NOT_SUPPORTED.
    """

    names: tuple[str, ...]
    consts: tuple[str, ...] = ()

    def __call__(self, nvml: Any, *args: Any) -> Any:
        missing: Exception = nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        for name in self.names:
            function = getattr(nvml, name, None)
            if function is None:
                continue
            consts = [getattr(nvml, c, None) for c in self.consts]
            if None in consts:
                break  # this pynvml predates a constant the call needs
            try:
                return function(*args, *consts)
            except nvml.NVMLError as exc:
                if error_code(exc) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                missing = exc
        raise missing


def fn(*names: str, consts: tuple[str, ...] = ()) -> Fn:
    return Fn(names, consts)


def versioned(nvml: Any, exc: BaseException) -> bool:
    """True when `exc` says a versioned call or struct is unknown to this driver: try the older one."""
    return error_code(exc) in (nvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
