"""Store.load brings the newest probe results of each key back into Fleet.history (own-history
baselines survive a controller restart)."""

from __future__ import annotations

import asyncio

from controller.fleet.model import HISTORY_POINTS, Fleet, FrameWrite, ProbeRecord
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.store.test_store import hello


def probe_write(seq: int) -> FrameWrite:
    """Frame `seq`: a GPU gemm result and a node-level nccl result."""
    time = 1000.0 + seq
    gemm = ProbeRecord(
        "n1",
        0,
        "gemm",
        "bf16",
        700.0 + seq,
        "TFLOP/s",
        time,
        pb.ProbeResult(probe="gemm").SerializeToString(),
    )
    nccl = ProbeRecord(
        "n1",
        None,
        "nccl",
        "all_reduce",
        400.0 + seq,
        "GB/s",
        time,
        pb.ProbeResult(probe="nccl").SerializeToString(),
    )
    return FrameWrite("n1", "b1", seq, time, probes=[gemm, nccl])


def test_load_brings_back_the_newest_results_of_each_key_oldest_first(store_db: str) -> None:
    async def body() -> Fleet:
        store = Store(store_db)
        await store.open()
        await store.save_hello(hello(), 1000.0)
        for seq in range(HISTORY_POINTS + 10, 0, -1):  # stored newest first: load orders them
            await store.save_frame(probe_write(seq))
        store.close()
        store = Store(store_db)
        await store.open()
        try:
            fleet, _ = await store.load()
        finally:
            store.close()
        return fleet

    fleet = asyncio.run(body())
    assert set(fleet.history) == {("n1", 0, "gemm", "bf16"), ("n1", None, "nccl", "all_reduce")}
    gemm = list(fleet.history[("n1", 0, "gemm", "bf16")])
    assert len(gemm) == HISTORY_POINTS
    assert gemm[0] == (1011.0, 711.0) and gemm[-1] == (1000.0 + HISTORY_POINTS + 10, 710.0 + HISTORY_POINTS)
    assert [t for t, _ in gemm] == sorted(t for t, _ in gemm)
    nccl = fleet.history[("n1", None, "nccl", "all_reduce")]
    assert nccl.maxlen == HISTORY_POINTS and nccl[-1][1] == 400.0 + HISTORY_POINTS + 10
