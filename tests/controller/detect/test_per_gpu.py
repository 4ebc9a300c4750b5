"""The GPU-local detectors' verdicts kept between passes (detect/per_gpu.py): a GPU is judged again
exactly when what its verdict reads is new (its reading, its node's XID events, the node itself, the
config), found by applying real frames; and what is kept drops nodes and GPUs that are gone."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agent.sources.sim import FaultSpec
from agent.sources.sim.faults import FAULTS
from agent.stream.frames import timestamp
from controller.config import DetectConfig
from controller.detect import nvlink_errors, throttle, xid
from controller.detect.base import DetectContext, DetectFn
from controller.detect.per_gpu import Judge
from controller.fleet.expiry import forget
from controller.fleet.finding import Finding
from controller.fleet.model import Fleet, GpuState, NodeState
from controller.fleet.state import apply_frame, apply_hello, plan_changes, write_of
from controller.fleet.trends import MAX_XIDS, XID_KEEP_SECONDS
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.simfleet import SimFleet

CONFIG = DetectConfig(throttle_window_seconds=5.0)
T0 = 1_800_000_000.0


def judged(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[tuple[str, int]]:
    """The (node, GPU) of each call to the module's per-GPU judge `name` from now on."""
    calls: list[tuple[str, int]] = []
    real: Judge = getattr(module, name)

    def counted(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[Finding]:
        calls.append((node.name, gpu.index))
        return real(node, gpu, config)

    monkeypatch.setattr(module, name, counted)
    return calls


def ingest(sim: SimFleet, name: str, gpus: set[int]) -> None:
    """A frame of node `name` at sim.now with only its readings of `gpus`, applied as ingest does."""
    frame = sim.frame(name)
    kept = [g for g in frame.gpus if g.index in gpus]
    del frame.gpus[:]
    frame.gpus.extend(kept)
    apply_frame(sim.fleet, write_of(name, frame, plan_changes(sim.fleet.nodes[name], frame, sim.now)))


def kept_states(fleet: Fleet) -> dict[str, tuple[GpuState, ...]]:
    """Each node's GpuStates that throttle's kept verdicts were judged from (per_gpu's entries)."""
    kept: dict[str, tuple[Any, ...]] = fleet.derived["per_gpu:throttle"][1]  # type: ignore[assignment]
    return {name: entry[2] for name, entry in kept.items()}


def seen(found: list[Finding]) -> list[tuple[str, int | None, str]]:
    return [(f.node, f.gpu, f.cause) for f in found]


def afresh(detect: DetectFn, fleet: Fleet, config: DetectConfig, now: float) -> list[Finding]:
    """What the detector finds with nothing kept: every GPU judged."""
    kept = dict(fleet.derived)
    fleet.derived.clear()
    try:
        return detect(DetectContext(fleet, config, now))
    finally:
        fleet.derived.clear()
        fleet.derived.update(kept)


def test_only_gpus_with_a_new_reading_are_judged_and_their_findings_start_and_clear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = SimFleet(3)
    sim.step(10)
    calls = judged(monkeypatch, throttle, "judge")

    def passed() -> list[tuple[str, int | None, str]]:
        found = throttle.detect(DetectContext(sim.fleet, CONFIG, sim.now))
        assert found == afresh(throttle.detect, sim.fleet, CONFIG, sim.now)
        calls.clear()  # afresh judged every GPU again
        return seen(found)

    found = throttle.detect(DetectContext(sim.fleet, CONFIG, sim.now))
    assert found == [] and len(calls) == 24  # the first pass judges every GPU
    calls.clear()
    assert passed() == [] and calls == []
    brake = sim.sims["node-01"].gpus[3]
    FAULTS["power_brake"].apply(brake, None, random.Random(7))
    sim.now += 10
    ingest(sim, "node-01", {3, 5})
    before = throttle.detect(DetectContext(sim.fleet, CONFIG, sim.now))
    assert before == [] and sorted(calls) == [("node-01", 3), ("node-01", 5)]  # held 0 s so far
    calls.clear()
    sim.now += 10
    ingest(sim, "node-01", {3})
    found = throttle.detect(DetectContext(sim.fleet, CONFIG, sim.now))
    assert seen(found) == [("node-01", 3, "power_brake")] and calls == [("node-01", 3)]
    assert found[0].evidence.held_seconds == 10.0
    calls.clear()
    sim.now += 10
    ingest(sim, "node-01", {5})  # other GPUs' readings: GPU 3's finding stands as judged
    ingest(sim, "node-02", {0})
    again = throttle.detect(DetectContext(sim.fleet, CONFIG, sim.now))
    assert seen(again) == seen(found) and again[0].evidence.held_seconds == 10.0
    assert calls == [("node-01", 5), ("node-02", 0)]
    brake.condition.power_brake_ratio = None
    sim.now += 10
    ingest(sim, "node-01", {3})
    assert passed() == []


def test_another_config_judges_every_gpu_again(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimFleet(2)
    FAULTS["power_brake"].apply(sim.sims["node-00"].gpus[6], None, random.Random(7))
    sim.step(10)
    sim.step(10)
    calls = judged(monkeypatch, throttle, "judge")
    assert seen(throttle.detect(DetectContext(sim.fleet, CONFIG, sim.now))) == [("node-00", 6, "power_brake")]
    assert len(calls) == 16
    calls.clear()
    longer = DetectConfig(throttle_window_seconds=60.0)
    assert throttle.detect(DetectContext(sim.fleet, longer, sim.now)) == [] and len(calls) == 16
    calls.clear()
    equal = DetectConfig(throttle_window_seconds=5.0)  # another object, the same config: kept
    assert seen(throttle.detect(DetectContext(sim.fleet, equal, sim.now))) == [("node-00", 6, "power_brake")]
    assert len(calls) == 16  # judged again: the kept verdicts were the longer window's
    calls.clear()
    assert seen(throttle.detect(DetectContext(sim.fleet, CONFIG, sim.now))) == [("node-00", 6, "power_brake")]
    assert calls == []


def test_forgotten_nodes_and_removed_gpus_leave_what_is_kept() -> None:
    sim = SimFleet(3)
    FAULTS["power_brake"].apply(sim.sims["node-01"].gpus[7], None, random.Random(7))
    sim.step(10)
    sim.step(10)
    ctx = DetectContext(sim.fleet, CONFIG, sim.now)
    assert seen(throttle.detect(ctx)) == [("node-01", 7, "power_brake")]
    assert sorted(kept_states(sim.fleet)) == ["node-00", "node-01", "node-02"]
    forget(sim.fleet, ["node-02"])
    removed = sim.fleet.nodes["node-01"].gpus[7]
    hello = sim.hello("node-01")
    del hello.inventory.gpus[7]
    apply_hello(sim.fleet, hello, 0, sim.now)  # GPU 7 gone from the inventory
    assert throttle.detect(ctx) == []
    kept = kept_states(sim.fleet)
    assert sorted(kept) == ["node-00", "node-01"]
    assert len(kept["node-01"]) == 7 and all(gpu is not removed for gpu in kept["node-01"])


def test_a_node_built_anew_is_judged_anew_even_with_the_same_gpu_states() -> None:
    """As a detection process's slice replaces a node: its trends are the new node's."""
    sim = SimFleet(2, {"node-01": [FaultSpec("nvlink_crc_errors", 2)]})
    for _ in range(12):
        sim.step(10)
    ctx = DetectContext(sim.fleet, CONFIG, sim.now)
    assert seen(nvlink_errors.detect(ctx)) == [("node-01", 2, "nvlink_errors")]
    node = sim.fleet.nodes["node-01"]
    anew = NodeState(node.name, node.hello, node.first_seen, node.last_seen, gpus=dict(node.gpus))
    sim.fleet.nodes["node-01"] = anew  # no trends yet: no rate to judge by
    assert nvlink_errors.detect(ctx) == []


# XIDs: frames carrying a GPU's XID events, as the agent sends them (a GPU fallen off the bus sends
# nothing else), applied to a node of two GPUs.


def xid_fleet() -> Fleet:
    fleet = Fleet()
    for name in ("node-00", "node-01"):
        apply_hello(fleet, pb.Hello(node=name, boot_id="boot"), 0, T0)
    return fleet


def xid_frame(fleet: Fleet, name: str, at: float, gpu: int, codes: list[int]) -> None:
    """node `name`'s frame at `at` with GPU `gpu`'s reading, which logged `codes` then."""
    seq = fleet.acked.get((name, "boot"), 0) + 1
    frame = pb.TelemetryFrame(node=name, boot_id="boot", seq=seq, time=timestamp(at))
    frame.gpus.add(index=gpu, xid_events=[pb.XidEvent(code=c, unix_time_seconds=at) for c in codes])
    apply_frame(fleet, write_of(name, frame, plan_changes(fleet.nodes[name], frame, at)))


def xids(fleet: Fleet, now: float) -> list[tuple[str, int | None, str]]:
    found = xid.detect(DetectContext(fleet, DetectConfig(), now))
    assert found == afresh(xid.detect, fleet, DetectConfig(), now)
    return seen(found)


def test_an_xid_reading_starts_a_finding_and_one_an_hour_on_clears_it() -> None:
    fleet = xid_fleet()
    xid_frame(fleet, "node-00", T0, 1, [])
    assert xids(fleet, T0) == []
    xid_frame(fleet, "node-00", T0 + 10, 1, [121])
    assert xids(fleet, T0 + 10) == [("node-00", 1, "xid_error")]
    xid_frame(fleet, "node-00", T0 + 10 + XID_KEEP_SECONDS + 1, 1, [])
    assert xids(fleet, T0 + 10 + XID_KEEP_SECONDS + 1) == []


def test_another_gpus_reading_that_drops_an_xid_event_clears_its_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU 0's reading stays the one with its XID, GpuState and all; GPU 1's reading an hour later
    drops that event from the front of the node's deque, and with it the finding (its window reached
    back), while GPU 2's later event stays, the newest in the deque."""
    fleet = xid_fleet()
    xid_frame(fleet, "node-00", T0, 0, [121])
    xid_frame(fleet, "node-00", T0, 1, [])
    xid_frame(fleet, "node-00", T0 + 100, 2, [121])
    xid_frame(fleet, "node-01", T0, 0, [121])
    calls = judged(monkeypatch, xid, "gpu_findings")
    on_gpus = [("node-00", 0, "xid_error"), ("node-00", 2, "xid_error"), ("node-01", 0, "xid_error")]
    assert xids(fleet, T0 + 100) == on_gpus
    calls.clear()
    later = T0 + XID_KEEP_SECONDS + 1
    xid_frame(fleet, "node-00", later, 1, [])
    assert [x.gpu for x in fleet.nodes["node-00"].trends.xids] == [2]  # GPU 0's dropped through GPU 1
    found = xid.detect(DetectContext(fleet, DetectConfig(), later))
    assert seen(found) == on_gpus[1:]
    assert sorted(calls) == [("node-00", 0), ("node-00", 1), ("node-00", 2)]  # node-00's GPUs only


def test_another_gpus_events_that_push_an_xid_event_out_clear_its_finding() -> None:
    """The node keeps MAX_XIDS events: GPU 1's push GPU 0's out, GPU 0's reading unchanged."""
    fleet = xid_fleet()
    xid_frame(fleet, "node-00", T0, 0, [121])
    xid_frame(fleet, "node-00", T0, 1, [])
    assert xids(fleet, T0) == [("node-00", 0, "xid_error")]
    xid_frame(fleet, "node-00", T0 + 10, 1, [13] * (MAX_XIDS - 1))  # room for all: GPU 0's stays
    assert xids(fleet, T0 + 10) == [("node-00", 0, "xid_error"), ("node-00", 1, "xid_error")]
    xid_frame(fleet, "node-00", T0 + 20, 1, [13])
    assert all(x.gpu == 1 for x in fleet.nodes["node-00"].trends.xids)
    assert xids(fleet, T0 + 20) == [("node-00", 1, "xid_error")]
