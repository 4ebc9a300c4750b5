"""The demo's count of probe rounds, from what GetNode returns."""

from __future__ import annotations

from controller.demo.probe_rounds import ProbeRounds
from protos.gpufleet.v1 import operator_pb2


def detail(node: str, *seconds: int) -> operator_pb2.NodeDetail:
    d = operator_pb2.NodeDetail(summary=operator_pb2.NodeSummary(name=node))
    for i, s in enumerate(seconds):
        d.probes.add(probe="gemm", variant="bf16", gpu=i).time.FromSeconds(s)
    return d


def test_each_new_newest_result_is_one_round_and_the_first_is_not_scheduled() -> None:
    rounds = ProbeRounds()
    rounds.observe(detail("a"))  # nothing probed yet
    assert rounds.as_dict() == {"total": 0, "periodic": 0, "nodes": 0}
    rounds.observe(detail("a", 100, 101))
    rounds.observe(detail("a", 100, 101))  # polled again before the next round: the same round
    rounds.observe(detail("b", 105))
    assert rounds.as_dict() == {"total": 2, "periodic": 0, "nodes": 2}
    rounds.observe(detail("a", 100, 130))  # a per-GPU round on GPU 1 only
    rounds.observe(detail("a", 160, 161))
    assert (rounds.total, rounds.later) == (4, 2)
