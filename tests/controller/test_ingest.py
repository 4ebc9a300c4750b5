"""Ingest: dedupe by (node, boot, seq), refuse what contradicts the stream, ack only what is stored."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping

import pytest

from controller.errors import InvalidMessage, SequenceGap, StoreUnavailable
from controller.fleet.model import Fleet, NodeState, ProbeKey
from controller.fleet.series import Series
from controller.fleet.state import FramePlan, plan_changes
from controller.ingest import Ingest
from controller.store.store import Store
from controller.store.stored_nodes import StoredNodes
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import bmc_sample

E = 1_700_000_000.0  # times below are seconds after E (2023-11-14): real times, after 2000


def hello(node: str = "n1", boot: str = "b1") -> pb.Hello:
    msg = pb.Hello(node=node, boot_id=boot)
    msg.inventory.gpus.add(index=0, name="NVIDIA H100 80GB HBM3")
    return msg


def frame(
    seq: int, node: str = "n1", boot: str = "b1", floor: int = 0, t: float = E + 1000.0
) -> pb.TelemetryFrame:
    msg = pb.TelemetryFrame(node=node, boot_id=boot, seq=seq, spool_floor_seq=floor)
    msg.time.FromSeconds(int(t + seq))
    msg.gpus.add(index=0, power_watts=400.0 + seq)
    return msg


def with_ingest(body: Callable[[Ingest], Awaitable[None]]) -> None:
    async def go() -> None:
        store = Store(":memory:")
        await store.open()
        try:
            await body(Ingest(Fleet(), store, clock=lambda: E + 5000.0))
        finally:
            store.close()

    asyncio.run(go())


def test_in_order_frames_are_acked_and_duplicates_dropped() -> None:
    async def body(ingest: Ingest) -> None:
        assert await ingest.hello(hello()) == 0
        assert [await ingest.frame("n1", frame(s)) for s in (1, 2, 3)] == [1, 2, 3]
        assert await ingest.frame("n1", frame(2)) == 3  # a resend after reconnect: re-acked, not stored
        assert ingest.counters.frames == 3 and ingest.counters.duplicates == 1
        assert ingest.fleet.nodes["n1"].gpus[0].sample.power_watts == 403.0
        assert "gpu0" in ingest.fleet.nodes["n1"].trends.groups  # no detection process: kept here
        assert await ingest.hello(hello()) == 3  # a reconnect learns where it stands

    with_ingest(body)


def test_gap_is_refused_until_the_missing_frame_arrives() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello())
        await ingest.frame("n1", frame(1))
        with pytest.raises(SequenceGap, match="expected frame 2, got 3"):
            await ingest.frame("n1", frame(3))
        assert await ingest.frame("n1", frame(2)) == 2
        assert await ingest.frame("n1", frame(3)) == 3

    with_ingest(body)


def test_spool_floor_skips_frames_the_agent_dropped() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello())
        await ingest.frame("n1", frame(1))
        assert await ingest.frame("n1", frame(40, floor=40)) == 40
        with pytest.raises(InvalidMessage, match="spool floor"):
            await ingest.frame("n1", frame(45, floor=50))

    with_ingest(body)


def test_frame_for_another_node_is_refused() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello())
        with pytest.raises(InvalidMessage, match="on the stream of node 'n1'"):
            await ingest.frame("n1", frame(1, node="n2"))
        with pytest.raises(InvalidMessage):
            await ingest.frame("n1", frame(0))
        bad = frame(1)
        bad.gpus.add(index=0)
        with pytest.raises(InvalidMessage, match="twice"):
            await ingest.frame("n1", bad)

    with_ingest(body)


def test_bad_hello_is_refused() -> None:
    async def body(ingest: Ingest) -> None:
        with pytest.raises(InvalidMessage):
            await ingest.hello(pb.Hello(node="", boot_id="b"))
        with pytest.raises(InvalidMessage):
            await ingest.hello(pb.Hello(node="n", boot_id=""))

    with_ingest(body)


def test_nan_readings_are_missing_and_nan_probes_never_baseline(caplog: pytest.LogCaptureFixture) -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello())
        f = frame(1)
        f.gpus[0].temperature_celsius = math.nan
        f.probes.add(probe="gemm", variant="bf16", gpu=0, value=math.nan, unit="TFLOP/s")
        f.probes.add(probe="gemm", variant="fp16", gpu=0, value=math.inf, unit="TFLOP/s")
        f.probes.add(probe="membw", variant="d2d", gpu=0, value=2900.0, unit="GB/s")
        f.probes.add(probe="pcie", variant="h2d", gpu=0, value=10.0, unit="GB/s", error="CUDA error")
        await ingest.frame("n1", f)
        sample = ingest.fleet.nodes["n1"].gpus[0].sample
        assert not sample.HasField("temperature_celsius") and sample.power_watts == 401.0
        assert list(ingest.fleet.probes) == [("n1", 0, "membw", "d2d")]
        assert ingest.counters.non_finite == 3

    with caplog.at_level(logging.WARNING, logger="gpufleet.controller.ingest"):
        with_ingest(body)
    # the warning names what was cleared, so an operator knows which reading of the node to doubt
    assert "node n1 frame 1: 3 NaN/Inf readings stored as missing: GpuSample.temperature_celsius, " in (
        caplog.text
    )
    assert "ProbeResult.value (x2)" in caplog.text


def test_a_plan_names_each_non_finite_reading_a_kept_probe_result_carried_too() -> None:
    """A result's own value NaN drops the result; NaN in the reading it carries (`during`) is cleared
    and named like any other, the result kept."""
    f = frame(1)
    f.gpus[0].temperature_celsius = math.inf
    kept = f.probes.add(probe="gemm", variant="bf16", gpu=0, value=700.0, unit="TFLOP/s")
    kept.during.power_watts = math.nan
    f.probes.add(probe="gemm", variant="fp16", gpu=0, value=math.nan, unit="TFLOP/s")
    plan = plan_changes(NodeState("n1", hello(), E, E), f, E + 5000.0)
    assert plan.non_finite == {
        "GpuSample.temperature_celsius": 1,
        "GpuSample.power_watts": 1,
        "ProbeResult.value": 1,
    }
    assert [position for position, _ in plan.probes] == [0] and not kept.during.HasField("power_watts")


def test_replayed_older_boot_does_not_overwrite_fresher_state() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello(boot="new"))
        await ingest.frame("n1", frame(1, boot="new", t=E + 2000.0))
        assert await ingest.frame("n1", frame(5, boot="old", floor=5, t=E + 100.0)) == 5
        assert ingest.fleet.nodes["n1"].gpus[0].sample.power_watts == 401.0
        assert ingest.fleet.acked[("n1", "old")] == 5

    with_ingest(body)


def test_store_failure_acks_nothing() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello())

        async def broken(write: object) -> None:
            raise StoreUnavailable("store unavailable: database or disk is full")

        ingest.store.save_frame = broken  # type: ignore[method-assign]
        with pytest.raises(StoreUnavailable):
            await ingest.frame("n1", frame(1))
        assert ingest.fleet.acked[("n1", "b1")] == 0
        assert ingest.fleet.nodes["n1"].gpus == {}

    with_ingest(body)


def with_bmc(f: pb.TelemetryFrame, polled: float, endpoint: str) -> pb.TelemetryFrame:
    f.bmc.CopyFrom(bmc_sample(polled))
    f.bmc.endpoint = endpoint  # tells the samples apart
    return f


def test_bmc_sample_is_kept_until_a_newer_poll_arrives() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello(boot="new"))
        node = ingest.fleet.nodes["n1"]
        await ingest.frame("n1", with_bmc(frame(1, boot="new", t=E + 2000.0), E + 1990.0, "first"))
        assert node.bmc is not None and node.bmc.endpoint == "first" and node.bmc_time == E + 1990.0
        await ingest.frame("n1", frame(2, boot="new", t=E + 2000.0))  # most frames carry no BMC section
        await ingest.frame("n1", with_bmc(frame(3, boot="new", t=E + 2000.0), E + 1980.0, "older poll"))
        # A replayed older boot: its frames and its poll are older than what is held.
        await ingest.frame("n1", with_bmc(frame(7, boot="old", floor=7, t=E + 100.0), E + 95.0, "old boot"))
        assert node.bmc.endpoint == "first" and node.bmc_time == E + 1990.0
        fleet, _ = await ingest.store.load()
        assert fleet.nodes["n1"].bmc == node.bmc and fleet.nodes["n1"].bmc_time == E + 1990.0

        await ingest.frame("n1", with_bmc(frame(4, boot="new", t=E + 2000.0), E + 2050.0, "newer"))
        assert node.bmc.endpoint == "newer" and node.bmc_time == E + 2050.0
        await ingest.frame("n1", with_bmc(frame(5, boot="new", t=E + 2000.0), E + 5200.0, "clock ahead"))
        assert node.bmc_time == E + 5000.0  # clamped to the controller's now, so later polls still land
        fleet, _ = await ingest.store.load()
        assert fleet.nodes["n1"].bmc == node.bmc and fleet.nodes["n1"].bmc_time == E + 5000.0

    with_ingest(body)


def test_nan_in_bmc_readings_is_missing_and_counted() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello())
        f = with_bmc(frame(1), E + 1000.0, "e")
        f.bmc.temperatures[0].reading_celsius = math.nan
        f.bmc.fans[0].speed_rpm = math.inf
        f.bmc.gpus[0].power_watts = -math.inf
        f.bmc.power_consumed_watts = math.nan
        await ingest.frame("n1", f)
        assert ingest.counters.non_finite == 4
        fleet, _ = await ingest.store.load()
        for node in (ingest.fleet.nodes["n1"], fleet.nodes["n1"]):  # in memory and as stored
            bmc = node.bmc
            assert bmc is not None
            assert not bmc.temperatures[0].HasField("reading_celsius")
            assert bmc.temperatures[1].reading_celsius == 26.0
            assert not bmc.fans[0].HasField("speed_rpm") and bmc.fans[1].speed_rpm == 0.0
            assert not bmc.gpus[0].HasField("power_watts") and bmc.gpus[0].temperature_celsius == 63.0
            assert not bmc.HasField("power_consumed_watts")
            assert dict(bmc.bios_attributes) == {"ProcCStates": "Disabled", "SriovGlobalEnable": "Enabled"}

    with_ingest(body)


class _Mirror:
    """Records what ingest sends the detection process."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, FramePlan, bytes]] = []

    def hello(self, hello: pb.Hello, acked: int, now: float) -> None:
        pass

    def frame(self, node: str, plan: FramePlan, frame: bytes) -> None:
        self.frames.append((node, plan, frame))

    def adopt(self, stored: StoredNodes, heard: Mapping[str, float]) -> None:
        pass

    def history(self, history: Mapping[ProbeKey, Series]) -> None:
        pass


def test_the_detection_process_gets_the_frame_as_screened_and_the_bytes_received_when_unchanged() -> None:
    async def body(ingest: Ingest) -> None:
        mirror = _Mirror()
        ingest.mirror = mirror
        await ingest.hello(hello())
        clean = frame(1)
        received = clean.SerializeToString()
        await ingest.frame("n1", clean, raw=received)
        dirty = frame(2)
        dirty.gpus[0].temperature_celsius = math.nan
        await ingest.frame("n1", dirty, raw=dirty.SerializeToString())
        odd = frame(3)
        odd.gpus[0].power_watts = 1e9  # impossible: cleared, not NaN
        await ingest.frame("n1", odd, raw=odd.SerializeToString())
        planned = frame(4)
        planned.gpus[0].temperature_celsius = math.nan
        plan = plan_changes(ingest.fleet.nodes["n1"], planned, E + 5000.0)  # as a front plans it
        screened = planned.SerializeToString()
        assert await ingest.frame("n1", planned, plan, screened) == 4
        assert mirror.frames.pop() == ("n1", plan, screened)  # a front's plan and bytes, passed on
        assert ingest.counters.non_finite == 2 and ingest.fleet.nodes["n1"].gpus[0].sample == planned.gpus[0]
        trends = ingest.fleet.nodes["n1"].trends
        assert not trends.groups  # the error counters' rates are the detection process's to keep
        xid = frame(5)
        xid.gpus[0].xid_events.add(code=79, unix_time_seconds=E + 1004.0)
        await ingest.frame("n1", xid)
        assert [x.code for x in trends.xids] == [79]  # XID events stay kept here
        del mirror.frames[-1]
        [(_, _, first), (_, plan, second), (_, _, third)] = mirror.frames
        assert first is received  # nothing screened out: not encoded again
        assert plan.non_finite == {"GpuSample.temperature_celsius": 1}
        sent = pb.TelemetryFrame.FromString(second)
        assert not sent.gpus[0].HasField("temperature_celsius") and sent == dirty
        sent = pb.TelemetryFrame.FromString(third)
        assert not sent.gpus[0].HasField("power_watts") and sent == odd

    with_ingest(body)


def test_hellos_under_way_are_counted_while_they_are_taken_in() -> None:
    """The detection process's copy waits while Hellos are under way (fleet_copy.send_fleet)."""

    async def body(ingest: Ingest) -> None:
        seen: list[int] = []
        save = ingest.store.save_hello

        async def counted(msg: pb.Hello, now: float) -> int:
            seen.append(ingest.hellos_under_way)
            if msg.node == "bad":
                raise StoreUnavailable("the store is gone")
            return await save(msg, now)

        ingest.store.save_hello = counted  # type: ignore[method-assign,assignment]
        await asyncio.gather(ingest.hello(hello("n1")), ingest.hello(hello("n2")))
        with pytest.raises(StoreUnavailable):
            await ingest.hello(hello("bad"))
        assert seen == [1, 2, 1] and ingest.hellos_under_way == 0  # (the second began as the first waited)

    with_ingest(body)
