"""The fleet's names in order, kept between calls (controller/fleet/node_order.py): always what a
sort of the fleet's nodes gives, through Hellos of new nodes, expiry, a replica's adoption and the
detection process's copy; sorted again only when the fleet's members change."""

from __future__ import annotations

from controller.detection.fleet_copy import install, slice_message
from controller.fleet.adopt import adopt
from controller.fleet.expiry import forget
from controller.fleet.model import Fleet, FrameWrite
from controller.fleet.node_order import names_after, node_names
from controller.fleet.state import apply_frame, apply_hello
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import T0


def hello(fleet: Fleet, name: str) -> None:
    apply_hello(fleet, pb.Hello(node=name, boot_id="b1"), 0, T0)


def fleet_of(*names: str) -> Fleet:
    fleet = Fleet()
    for name in names:
        hello(fleet, name)
    return fleet


def test_pages_are_bisects_of_the_sorted_names() -> None:
    fleet = fleet_of("n3", "n1", "n4", "n2")
    assert node_names(fleet) == ["n1", "n2", "n3", "n4"]
    assert names_after(fleet, None, 2) == ["n1", "n2"]
    assert names_after(fleet, "n2", 2) == ["n3", "n4"]
    assert names_after(fleet, "n25", 5) == ["n3", "n4"]  # a token's node since forgotten: the next on
    assert names_after(fleet, "n4", 2) == []


def test_sorted_once_while_the_members_stand() -> None:
    fleet = fleet_of("n2", "n1")
    first = node_names(fleet)
    hello(fleet, "n1")  # a known node's Hello again: same members
    write = FrameWrite("n2", "b1", 1, T0 + 1)
    apply_frame(fleet, write)
    assert node_names(fleet) is first


def test_every_change_of_members_is_seen() -> None:
    fleet = fleet_of("n1", "n3")
    assert node_names(fleet) == ["n1", "n3"]
    hello(fleet, "n2")
    assert node_names(fleet) == ["n1", "n2", "n3"]
    forget(fleet, ["n3"])
    assert node_names(fleet) == ["n1", "n2"]
    # One gone and one come between two looks: the same count of nodes, other members.
    forget(fleet, ["n1"])
    hello(fleet, "n0")
    assert node_names(fleet) == ["n0", "n2"]


def test_adopted_and_copied_nodes_are_seen() -> None:
    fleet = fleet_of("n1")
    assert node_names(fleet) == ["n1"]
    adopt(fleet, fleet_of("n1", "n5"), {})
    assert node_names(fleet) == ["n1", "n5"]

    copy = fleet_of("n9")
    assert node_names(copy) == ["n9"]
    forget(copy, ["n9"])
    install(copy, slice_message(fleet_of("n7", "n8"), ["n7", "n8"]))
    assert node_names(copy) == ["n7", "n8"]
