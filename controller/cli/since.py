"""`--since D` of the operator commands: a duration back from now or an ISO date/time."""

from __future__ import annotations

import re
import sys
import time
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from controller.cli.layout import clean

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """A duration back from now (30m, 2h, 3d, 1w) or an ISO date/time (UTC unless it says otherwise).
    A duration back past 1970 is 1970: nothing is older (it was a Timestamp out of range). A time
    still to come is kept: the controller's clock, not this machine's, says what is past."""
    text = text.strip()
    now = time.time() if now is None else now
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text)
    if match:
        return max(0.0, now - float(match[1]) * UNITS[match[2]])
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since must be a duration (30m, 2h, 3d) or an ISO date/time, not {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def set_since(timestamp: Timestamp, text: str) -> bool:
    """Set `timestamp` from a --since value; False, with one line on stderr, when it does not parse
    (the command then exits 2)."""
    try:
        timestamp.FromNanoseconds(int(parse_since(text) * 1e9))
    except ValueError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return False
    return True
