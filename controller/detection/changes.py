"""The fleet's changes as messages to detection processes (wire.py), in the order the controller
applied them: one process (process.py) writes each to its pipe, a pool (pool.py) encodes each once
for all of its processes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.fleet.model import ProbeKey
from controller.fleet.series import Series
from controller.fleet.state import FramePlan
from controller.store.stored_nodes import StoredNodes
from protos.gpufleet.v1 import telemetry_pb2 as pb


class FleetChanges:
    def _send(self, message: tuple[object, ...]) -> None:
        raise NotImplementedError

    def hello(self, hello: pb.Hello, acked: int, now: float) -> None:
        self._send(("hello", hello, acked, now))

    def frame(self, node: str, plan: FramePlan, frame: bytes) -> None:
        """An applied frame: its plan and its bytes as screened (the process builds the same write
        from them: far less to encode and decode than the write itself, pickled)."""
        self._send(("frame", node, plan, frame))

    def connected(self, node: str, connected: bool) -> None:
        self._send(("connected", node, connected))

    def forget(self, names: Sequence[str]) -> None:
        self._send(("forget", list(names)))

    def adopt(self, stored: StoredNodes, heard: Mapping[str, float]) -> None:
        """Nodes another replica ingests, their rows as stored (controller/fleet/adopt.py)."""
        self._send(("adopt", stored, dict(heard)))

    def history(self, history: Mapping[ProbeKey, Series]) -> None:
        """Those nodes' probe history as stored (adopt.adopt_history), after their rows."""
        self._send(("history", dict(history)))
