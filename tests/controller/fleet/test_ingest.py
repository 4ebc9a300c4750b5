"""Ingest: dedupe by (node, boot, seq), refuse what contradicts the stream, ack only what is stored."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import pytest

from controller.errors import InvalidMessage, SequenceGap, StoreUnavailable
from controller.fleet.ingest import Ingest
from controller.fleet.model import Fleet
from controller.store.sqlite import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb


def hello(node: str = "n1", boot: str = "b1") -> pb.Hello:
    msg = pb.Hello(node=node, boot_id=boot)
    msg.inventory.gpus.add(index=0, name="NVIDIA H100 80GB HBM3")
    return msg


def frame(
    seq: int, node: str = "n1", boot: str = "b1", floor: int = 0, t: float = 1000.0
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
            await body(Ingest(Fleet(), store, clock=lambda: 5000.0))
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


def test_nan_readings_are_missing_and_nan_probes_never_baseline() -> None:
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

    with_ingest(body)


def test_replayed_older_boot_does_not_overwrite_fresher_state() -> None:
    async def body(ingest: Ingest) -> None:
        await ingest.hello(hello(boot="new"))
        await ingest.frame("n1", frame(1, boot="new", t=2000.0))
        assert await ingest.frame("n1", frame(5, boot="old", floor=5, t=100.0)) == 5
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
