"""Operators' free text on a request (an action's reason, an ack's or a silence's comment): at most
MAX_OPERATOR_TEXT characters. It is stored and shown again and again: in the audit log, on every
ListNodes page (a node's maintenance comment), on findings (an ack's), silences and drains' records.
Unbounded, one pasted log of 4 MB (gRPC's message limit) went into each of those."""

from __future__ import annotations

from functools import cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from controller.errors import InvalidMessage

MAX_OPERATOR_TEXT = 1024  # characters
TEXT_FIELDS = frozenset({"reason", "comment"})


def check_operator_text(request: object) -> None:
    """InvalidMessage when a request's reason or comment is longer than MAX_OPERATOR_TEXT."""
    if not isinstance(request, Message):
        return
    for name in _text_fields(request.DESCRIPTOR):
        length = len(getattr(request, name))
        if length > MAX_OPERATOR_TEXT:
            raise InvalidMessage(f"{name} is {length} characters long; at most {MAX_OPERATOR_TEXT}")


@cache
def _text_fields(descriptor: Descriptor) -> tuple[str, ...]:
    return tuple(
        f.name
        for f in descriptor.fields
        if f.name in TEXT_FIELDS and f.type == FieldDescriptor.TYPE_STRING and not f.is_repeated
    )
