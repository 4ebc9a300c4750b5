"""A frame's own bytes inside the serialized AgentMessage that carries it, found without parsing: the
detection process then gets the frame as its agent sent it (controller/servicer.py, and an ingest
front's planner) rather than serialized again."""

from __future__ import annotations

FRAME_FIELD = 0x12  # AgentMessage.frame: field 2, length-delimited


def frame_bytes(message: bytes) -> bytes | None:
    """The TelemetryFrame's own bytes in a serialized AgentMessage that holds only it, in one piece
    (as agents send it); None otherwise."""
    if len(message) < 2 or message[0] != FRAME_FIELD:
        return None
    length, shift, position = 0, 0, 1
    while position < len(message) and shift < 64:
        byte = message[position]
        position += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return message[position:] if position + length == len(message) else None
    return None
