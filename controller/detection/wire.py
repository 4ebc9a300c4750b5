"""The detection process's pipe: length-prefixed pickles, both ways. Only the controller and the
process it started read them (its own stdin and stdout), never anything from the network.

To the process: ("init", the fleet without its nodes, detect config, detector names), then its
nodes in slices, ("nodes", nodes, probe results, probe history, ack positions) (fleet_copy.py),
and the changes, in the order applied: ("hello", hello, acked, now),
("frame", node, FramePlan, frame bytes as screened), ("connected", node, bool), ("forget", names),
("adopt", StoredNodes, node -> when written) (replica_ingest), ("history", probe key -> Series as
stored) (after an adopt whose nodes had new probe results), ("pass", id, now, detector names or
None for all, merged).
From it: ("report", id, PassReport) or ("failed", id, why)."""

from __future__ import annotations

import pickle
from typing import IO, Any

HEADER = 4


def encode(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(HEADER, "big") + body


def decode(body: bytes) -> tuple[Any, ...]:
    message = pickle.loads(body)
    assert isinstance(message, tuple)
    return message


def read(stream: IO[bytes]) -> tuple[Any, ...] | None:
    """The next message from a blocking stream; None at its end."""
    header = stream.read(HEADER)
    if len(header) < HEADER:
        return None
    size = int.from_bytes(header, "big")
    body = stream.read(size)
    if len(body) < size:
        return None
    return decode(body)
