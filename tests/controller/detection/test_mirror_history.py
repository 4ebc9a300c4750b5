"""The detection process takes in the probe history a leader read for nodes another replica ingests
("history", after their "adopt"), as the leader's own fleet does (fleet/adopt.py adopt_history)."""

from __future__ import annotations

from controller.detection.wire import HEADER, decode, encode
from controller.detection.worker import Mirror
from controller.fleet.model import NodeState
from controller.fleet.series import Series
from protos.gpufleet.v1 import telemetry_pb2 as pb


def test_the_process_takes_a_keys_stored_history_through_its_pipe() -> None:
    mirror = Mirror()
    mirror.fleet.nodes["n1"] = NodeState("n1", pb.Hello(node="n1", boot_id="b1"), 0.0, 0.0)
    key = ("n1", 0, "gemm", "bf16")
    mirror.fleet.history[key] = Series([(100.0, 700.0)])  # the newest result, as adopt took it in
    version = mirror.fleet.probe_version
    sent = encode(("history", {key: Series([(80.0, 690.0), (90.0, 695.0), (100.0, 700.0)])}))
    assert mirror.handle(decode(sent[HEADER:])) is None
    assert list(mirror.fleet.history[key]) == [(80.0, 690.0), (90.0, 695.0), (100.0, 700.0)]
    assert mirror.fleet.probe_version > version
