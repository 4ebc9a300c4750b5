"""How the controller names the one frame it refuses for good, so the agent can set it aside.

A refusal of one frame (INVALID_ARGUMENT: a frame for another node, a forged sequence number, an
impossible time) ends the stream with trailing metadata `gpufleet-refused-frame: BOOT SEQ`. The
agent moves that frame out of its spool and reconnects at once; any other error is retried as
before. Both sides use these helpers: the key and the format live in one place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REFUSED_FRAME = "gpufleet-refused-frame"
# A boot id the agent can spool (agent/stream/spool.py) and a metadata value can carry unchanged.
_BOOT_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_VALUE = re.compile(r"^([A-Za-z0-9._-]{1,128}) ([0-9]{1,20})$")


def refused_frame_value(boot_id: str, seq: int) -> str | None:
    """The metadata value naming frame (boot_id, seq); None when the boot id cannot be carried."""
    if not _BOOT_ID.match(boot_id) or not 0 <= seq < 2**64:
        return None
    return f"{boot_id} {seq}"


def refused_frame(metadata: Iterable[Any] | None) -> tuple[str, int] | None:
    """The (boot_id, seq) a status's trailing metadata ((key, value) pairs) names as refused, or None."""
    for item in metadata or ():
        key, value = item
        if key != REFUSED_FRAME or not isinstance(value, str):
            continue
        match = _VALUE.match(value)
        if match is not None:
            return match.group(1), int(match.group(2))
    return None
