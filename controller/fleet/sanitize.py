"""NaN and infinity are not readings: they are cleared (stored as missing) at ingest."""

from __future__ import annotations

import math

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def clear_non_finite(msg: Message) -> int:
    """Clear every NaN/Inf float field of `msg` and its nested messages; return how many were cleared.

    A non-optional float can't be "unset" in proto3, so it is zeroed; the wire marks every reading
    `optional`, so in practice readings become absent.
    """
    cleared = 0
    for field, value in msg.ListFields():
        if field.type in _FLOATS and not field.is_repeated:
            if not math.isfinite(value):
                msg.ClearField(field.name)
                cleared += 1
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                continue
            items = value if field.is_repeated else [value]
            cleared += sum(clear_non_finite(item) for item in items)
    return cleared
