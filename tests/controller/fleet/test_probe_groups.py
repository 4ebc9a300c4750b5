"""Probe results by peer group (controller/fleet/probe_groups.py), carried along by apply_frame: the
grouping kept must be the one grouping every result afresh gives, in the same order."""

from __future__ import annotations

from controller.fleet.model import Fleet, ProbeKey, ProbeRecord
from controller.fleet.probe_groups import GROUPED, Group, PeerGroups, grouped
from controller.fleet.state import apply_frame, apply_hello, plan_frame
from tests.simfleet import SimFleet

Grouping = list[tuple[Group, list[tuple[ProbeKey, ProbeRecord]]]]


def afresh(fleet: Fleet) -> Grouping:
    """Every result grouped one by one, in Fleet.probes' order."""
    out: dict[Group, list[tuple[ProbeKey, ProbeRecord]]] = {}
    peers_of = PeerGroups(fleet)
    for key, record in fleet.probes.items():
        group = peers_of.of(record)
        if group is not None:
            out.setdefault(group, []).append((key, record))
    return list(out.items())


def kept(fleet: Fleet) -> Grouping:
    return [(group, list(members.items())) for group, members in grouped(fleet).items()]


def test_results_carried_in_are_grouped_and_ordered_as_grouping_afresh() -> None:
    sim = SimFleet(6)
    sim.step(3600.0, probes=True)
    first = grouped(sim.fleet)
    was = {key: record for members in first.values() for key, record in members.items()}
    for _ in range(3):  # new results replace the kept ones in their place
        sim.step(3600.0, probes=True)
    assert sim.fleet.derived[GROUPED][1] is first  # carried, not grouped again
    assert all(sim.fleet.probes[key] is not record for key, record in was.items())
    assert kept(sim.fleet) == afresh(sim.fleet)
    frame = sim.frame("node-02", probes=True)  # a probe variant not seen before: a new key, last
    frame.probes.add(probe="gemm", variant="fp8-new", gpu=3, value=900.0, unit="TFLOP/s")
    frame.probes[-1].time.CopyFrom(frame.time)
    write, _ = plan_frame(sim.fleet.nodes["node-02"], frame, sim.now)
    apply_frame(sim.fleet, write)
    assert sim.fleet.derived[GROUPED][1] is first
    assert kept(sim.fleet) == afresh(sim.fleet)
    assert kept(sim.fleet)[-1][1][0][0] == ("node-02", 3, "gemm", "fp8-new")


def test_a_result_moving_to_another_group_or_a_new_hello_groups_every_result_again() -> None:
    sim = SimFleet(6)
    sim.step(3600.0, probes=True)
    grouped(sim.fleet)
    frame = sim.frame("node-04", probes=True)
    frame.probes[0].unit = "GB/s"  # the same key, another unit: another group
    write, _ = plan_frame(sim.fleet.nodes["node-04"], frame, sim.now + 1)
    apply_frame(sim.fleet, write)
    assert GROUPED not in sim.fleet.derived
    assert kept(sim.fleet) == afresh(sim.fleet)
    before = grouped(sim.fleet)
    hello = sim.hello("node-01")
    hello.inventory.gpus[2].name = "NVIDIA H200"  # its GPU 2's results now have other peers
    apply_hello(sim.fleet, hello, 0, sim.now)
    assert grouped(sim.fleet) is not before
    assert kept(sim.fleet) == afresh(sim.fleet)
    assert any(group[0] == "NVIDIA H200" for group in grouped(sim.fleet))


def test_a_hello_saying_the_same_of_gpus_and_probes_keeps_the_grouping() -> None:
    """A restarted or reconnecting agent on an unchanged machine: a new boot, the same inventory and
    probes. A changed inventory or probe facts group every result again."""
    sim = SimFleet(6)
    sim.step(3600.0, probes=True)
    before = grouped(sim.fleet)
    hello = sim.hello("node-01")
    hello.boot_id, hello.agent_version = "boot-again", "newer"
    hello.started_at.FromSeconds(int(sim.now) + 5)
    apply_hello(sim.fleet, hello, 0, sim.now)
    assert grouped(sim.fleet) is before
    assert kept(sim.fleet) == afresh(sim.fleet)
    for change in ("probe", "direction", "gpu gone", "serial"):
        hello = sim.hello("node-01")
        if change == "probe":
            hello.probes.append("nccl")
        elif change == "direction":
            hello.probe_infos.add(name="gemm", unit="TFLOP/s", higher_is_better=False)
        elif change == "gpu gone":
            del hello.inventory.gpus[-1]
        else:
            hello.inventory.gpus[0].serial = "replaced-board"
        before = grouped(sim.fleet)
        apply_hello(sim.fleet, hello, 0, sim.now)
        assert grouped(sim.fleet) is not before, change
        assert kept(sim.fleet) == afresh(sim.fleet), change
