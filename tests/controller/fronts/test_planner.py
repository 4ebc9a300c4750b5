"""Frames planned by an ingest front (controller/fronts/planner.py): the plan and the frame as
screened build exactly the write the controller's own plan builds; a frame the planner cannot be
sure of goes on as the agent sent it, and so does every later frame of its stream; and through real
front processes, planned frames leave the fleet as ingesting them directly does."""

from __future__ import annotations

import asyncio
import copy
import math
import time
from collections.abc import Callable

import grpc
import pytest

from agent.sources.sim import FaultSpec
from controller.config import LimitsConfig
from controller.fleet.model import Fleet
from controller.fleet.state import apply_frame, apply_hello, plan_changes, plan_frame, write_of
from controller.frame_bytes import frame_bytes
from controller.fronts.planner import StreamPlanner, planned_parts, state_of
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from tests.controller.fronts.test_relay import OWN_CONNECTION, next_message
from tests.controller.harness import as_frame, as_hello, bmc_sample, config, frame, hello, running_controller
from tests.simfleet import SimFleet

NODE = "node-00"
BOOT = f"boot-{NODE}"
SKEW = 300.0


def _message(f: pb.TelemetryFrame) -> bytes:
    return as_frame(f).SerializeToString()


def _sim() -> tuple[SimFleet, StreamPlanner]:
    """A throttling node with some history, and a planner started from the controller's state of it."""
    sim = SimFleet(1, {NODE: [FaultSpec("thermal_throttle", 3), FaultSpec("nvlink_crc_errors", 2)]})
    for _ in range(3):
        sim.step(10.0)
    node = sim.fleet.nodes[NODE]
    planner = StreamPlanner(state_of(node, BOOT, sim.seq[NODE], SKEW), clock=lambda: sim.now)
    return sim, planner


def _next(sim: SimFleet, k: int) -> pb.TelemetryFrame:
    """The node's next frame, with host readings, a BMC poll now and then, probes once, and a NaN and
    an impossible reading in some."""
    sim.now += 10.0
    f = sim.frame(NODE, probes=k == 1)
    f.host.load1 = 3.0 + k
    if k % 2 == 0:
        f.bmc.CopyFrom(bmc_sample(sim.now - 5, NODE))
    if k >= 2:  # a condition that starts while the front plans: its since-time is the front's to keep
        f.gpus[0].clock_event_reasons |= pb.CLOCK_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
    if k == 2:
        f.gpus[1].temperature_celsius = math.nan
    if k == 3:
        f.gpus[2].power_watts = 1e9
    return f


@pytest.mark.parametrize("digests", [True, False], ids=["links-digest", "older-agent"])
def test_a_planned_frame_builds_the_write_the_controller_would_build(digests: bool) -> None:
    """Also from an older agent, which sends no digest of a GPU's NVLink errors: the planner reads
    the links to find them unchanged."""
    sim, planner = _sim()
    node = sim.fleet.nodes[NODE]
    reference = copy.deepcopy(sim.fleet)  # applied without the planner's NVLink hints
    held = hinted = 0
    for k in range(6):
        sent = _next(sim, k)
        assert all(g.nvlink_errors_digest for g in sent.gpus)
        for gpu in sent.gpus if not digests else ():
            gpu.ClearField("nvlink_errors_digest")
        message = _message(sent)
        payload = planner.plan(message)
        assert payload is not None, f"frame {k} was not planned"
        plan, body = planned_parts(payload)
        theirs = write_of(NODE, pb.TelemetryFrame.FromString(body), plan)
        here = pb.AgentMessage.FromString(message).frame  # the controller's own path, on the same bytes
        mine = plan_changes(node, here, sim.now)
        assert plan._replace(links_unchanged=()) == mine
        assert theirs == write_of(NODE, here, mine)
        if not (mine.non_finite or mine.implausible):
            assert body == message[-len(body) :]  # as the agent sent it: not encoded again
        apply_frame(sim.fleet, theirs, links_unchanged=plan.links_unchanged)
        apply_frame(reference, write_of(NODE, here, mine))
        held += sum(1 for _, conditions in plan.gpus if conditions)
        hinted += len(plan.links_unchanged)
        assert 2 not in plan.links_unchanged  # its CRC errors rise
        assert node.trends == reference.nodes[NODE].trends  # the hints change nothing but the work
    assert hinted >= 5 * 7  # after the first frame, the seven quiet GPUs'
    assert node.trends.changed("gpu2.nvlink") and not node.trends.changed("gpu1.nvlink")
    assert planner.planned == 6 and planner.active
    assert node.gpus[0].held_for("hw_power_brake_slowdown") == 30.0
    assert held, "no GPU held a condition: the throttling node's plans say nothing about `held`"
    assert node.gpus[1].sample.HasField("temperature_celsius")  # the NaN frame was not the last
    assert sim.fleet.implausible  # the impossible power was counted


CASES: dict[str, Callable[[pb.TelemetryFrame], None]] = {
    "a gap": lambda f: setattr(f, "seq", f.seq + 1),
    "a duplicate": lambda f: setattr(f, "seq", f.seq - 1),
    "another boot": lambda f: setattr(f, "boot_id", "other"),
    "another node": lambda f: setattr(f, "node", "node-01"),
    "a spool floor above it": lambda f: setattr(f, "spool_floor_seq", f.seq + 1),
    "a time far ahead": lambda f: f.time.FromSeconds(int(f.time.seconds) + 10_000),
    "a GPU twice": lambda f: f.gpus.add().CopyFrom(f.gpus[0]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_frame_the_planner_is_not_sure_of_goes_as_sent_and_so_does_the_rest(case: str) -> None:
    sim, planner = _sim()
    odd = _next(sim, 0)
    CASES[case](odd)
    assert planner.plan(_message(odd)) is None
    assert not planner.active
    sim.seq[NODE] -= 1  # the same seq again, now a plain next frame: still not planned
    assert planner.plan(_message(_next(sim, 1))) is None
    assert planner.planned == 0


def test_messages_other_than_frames_pass_and_planning_goes_on() -> None:
    sim, planner = _sim()
    result = pb.AgentMessage(command_result=pb.CommandResult(command_id="c1")).SerializeToString()
    assert planner.plan(result) is None and planner.active
    assert planner.plan(_message(_next(sim, 0))) is not None
    assert planner.plan(b"\xff\xff\xff") is None and not planner.active  # not protobuf: as sent


def test_frame_bytes_are_found_only_in_a_message_holding_one_whole_frame() -> None:
    f = frame(7)
    whole = f.SerializeToString()
    assert frame_bytes(as_frame(f).SerializeToString()) == whole
    split = _message(pb.TelemetryFrame(seq=7)) + _message(pb.TelemetryFrame(node="n1"))  # merged by protobuf
    assert frame_bytes(split) is None
    assert frame_bytes(as_hello(hello()).SerializeToString()) is None
    assert frame_bytes(_message(f)[:-1]) is None
    assert frame_bytes(b"") is None and frame_bytes(b"\x12") is None


def test_planned_frames_through_fronts_leave_the_fleet_as_direct_ingest_does() -> None:
    nodes = ["p1", "p2", "p3"]
    count = 5
    now = time.time()

    def frames_of(name: str) -> list[pb.TelemetryFrame]:
        out = []
        for seq in range(1, count + 1):
            f = frame(seq, name, t=now)
            f.host.load1 = float(seq)
            if seq == 3:
                f.gpus[0].temperature_celsius = math.nan
            out.append(f)
        return out

    async def go() -> None:
        # The wall clock, as in production: a controller on a test's clock plans every frame itself.
        async with running_controller(config(), clock=time.time, fronts=2) as running:
            assert running.fronts is not None
            for name in nodes:
                async with grpc.aio.insecure_channel(running.address, options=OWN_CONNECTION) as channel:
                    call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
                    await call.write(as_hello(hello(name)))
                    await asyncio.wait_for(call.initial_metadata(), 10)  # as agents wait
                    for f in frames_of(name):
                        await call.write(as_frame(f))
                    acks = [(await next_message(call, "ack")).ack.seq for _ in range(count)]
                    assert acks == list(range(1, count + 1))
                    call.cancel()
            assert running.fronts.planned == len(nodes) * count
            # An agent that does not wait for the answer to its Hello: its frames are planned here.
            # The answer is held back a moment, so that the front surely reads the early frames
            # before it (on a busy machine it could otherwise come first: the front then plans them
            # all, rightly, and this test would see another case than the one it names).
            answer_hello = running.app.ingest.hello

            async def held_back(hello: pb.Hello) -> int:
                if hello.node == "p4":
                    await asyncio.sleep(1.0)
                return await answer_hello(hello)

            running.app.ingest.hello = held_back  # type: ignore[method-assign]
            async with grpc.aio.insecure_channel(running.address, options=OWN_CONNECTION) as channel:
                call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
                await call.write(as_hello(hello("p4")))
                early, late = frames_of("p4")[:2], frames_of("p4")[2:]
                for f in early:
                    await call.write(as_frame(f))
                await asyncio.wait_for(call.initial_metadata(), 10)
                for f in late:
                    await call.write(as_frame(f))
                assert [(await next_message(call, "ack")).ack.seq for _ in range(count)] == [1, 2, 3, 4, 5]
                call.cancel()
            assert running.fronts.planned == len(nodes) * count
            fleet = running.app.ingest.fleet
            assert running.app.ingest.counters.non_finite == len(nodes) + 1
            reference = Fleet()
            for name in [*nodes, "p4"]:
                apply_hello(reference, hello(name), 0, now)
                for f in frames_of(name):
                    write, _ = plan_frame(reference.nodes[name], f, time.time())
                    apply_frame(reference, write)
                ours, theirs = fleet.nodes[name], reference.nodes[name]
                assert ours.gpus == theirs.gpus and ours.host == theirs.host
            assert fleet.probes.keys() == reference.probes.keys()
            assert {k: r.value for k, r in fleet.probes.items()} == {
                k: r.value for k, r in reference.probes.items()
            }

    asyncio.run(go())


@pytest.mark.parametrize("field", ["time", "probes[0].time", "gpus[0].xid_events[0].unix_time_seconds"])
def test_a_time_beyond_the_controllers_skew_is_refused_through_planning_fronts(field: str) -> None:
    """limits.max_clock_skew_seconds reaches the fronts' planners: a frame they must not plan goes to
    the controller, which refuses it naming the field, and the stream's agent goes on."""
    skew = 30.0

    async def go() -> None:
        cfg = config(limits=LimitsConfig(max_clock_skew_seconds=skew))
        async with running_controller(cfg, clock=time.time, fronts=1) as running:
            assert running.fronts is not None
            async with grpc.aio.insecure_channel(running.address, options=OWN_CONNECTION) as channel:
                call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
                await call.write(as_hello(hello("s1")))
                await asyncio.wait_for(call.initial_metadata(), 10)
                await call.write(as_frame(frame(1, "s1", t=time.time())))
                assert (await next_message(call, "ack")).ack.seq == 1
                assert running.fronts.planned == 1
                bad = frame(2, "s1", t=time.time())
                ahead = time.time() + skew + 120  # within the default 300 s, beyond this controller's 30
                if field == "time":
                    bad.time.FromSeconds(int(ahead))
                elif field == "probes[0].time":
                    bad.probes[0].time.FromSeconds(int(ahead))
                else:
                    bad.gpus[0].xid_events.add(code=79, unix_time_seconds=ahead)
                await call.write(as_frame(bad))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await next_message(call, "ack")
                details = caught.value.details() or ""
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details
                assert f"frame 2: {field} " in details and "ahead of the controller's clock" in details
            assert running.fronts.planned == 1
            assert running.app.ingest.fleet.acked[("s1", "b1")] == 1

    asyncio.run(go())
