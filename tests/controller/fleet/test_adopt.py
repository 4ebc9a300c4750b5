"""Taking in nodes another replica stored (controller/fleet/adopt.py): only what is newer replaces
what the fleet holds; counters' rates come from the readings taken in; a new Hello is a new
inventory. A standby that leads on its agents' streams carries their nodes over as it holds them."""

from __future__ import annotations

from controller.fleet.adopt import UNCHANGED, adopt, adopt_history, carry
from controller.fleet.model import Fleet, GpuState, NodeState, ProbeKey, ProbeRecord
from controller.fleet.series import Series
from controller.fleet.trends import XidSeen, gpu_key
from protos.gpufleet.v1 import telemetry_pb2 as pb


def _hello(gpus: int = 2, boot: str = "b1") -> pb.Hello:
    msg = pb.Hello(node="n1", boot_id=boot)
    for i in range(gpus):
        msg.inventory.gpus.add(index=i, name="NVIDIA H100")
    return msg


def _stored(t: float, ecc: int = 0, gpus: int = 2, boot: str = "b1", seq: int = 5) -> Fleet:
    """n1 as another replica stored it at time t."""
    fleet = Fleet()
    node = fleet.nodes["n1"] = NodeState("n1", _hello(gpus, boot), 10.0, t)
    for i in range(gpus):
        sample = pb.GpuSample(index=i, power_watts=t, ecc_uncorrected_volatile_total=ecc)
        node.gpus[i] = GpuState(i, sample, t, {"hw_slowdown": t - 5} if i == 0 else {})
    node.host, node.host_time = pb.HostSample(load1=t), t
    result = pb.ProbeResult(probe="gemm", variant="bf16", gpu=0, value=t)
    record = ProbeRecord("n1", 0, "gemm", "bf16", t, "TFLOP/s", t, result.SerializeToString())
    fleet.probes[record.key] = record
    fleet.acked[("n1", boot)] = seq
    return fleet


def test_a_new_node_is_taken_in_whole() -> None:
    fleet = Fleet()
    assert adopt(fleet, _stored(100.0), {"n1": 101.0}) == ["n1"]
    node = fleet.nodes["n1"]
    assert sorted(node.gpus) == [0, 1] and node.gpus[0].held == {"hw_slowdown": 95.0}
    assert node.last_seen == 100.0 and node.last_heard == 101.0
    assert node.host is not None and node.host.load1 == 100.0
    assert fleet.acked == {("n1", "b1"): 5}
    assert list(fleet.history[("n1", 0, "gemm", "bf16")]) == [(100.0, 100.0)]
    assert fleet.probe_version > 0


def test_only_newer_readings_replace_what_the_fleet_holds() -> None:
    fleet = Fleet()
    adopt(fleet, _stored(100.0), {})
    version = fleet.probe_version
    older = _stored(90.0, seq=3)
    adopt(fleet, older, {})
    node = fleet.nodes["n1"]
    assert node.gpus[0].time == 100.0 and node.host_time == 100.0 and node.last_seen == 100.0
    assert fleet.probes[("n1", 0, "gemm", "bf16")].value == 100.0
    assert fleet.acked[("n1", "b1")] == 5  # a position never goes back
    assert fleet.probe_version == version  # nothing about probes changed
    adopt(fleet, _stored(110.0, seq=6), {})
    assert node.gpus[1].sample.power_watts == 110.0 and node.host_time == 110.0
    assert fleet.acked[("n1", "b1")] == 6
    assert [t for t, _ in fleet.history[("n1", 0, "gemm", "bf16")]] == [100.0, 110.0]


def test_counters_rates_come_from_the_readings_taken_in_unless_a_copy_keeps_them() -> None:
    fleet = Fleet()
    adopt(fleet, _stored(100.0, ecc=2), {})
    adopt(fleet, _stored(110.0, ecc=12), {})
    assert fleet.nodes["n1"].trends.rate(gpu_key(0, "ecc_uncorrected_volatile_total")) == 1.0
    kept_elsewhere = Fleet()
    adopt(kept_elsewhere, _stored(100.0, ecc=2), {}, counters=False)
    adopt(kept_elsewhere, _stored(110.0, ecc=12), {}, counters=False)
    assert kept_elsewhere.nodes["n1"].trends.rate(gpu_key(0, "ecc_uncorrected_volatile_total")) is None


def test_a_new_hello_is_a_new_inventory() -> None:
    fleet = Fleet()
    adopt(fleet, _stored(100.0), {})
    version = fleet.probe_version
    adopt(fleet, _stored(50.0, gpus=1, boot="b2", seq=1), {})  # rebooted with one GPU; older readings
    node = fleet.nodes["n1"]
    assert node.boot_id == "b2" and sorted(node.gpus) == [0]
    assert fleet.probe_version > version
    assert fleet.acked == {("n1", "b1"): 5, ("n1", "b2"): 1}


def test_an_unchanged_hello_keeps_the_held_one_and_a_node_not_held_is_left_out() -> None:
    fleet = Fleet()
    adopt(fleet, _stored(100.0), {})
    version = fleet.probe_version
    again = _stored(110.0)
    again.nodes["n1"].hello = UNCHANGED
    adopt(fleet, again, {})
    assert fleet.nodes["n1"].hello == _hello() and fleet.nodes["n1"].gpus[0].time == 110.0
    assert fleet.probe_version == version + 1  # the newer probe result, not a new Hello
    empty = Fleet()
    assert adopt(empty, again, {}) == [] and empty.nodes == {} and empty.probes == {}


def test_a_standby_leading_on_its_streams_carries_their_nodes_as_it_holds_them() -> None:
    led = Fleet()
    adopt(led, _stored(100.0, seq=5), {})  # n1 as the store had it
    standby = _stored(130.0, seq=9)  # the standby's ingest: newer, two probe results since
    key = ("n1", 0, "gemm", "bf16")
    standby.history[key] = Series([(100.0, 100.0), (120.0, 120.0), (130.0, 130.0)])
    standby.nodes["n1"].trends.xids.append(XidSeen(125.0, 0, 79))  # memory only: never stored
    other = standby.nodes["n2"] = NodeState("n2", pb.Hello(node="n2", boot_id="b1"), 1.0, 1.0)
    members, version = led.members, led.probe_version

    assert carry(led, standby, ["n1", "n3"]) == ["n1"]  # n3: not the standby's
    assert led.nodes["n1"] is standby.nodes["n1"] and "n2" not in led.nodes and other.name == "n2"
    assert list(led.nodes["n1"].trends.xids) == [XidSeen(125.0, 0, 79)]
    assert led.probes[key] is standby.probes[key] and led.acked == {("n1", "b1"): 9}
    assert list(led.history[key]) == [(100.0, 100.0), (120.0, 120.0), (130.0, 130.0)]  # none twice
    assert led.members > members and led.probe_version > version
    assert carry(led, standby, []) == []


def test_a_keys_stored_history_replaces_what_the_fleet_took_in_keeping_newer_points_held() -> None:
    """adopt takes in a key's newest result only: the results between two looks, and a node's whole
    history the first time, come from the store (adopt_history). A point held here that is newer
    than the stored ones (a result ingested here meanwhile) is kept; a node not held is left out."""
    fleet = Fleet()
    adopt(fleet, _stored(100.0), {})
    key: ProbeKey = ("n1", 0, "gemm", "bf16")
    assert list(fleet.history[key]) == [(100.0, 100.0)]
    fleet.history[key].add(130.0, 99.0)  # ingested here after the store was read
    version = fleet.probe_version
    stored: dict[ProbeKey, Series] = {
        key: Series([(80.0, 80.0), (90.0, 90.0), (100.0, 100.0)]),
        ("n2", 0, "gemm", "bf16"): Series([(1.0, 1.0)]),
    }
    assert adopt_history(fleet, stored) == 1
    assert list(fleet.history[key]) == [(80.0, 80.0), (90.0, 90.0), (100.0, 100.0), (130.0, 99.0)]
    assert ("n2", 0, "gemm", "bf16") not in fleet.history  # n2 is not held
    assert fleet.probe_version > version  # the detectors' derived views of the results are stale
    version = fleet.probe_version
    assert adopt_history(fleet, {}) == 0 and fleet.probe_version == version


def test_a_key_taken_in_names_its_node_with_the_fleets_own_string() -> None:
    """Series read from the store come keyed by a string of their own for each row; taken in as
    read, 12,500 nodes' keys held a million more copies of their nodes' names."""
    fleet = Fleet()
    adopt(fleet, _stored(100.0), {})
    read_name = "".join(["n", "1"])  # equal to n1's name, another object (as a row read gives)
    assert read_name is not fleet.nodes["n1"].name
    adopt_history(fleet, {(read_name, 0, "gemm", "bf16"): Series([(90.0, 90.0)])})
    (key,) = fleet.history
    assert key[0] is fleet.nodes["n1"].name
