"""The detection process's pipe: length-prefixed pickles, both ways. Only the controller and the
process it started read them (its own stdin and stdout), never anything from the network.

To the process: ("init", the fleet without its nodes, detect config, detector names), then its
nodes in slices, ("nodes", nodes, probe results, probe history, ack positions) (fleet_copy.py),
and the changes, in the order applied: ("hello", hello, acked, now),
("frame", node, FramePlan, frame bytes as screened), ("connected", node, bool), ("forget", names),
("adopt", StoredNodes, node -> when written) (replica_ingest), ("history", probe key -> Series as
stored) (after an adopt whose nodes had new probe results), ("pass", id, now, detector names or
None for all, merged).
From it: ("report", id, PassReport) or ("failed", id, why).

A message of a TRAILING kind goes as parts(): its last element, bytes, follows its record as they are
(the pickle says how many), never copied into the pickle. A frame's 8-15 KB were copied four times on
the controller's event loop (into the pickle, behind its length, into the batch, into the pipe); now
once, into the pipe (bench/results/2026-12-02_ingest_in_server.txt)."""

from __future__ import annotations

import pickle
from typing import IO, Any

HEADER = 4
TRAILING = frozenset({"frame"})  # kinds whose last element, bytes, trails the record unpickled


def encode(message: tuple[Any, ...]) -> bytes:
    """One record: its pickle's length, then the pickle. Not for a TRAILING kind (parts())."""
    if message[0] in TRAILING:
        raise ValueError(f"a {message[0]!r} message goes as parts(), its bytes after its record")
    return _record(message)


def parts(message: tuple[Any, ...]) -> tuple[bytes, ...]:
    """What to write for `message`, in order: its record, then, for a TRAILING kind, its last
    element's bytes as they are (the record holds their length in its place)."""
    if message[0] not in TRAILING:
        return (_record(message),)
    data = message[-1]
    return _record((*message[:-1], len(data))), data


def _record(message: tuple[Any, ...]) -> bytes:
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
    message = decode(body)
    if message[0] in TRAILING:
        size = message[-1]
        data = stream.read(size)
        if len(data) < size:
            return None
        message = (*message[:-1], data)
    return message
