"""The protobuf JSON mapping of a recording's messages, made and read several times faster than
google.protobuf.json_format, with the same result: the same line, byte for byte, and the same message.

json_format walks every field in pure Python with the checks of every case the mapping allows: ~1.8
ms to write an 8-GPU frame's line and ~7 ms to read one back, on the recording workers' CPU
(controller/record_lines.py) and in `gpufleet analyze`. Here each message type's fields are looked up
once (a plan per descriptor, cached), the JSON text is made and read by the json module's C code,
and only the cases recordings hold are taken: scalars, enums, nested and repeated messages, maps
with string keys, Timestamps. Anything else (another well-known type, bytes, a value json_format
would quote differently or reject, a duplicate or unknown key, null, two members of a oneof) is
not guessed at: `Unsupported` is raised and the caller uses json_format, whose answer (a message, or
its error) is then the one given. tests/controller/test_record_json.py compares both over fuzzed
messages of every type a recording holds and over malformed lines.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

from google.protobuf import descriptor, json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

FD = descriptor.FieldDescriptor
Descriptor = Any  # a message type's descriptor (upb's or the pure-Python one)
TIMESTAMP = "google.protobuf.Timestamp"
_INT64 = frozenset({FD.CPPTYPE_INT64, FD.CPPTYPE_UINT64})
_INT32 = frozenset({FD.CPPTYPE_INT32, FD.CPPTYPE_UINT32})
# json_format's check for lone surrogates in strings (it refuses them)
_UNPAIRED_SURROGATE: re.Pattern[str] = json_format._UNPAIRED_SURROGATE_PATTERN  # type: ignore[attr-defined]
_NAN, _INFINITY, _NEG_INFINITY = "NaN", "Infinity", "-Infinity"
_SPECIAL_FLOATS = {_NAN: math.nan, _INFINITY: math.inf, _NEG_INFINITY: -math.inf}


M = TypeVar("M", bound=Message)


class Unsupported(Exception):
    """A case this module does not take: use json_format."""


# Field kinds
_INT32_KIND, _INT64_KIND, _DOUBLE, _BOOL, _STRING, _ENUM, _MESSAGE, _TIME, _OTHER = range(9)


# How a value is handled inline (the rest through _value_out and _value_in)
# (an int32 or uint32, a string, a bool are written as they are: _TRUTH and below)
_INT, _TEXT, _TRUTH, _FINITE, _NESTED, _OTHERWISE = range(6)
_HOW = {_INT32_KIND: _INT, _STRING: _TEXT, _BOOL: _TRUTH, _DOUBLE: _FINITE, _MESSAGE: _NESTED}


def _kind(field: Any) -> int:
    cpp = field.cpp_type
    if cpp in _INT32:
        return _INT32_KIND
    if cpp in _INT64:
        return _INT64_KIND
    if cpp == FD.CPPTYPE_FLOAT:
        return _OTHER  # json_format writes its shortest float32 form; the recordings' types have none
    if cpp == FD.CPPTYPE_DOUBLE:
        return _DOUBLE
    if cpp == FD.CPPTYPE_BOOL:
        return _BOOL
    if cpp == FD.CPPTYPE_STRING:
        return _STRING if field.type == FD.TYPE_STRING else _OTHER  # bytes: json_format's
    if cpp == FD.CPPTYPE_ENUM:
        return _ENUM
    full_name = field.message_type.full_name
    if full_name == TIMESTAMP:
        return _TIME
    if full_name.startswith("google.protobuf."):
        return _OTHER  # the other well-known types have mappings of their own
    return _MESSAGE


class _Field:
    """What writing and reading one field needs, worked out once."""

    __slots__ = (
        "enum_names",
        "enum_numbers",
        "how",
        "key_is_string",
        "kind",
        "mapped",
        "name",
        "oneof",
        "repeated",
    )

    def __init__(self, field: Any) -> None:
        self.name = field.name
        self.oneof = field.containing_oneof.name if field.containing_oneof is not None else None
        self.mapped: _Field | None = None  # a map field: its value field
        self.key_is_string = False
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            self.kind = _MESSAGE
            self.repeated = False
            self.key_is_string = message.fields_by_name["key"].cpp_type == FD.CPPTYPE_STRING
            self.mapped = _Field(message.fields_by_name["value"])
        else:
            self.kind = _kind(field)
            self.repeated = field.is_repeated
        self.how = _HOW.get(self.kind, _OTHERWISE) if self.mapped is None else _OTHERWISE
        self.enum_names: dict[int, str] = {}
        self.enum_numbers: dict[str, int] = {}
        if self.kind == _ENUM:
            values = field.enum_type.values
            self.enum_names = {v.number: v.name for v in values}
            self.enum_numbers = {v.name: v.number for v in values}


class _Plan:
    """A message type's fields: by descriptor (writing) and by JSON key (reading: the field's name
    and its JSON name both)."""

    __slots__ = ("by_field", "by_key")

    def __init__(self, message: Descriptor) -> None:
        fields = {field: _Field(field) for field in message.fields}
        self.by_field = {field.number: plan for field, plan in fields.items()}
        self.by_key: dict[str, tuple[_Field, Descriptor | None]] = {}
        for attribute in ("name", "json_name"):  # a JSON name first, as json_format looks them up
            for field, plan in fields.items():
                sub = field.message_type
                if plan.mapped is not None:
                    sub = field.message_type.fields_by_name["value"].message_type
                self.by_key[getattr(field, attribute)] = (plan, sub)


_PLANS: dict[Descriptor, _Plan] = {}


def _plan(message: Descriptor) -> _Plan:
    plan = _PLANS.get(message)
    if plan is None:
        plan = _PLANS[message] = _Plan(message)
    return plan


# Writing


def to_json(msg: Message) -> str:
    """json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=None); Unsupported for
    what this module does not take."""
    return json.dumps(_to_object(msg), indent=None, sort_keys=False, ensure_ascii=True)


def _to_object(msg: Message) -> dict[str, Any]:
    fields = _plan(msg.DESCRIPTOR).by_field
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        plan = fields[field.number]
        how = plan.how
        if plan.repeated:
            if how <= _TRUTH:
                out[plan.name] = list(value)
            elif how == _NESTED:
                out[plan.name] = [_to_object(item) for item in value]
            else:
                out[plan.name] = [_value_out(plan, item) for item in value]
        elif how <= _TRUTH or (how == _FINITE and value - value == 0.0):  # a double not NaN nor infinite
            out[plan.name] = value
        elif how == _NESTED:
            out[plan.name] = _to_object(value)
        elif plan.mapped is not None:
            out[plan.name] = {_map_key(key): _value_out(plan.mapped, value[key]) for key in value}
        else:
            out[plan.name] = _value_out(plan, value)
    return out


def _map_key(key: object) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _value_out(plan: _Field, value: Any) -> Any:
    kind = plan.kind
    if kind == _DOUBLE:
        if math.isnan(value):
            return _NAN
        if value in (math.inf, -math.inf):
            return _INFINITY if value > 0 else _NEG_INFINITY
        return value
    if kind in (_INT32_KIND, _STRING):
        return value
    if kind == _INT64_KIND:
        return str(value)
    if kind == _MESSAGE:
        return _to_object(value)
    if kind == _BOOL:
        return bool(value)
    if kind == _ENUM:
        name = plan.enum_names.get(value)
        if name is None:
            raise Unsupported("an enum number without a name")
        return name
    if kind == _TIME:
        return value.ToJsonString()
    raise Unsupported(f"field {plan.name}")


# Reading


def from_json(text: str, message_class: type[M]) -> M:
    """json_format.Parse(text, message_class()); Unsupported for what this module does not take
    (which includes every line json_format would refuse)."""
    try:
        js = json.loads(text, object_pairs_hook=_unique)
    except ValueError as exc:
        raise Unsupported("not JSON") from exc
    if type(js) is not dict:
        raise Unsupported("not an object")
    kwargs = _arguments(_plan(message_class.DESCRIPTOR), js)
    try:
        return message_class(**kwargs)
    except (ValueError, TypeError) as exc:  # a value out of its field's range
        raise Unsupported(str(exc)) from exc


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise Unsupported("a duplicate key")
    return out


def _arguments(plan: _Plan, js: dict[str, Any]) -> dict[str, Any]:
    """A message's constructor arguments (nested messages as dicts of theirs)."""
    kwargs: dict[str, Any] = {}
    oneofs: set[str] = set()
    by_key = plan.by_key
    for key, value in js.items():
        found = by_key.get(key)
        if found is None or value is None:
            raise Unsupported(f"field {key}")
        field, sub = found
        name, how, kind_of = field.name, field.how, type(value)
        if name in kwargs:
            raise Unsupported(f"field {key} twice")
        if field.oneof is not None:
            if field.oneof in oneofs:
                raise Unsupported(f"oneof {field.oneof} twice")
            oneofs.add(field.oneof)
        if field.repeated:
            if kind_of is not list:
                raise Unsupported(f"repeated {key}")
            kwargs[name] = [_value_in(field, sub, item) for item in value]
        elif (
            (how == _FINITE and kind_of is float and value - value == 0.0)
            or (how == _INT and kind_of is int)
            or (how == _TEXT and kind_of is str and value.isascii())
        ):
            kwargs[name] = value
        elif how == _NESTED and kind_of is dict:
            kwargs[name] = _arguments(_plan(sub), value)
        elif field.mapped is not None:
            if kind_of is not dict or not field.key_is_string:
                raise Unsupported(f"map {key}")
            if any(map(_has_surrogate, value)):
                raise Unsupported(f"map {key}'s keys")
            mapped = field.mapped
            kwargs[name] = {k: _value_in(mapped, sub, v) for k, v in value.items()}
        else:
            kwargs[name] = _value_in(field, sub, value)
    return kwargs


def _has_surrogate(text: str) -> bool:
    return not text.isascii() and _UNPAIRED_SURROGATE.search(text) is not None


def _value_in(field: _Field, sub: Descriptor | None, value: Any) -> Any:
    kind, kind_of = field.kind, type(value)
    if kind == _DOUBLE:
        if kind_of is float:
            if not math.isfinite(value):
                raise Unsupported("a bare non-finite number")
        elif kind_of is int:
            try:
                value = float(value)
            except OverflowError as exc:
                raise Unsupported("out of a double's range") from exc
        elif kind_of is str and value in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value]
        else:
            raise Unsupported(f"float {value!r}")
        return value
    if kind in (_INT32_KIND, _INT64_KIND):
        if kind_of is int:
            return value
        if (
            kind_of is str
            and value.isascii()
            and (value.isdigit() or (value[:1] == "-" and value[1:].isdigit()))
        ):
            return int(value)
        raise Unsupported(f"integer {value!r}")
    if kind == _STRING:
        if kind_of is not str or _has_surrogate(value):
            raise Unsupported("string")
        return value
    if kind == _MESSAGE:
        if kind_of is not dict or sub is None:
            raise Unsupported("message")
        return _arguments(_plan(sub), value)
    if kind == _BOOL:
        if kind_of is not bool:
            raise Unsupported("bool")
        return value
    if kind == _ENUM:
        number = field.enum_numbers.get(value) if kind_of is str else None
        if number is None:
            raise Unsupported(f"enum {value!r}")
        return number
    if kind == _TIME:
        if kind_of is not str:
            raise Unsupported("timestamp")
        stamp = Timestamp()
        try:
            stamp.FromJsonString(value)
        except ValueError as exc:
            raise Unsupported("timestamp") from exc
        return {"seconds": stamp.seconds, "nanos": stamp.nanos}
    raise Unsupported(f"field {field.name}")


__all__ = ["Unsupported", "from_json", "to_json"]
