"""The pipe between the controller and its ingest fronts (front.py): one record per message, both
ways, `size kind stream payload` (size counts kind, stream and payload). Only the controller and
the processes it started read them (the front's stdin and stdout), never anything from the network:
the network's bytes travel inside MSG payloads and are parsed by the controller as any stream's,
except frames a front planned (PLANNED), which it parsed and checked as the controller would.

Front -> controller:
    READY   stream 0, payload the port the front bound (decimal)
    OPEN    a new agent stream: pickled (peer, auth context); the agent's messages follow
    MSG     one AgentMessage, its bytes as received
    PLANNED one frame the front planned (planner.py): pickled (FramePlan, the frame's bytes as screened)
    END     the agent's side ended: empty when it half-closed, else why (cancelled, reset)
Controller -> front:
    INIT    stream 0, pickled FrontSettings
    ACCEPT  the Hello was accepted: send the stream's initial metadata; payload the node's pickled
            PlanState to plan its frames from (planner.py), or empty: relay them unplanned
    SEND    one ControllerMessage, serialized
    CLOSE   end the stream: pickled (status code value, details, trailing metadata); 0 is OK
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from controller.config import TlsConfig

HEAD = struct.Struct(">IBI")  # size, kind, stream
READY, OPEN, MSG, END, PLANNED = 1, 2, 3, 4, 5
INIT, ACCEPT, SEND, CLOSE = 11, 12, 13, 14
OK = grpc.StatusCode.OK.value[0]


@dataclass(frozen=True)
class FrontSettings:
    """What a front needs to serve agents as the controller would on `listen`."""

    listen: str  # HOST:PORT; every front after the first binds the first's port (SO_REUSEPORT)
    options: list[tuple[str, int]]  # the controller's gRPC server options (controller/server.py)
    tls: TlsConfig | None  # mutual TLS as on `listen`; None: plaintext
    high_water: int = 4 * 1024 * 1024  # bytes waiting for the controller before reads pause
    operators: str = ""  # the operators' address (operator_listen as bound), told to operators here


def record(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return HEAD.pack(len(payload) + 5, kind, stream) + payload


def pickled(kind: int, stream: int, value: Any) -> bytes:
    return record(kind, stream, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def unpickled(payload: bytes) -> Any:
    return pickle.loads(payload)


def close_record(stream: int, code: grpc.StatusCode, details: str, metadata: Any = ()) -> bytes:
    return pickled(CLOSE, stream, (code.value[0], details, tuple(metadata or ())))


def status_code(value: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN


class Records:
    """Splits a byte stream into records, calling on_record(kind, stream, payload) for each whole one.
    hold() stops the calls (what arrives is kept) until release()."""

    def __init__(self, on_record: Callable[[int, int, bytes], None]) -> None:
        self.on_record = on_record
        self.held = False
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data
        self._dispatch()

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        self.held = False
        self._dispatch()

    def _dispatch(self) -> None:
        buffer = self._buffer
        offset, size_of = 0, len(buffer)
        while not self.held and size_of - offset >= HEAD.size:
            size, kind, stream = HEAD.unpack_from(buffer, offset)
            end = offset + 4 + size
            if end > size_of:
                break
            self.on_record(kind, stream, bytes(buffer[offset + HEAD.size : end]))
            offset = end
        if offset:
            del buffer[:offset]
