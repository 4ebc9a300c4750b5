"""Values read out of each node's messages, kept until one of them is replaced
(controller/detect/per_node.py)."""

from __future__ import annotations

from controller.detect.per_node import per_node
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.hostsim import HostSimFleet


def test_a_node_is_read_again_only_after_a_source_is_replaced_or_the_context_changes() -> None:
    sim = HostSimFleet(4)
    sim.run(10)
    fleet = sim.fleet
    read: list[str] = []

    def load(node: NodeState) -> float:
        read.append(node.name)
        assert node.host is not None
        return node.host.load1

    def sources(node: NodeState) -> tuple[object, ...]:
        return (node.host,)

    first = per_node(fleet, "test", sources, load)
    assert read == sorted(fleet.nodes) and per_node(fleet, "test", sources, load) == first
    assert read == sorted(fleet.nodes)  # nothing replaced: nothing read
    node = fleet.nodes["node-02"]
    host = pb.HostSample()
    host.CopyFrom(node.host)  # type: ignore[arg-type]
    host.load1 += 1.0
    node.host = host
    assert per_node(fleet, "test", sources, load)["node-02"] == first["node-02"] + 1.0
    assert read[4:] == ["node-02"]
    per_node(fleet, "test", sources, load, context="other")
    assert read[5:] == sorted(fleet.nodes)
    del fleet.nodes["node-01"]
    per_node(fleet, "test", sources, load, context="other")
    assert sorted(fleet.derived["test"][1]) == ["node-00", "node-02", "node-03"]  # type: ignore[call-overload]


def test_an_equal_value_read_again_stays_the_object_kept_when_asked() -> None:
    sim = HostSimFleet(2)
    sim.run(10)
    fleet = sim.fleet

    def sources(node: NodeState) -> tuple[object, ...]:
        return (node.host,)

    def infiniband(node: NodeState) -> list[str]:
        assert node.host is not None
        return sorted(p.device for p in node.host.infiniband)

    first = per_node(fleet, "kept", sources, infiniband, keep_equal=True)
    plain = per_node(fleet, "plain", sources, infiniband)
    sim.step()  # new host samples, the same devices
    assert per_node(fleet, "kept", sources, infiniband, keep_equal=True)["node-00"] is first["node-00"]
    again = per_node(fleet, "plain", sources, infiniband)["node-00"]
    assert again == plain["node-00"] and again is not plain["node-00"]
