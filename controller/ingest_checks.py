"""What ingest refuses before anything is stored: sequence numbers that would overflow the store or
take over an ack position, and times that cannot be right.

A refused frame is a RefusedFrame (INVALID_ARGUMENT, naming the frame): resending it can never
succeed, so the agent sets it aside and goes on with the next one.

Bounds, and why:
- MAX_SEQ = 2^48 for `seq` and `spool_floor_seq`: SQLite's INTEGER is signed 64-bit (2^63 - 1 and
  more overflow), and a frame a second reaches 2^48 after 8.9 million years.
- MAX_FLOOR_JUMP = 2^24 frames: how far one frame's `spool_floor_seq` may move its boot's position
  past the next expected frame. The floor jumps when the agent's spool was full and it dropped its
  oldest frames (it holds at most stream.spool_max_frames, 8640 by default: a day at 10 s), so the
  jump is the frames made during an outage, less what the spool kept: 2^24 is five years of frames at
  10 s, 194 days at 1 s. A forged floor beyond it cannot make every later real frame a "duplicate".
- Times (every google.protobuf.Timestamp in the message, and XID event times): not before
  2000-01-01T00:00:00Z, not more than limits.max_clock_skew_seconds after the controller's clock,
  nanos within 0..999,999,999. Out of range, they break RFC 3339 output (`-o json`) and ordering.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from controller.errors import InvalidMessage, RefusedFrame
from controller.fleet.repeated import each
from protos.gpufleet.v1 import telemetry_pb2 as pb

MAX_SEQ = 2**48
MAX_FLOOR_JUMP = 2**24
MAX_BOOT_ID = 128  # characters; the agent's boot ids are 32 hex digits
EARLIEST = 946_684_800  # 2000-01-01T00:00:00Z in Unix seconds
TIMESTAMP = "google.protobuf.Timestamp"
UNIX_SECONDS = "unix_time_seconds"  # a double field of this name is a time too (XidEvent)


def frame_id(frame: pb.TelemetryFrame) -> None:
    """Refuse a frame that names no boot, or a seq outside 1..MAX_SEQ (or a floor above it)."""
    if not frame.boot_id or len(frame.boot_id) > MAX_BOOT_ID:
        raise InvalidMessage(f"frame: boot_id must be 1..{MAX_BOOT_ID} characters")
    if not 1 <= frame.seq <= MAX_SEQ:
        raise RefusedFrame(f"frame: seq {frame.seq} is outside 1..2^48", frame.boot_id, frame.seq)
    if frame.spool_floor_seq > MAX_SEQ:
        raise RefusedFrame(
            f"frame {frame.seq}: spool_floor_seq {frame.spool_floor_seq} is above 2^48",
            frame.boot_id,
            frame.seq,
        )


def floor_jump(frame: pb.TelemetryFrame, acked: int) -> None:
    """Refuse a frame below its own spool floor, or a floor that moves the position too far."""
    floor = frame.spool_floor_seq
    if frame.seq < floor:
        raise RefusedFrame(
            f"frame {frame.seq} is below the agent's own spool floor {floor}", frame.boot_id, frame.seq
        )
    if floor - (acked + 1) > MAX_FLOOR_JUMP:
        raise RefusedFrame(
            f"frame {frame.seq}: spool floor {floor} skips {floor - acked - 1} frames after {acked} "
            f"(at most 2^24)",
            frame.boot_id,
            frame.seq,
        )


def frame_times(frame: pb.TelemetryFrame, now: float, max_skew: float) -> None:
    """Refuse a frame carrying a time before 2000 or more than max_skew seconds ahead of now."""
    problem = first_bad_time(frame, now, max_skew)
    if problem is not None:
        raise RefusedFrame(f"frame {frame.seq}: {problem}", frame.boot_id, frame.seq)


def hello_times(hello: pb.Hello, now: float, max_skew: float) -> None:
    problem = first_bad_time(hello, now, max_skew)
    if problem is not None:
        raise InvalidMessage(f"hello: {problem}")


def first_bad_time(msg: Message, now: float, max_skew: float) -> str | None:
    """'FIELD is WHY' for the first out-of-range time in `msg` (depth first), or None."""
    latest = now + max_skew
    if _checker(msg.DESCRIPTOR)(msg, latest):
        return None  # every time in range, as nearly every message's: no path named
    for path, seconds, nanos in _times(msg, ""):
        if not 0 <= nanos < 1_000_000_000:
            return f"{path} has nanos {nanos} (0..999999999)"
        if not math.isfinite(seconds) or seconds < EARLIEST:
            return f"{path} is before 2000-01-01 (unix {seconds})"
        if seconds + nanos / 1e9 > latest:
            return (
                f"{path} is {seconds + nanos / 1e9 - now:.0f} s ahead of the controller's clock "
                f"(limits.max_clock_skew_seconds: {max_skew:g})"
            )
    return None


def _times(msg: Message, prefix: str) -> Iterator[tuple[str, float, int]]:
    """(field path, seconds, nanos) of every time set in `msg` and the messages it holds."""
    for field in _time_fields(msg.DESCRIPTOR):
        if field.type == FieldDescriptor.TYPE_DOUBLE:
            yield f"{prefix}{field.name}", getattr(msg, field.name), 0
            continue
        if field.is_repeated:
            items = list(enumerate(getattr(msg, field.name)))
        elif msg.HasField(field.name):
            items = [(-1, getattr(msg, field.name))]
        else:
            continue
        for i, item in items:
            path = f"{prefix}{field.name}" + (f"[{i}]" if i >= 0 else "")
            if field.message_type is not None and field.message_type.full_name == TIMESTAMP:
                yield path, item.seconds, item.nanos
            else:
                yield from _times(item, f"{path}.")


TimesFine = Callable[[Message, float], bool]


@functools.cache
def _checker(desc: Descriptor) -> TimesFine:
    """Whether every time in a message of this type is in range (not after `latest`): the verdict
    of _times' walk, worked out per type once and read by field name, building no path. Ingest
    asks it of every frame and Hello; only a message it refuses is walked again for the words."""
    doubles, stamps, nested = [], [], []
    for field in _time_fields(desc):
        child = field.message_type
        if child is None:
            doubles.append(field.name)  # (a time field not a message is a double: _holds_time)
        elif child.full_name == TIMESTAMP:
            stamps.append((field.name, field.is_repeated))
        else:
            nested.append((field.name, field.is_repeated, child))

    def fine(stamp: Message, latest: float) -> bool:
        nanos = stamp.nanos  # type: ignore[attr-defined]
        seconds = stamp.seconds  # type: ignore[attr-defined]
        return bool(0 <= nanos < 1_000_000_000 and seconds >= EARLIEST and seconds + nanos / 1e9 <= latest)

    def check(msg: Message, latest: float) -> bool:
        for name in doubles:
            if not EARLIEST <= getattr(msg, name) <= latest:  # NaN and infinities fail too
                return False
        for name, repeated in stamps:
            if repeated:
                if not all(fine(stamp, latest) for stamp in each(getattr(msg, name))):
                    return False
            elif msg.HasField(name) and not fine(getattr(msg, name), latest):
                return False
        for name, repeated, child in nested:
            inner = _checker(child)
            if repeated:
                items = getattr(msg, name)
                if items and not all(inner(item, latest) for item in each(items)):
                    return False
            elif msg.HasField(name) and not inner(getattr(msg, name), latest):
                return False
        return True

    return check


@functools.cache
def _time_fields(desc: Descriptor) -> tuple[FieldDescriptor, ...]:
    """The fields of `desc` that are times or messages that may hold one (map entries aside)."""
    return tuple(field for field in desc.fields if _holds_time(field, frozenset()))


def _holds_time(field: FieldDescriptor, seen: frozenset[str]) -> bool:
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return field.name == UNIX_SECONDS and not field.is_repeated
    if field.type != FieldDescriptor.TYPE_MESSAGE or field.message_type is None:
        return False
    desc = field.message_type
    if desc.full_name == TIMESTAMP:
        return True
    if desc.GetOptions().map_entry or desc.full_name in seen:
        return False
    return any(_holds_time(f, seen | {desc.full_name}) for f in desc.fields)
