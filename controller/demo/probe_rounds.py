"""Probe rounds the demo has seen, read through the Operator API like any client.

A round is a probe run whose results reached the controller: every new newest-result time of a
node is one. A node's first round is the one asked for when it connected; later ones come from the
controller's scheduler (or from an operator's `gpufleet probe-node` during the demo).
"""

from __future__ import annotations

from protos.gpufleet.v1 import operator_pb2


class ProbeRounds:
    def __init__(self) -> None:
        self._seen: dict[str, set[int]] = {}  # node -> newest-result times (ns) observed

    def observe(self, detail: operator_pb2.NodeDetail) -> None:
        times = [p.time.ToNanoseconds() for p in detail.probes if p.HasField("time")]
        if times:
            self._seen.setdefault(detail.summary.name, set()).add(max(times))

    @property
    def total(self) -> int:
        return sum(len(times) for times in self._seen.values())

    @property
    def later(self) -> int:
        """Rounds after each node's first: the scheduler's (periodic) ones."""
        return sum(len(times) - 1 for times in self._seen.values())

    def as_dict(self) -> dict[str, int]:
        return {"total": self.total, "periodic": self.later, "nodes": len(self._seen)}
