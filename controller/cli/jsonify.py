"""Contract messages -> plain JSON-ready dicts, stable for scripts.

Unlike protobuf's own JSON mapping, 64-bit integers stay numbers, enums are the lower-case names
the CLI uses everywhere ("thermal_throttle", "critical"; UNSPECIFIED is null), optional fields
that are unset are left out, timestamps are RFC 3339 in UTC, and NaN/Inf become null (JSON has
neither).
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from protos.gpufleet.v1 import findings_pb2

TIMESTAMP = "google.protobuf.Timestamp"


def _enum(desc: EnumDescriptor, number: int) -> str | int | None:
    if number == 0:
        return None
    value = desc.values_by_number.get(number)
    if value is None:
        return number  # newer than this CLI: keep the number rather than lose it
    prefix = desc.values[0].name.removesuffix("UNSPECIFIED")
    return value.name.removeprefix(prefix).lower()


def _scalar(field: Any, value: Any) -> Any:  # a FieldDescriptor (upb or pure-Python)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_to_dict(value)
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        return _enum(field.enum_type, value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return value.hex()
    return value


def message_to_dict(msg: Message) -> Any:
    """A message as a dict (a Timestamp as its RFC 3339 string)."""
    desc = msg.DESCRIPTOR
    if desc.full_name == TIMESTAMP:
        return msg.ToJsonString()  # type: ignore[attr-defined]
    out: dict[str, Any] = {}
    for field in desc.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v) for v in value]
        elif field.has_presence and not msg.HasField(field.name):
            continue
        else:
            out[field.name] = _scalar(field, value)
    return out


def finding_to_dict(f: findings_pb2.Finding) -> dict[str, Any]:
    """A finding as `gpufleet findings -o json` prints it: gpu is null for node-level findings."""
    fields: dict[str, Any] = message_to_dict(f)
    fields.pop("gpu", None)
    out = {"id": f.id, "node": f.node, "gpu": f.gpu if f.HasField("gpu") else None}
    out.update(fields)  # cause and severity as message_to_dict names them (a newer value: its number)
    return out
