"""The all-reduce probe's arithmetic and argument checks: no process is started here."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from agent.probes.kernel import REGISTRY, ProbeError, ProbeParams
from agent.probes.nccl import (
    GIB,
    MIB,
    NcclProbe,
    _Launch,
    _tail,
    algbw_gbps,
    busbw_gbps,
    failure_record,
    failure_record_path,
    max_safe_iterations,
    plan_iterations,
    summarise,
)


def test_registered_as_a_node_level_probe() -> None:
    probe = REGISTRY["nccl"]()
    assert probe.name == "nccl" and probe.node_level
    assert probe.variants("cpu") == ["all_reduce"]


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    # busbw = algbw x 2(n-1)/n: 8 ranks -> x1.75, 2 ranks -> x1, 1 rank moves nothing.
    assert busbw_gbps(100.0, 8) == pytest.approx(175.0)
    assert busbw_gbps(100.0, 4) == pytest.approx(150.0)
    assert busbw_gbps(100.0, 2) == pytest.approx(100.0)
    assert busbw_gbps(100.0, 1) == 0.0
    with pytest.raises(ValueError, match="ranks"):
        busbw_gbps(100.0, 0)


def test_algorithm_bandwidth_is_bytes_per_second_in_gb() -> None:
    assert algbw_gbps(GIB, 1.0) == pytest.approx(1.073741824)
    assert algbw_gbps(8 * MIB, 0.001) == pytest.approx(8.388608)
    for size, seconds in ((GIB, 0.0), (GIB, -1.0), (0, 1.0)):
        with pytest.raises(ValueError, match="positive"):
            algbw_gbps(size, seconds)


def _rank(rank: int, seconds: list[float], sizes: list[int] | None = None) -> dict[str, Any]:
    return {
        "rank": rank,
        "sizes_bytes": sizes or [GIB, 8 * MIB],  # the worker runs the largest size first
        "seconds_per_op": seconds,
        "iterations": [20, 20],
    }


def test_summary_averages_the_ranks_and_sorts_by_size() -> None:
    figures = summarise([_rank(0, [0.010, 0.0002]), _rank(1, [0.012, 0.0002])] * 4)  # 8 ranks
    assert [f.size_bytes for f in figures] == [8 * MIB, GIB]
    big = figures[1]
    assert big.seconds == pytest.approx(0.011)
    assert big.algbw_gbps == pytest.approx(GIB / 0.011 / 1e9)
    assert big.busbw_gbps == pytest.approx(big.algbw_gbps * 1.75)
    assert big.iterations == 20


def test_summary_refuses_ranks_that_ran_different_things() -> None:
    with pytest.raises(ProbeError, match="disagree"):
        summarise([_rank(0, [0.01, 0.01]), _rank(1, [0.01, 0.01], sizes=[GIB, 16 * MIB])])


def test_iterations_fit_the_allowance_and_stay_finite() -> None:
    assert plan_iterations(0.004, 1.0, 20) == 20
    assert plan_iterations(0.1, 1.0, 20) == 10
    assert plan_iterations(2.0, 1.0, 20) == 0
    assert plan_iterations(0.0, 1.0, 20) == 20
    # In-place sums multiply the data by n per op; float32 overflows past 2^128.
    assert max_safe_iterations(2) == 100
    assert max_safe_iterations(8) == 33
    assert 8.0 ** max_safe_iterations(8) < 2.0**128


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (ProbeParams(variant="bf16", device="cpu"), "no variant 'bf16'"),
        (ProbeParams(variant="all_reduce", device="tpu"), "device must be"),
        (ProbeParams(variant="all_reduce", device="cpu", budget_seconds=0), "budget_seconds"),
        (ProbeParams(variant="all_reduce", device="cuda", gpus=(0,)), "at least 2 GPUs, got 1"),
        (ProbeParams(variant="all_reduce", device="cuda", gpus=(0, 0)), "distinct"),
        (ProbeParams(variant="all_reduce", device="cuda", gpus=(0, -1)), "non-negative"),
        (ProbeParams(variant="all_reduce", device="cpu", size=6), "multiple of 4 bytes, not 6"),
        (ProbeParams(variant="all_reduce", device="cpu", size=0), "multiple of 4 bytes, not 0"),
    ],
)
def test_bad_requests_are_refused_before_any_process_starts(params: ProbeParams, message: str) -> None:
    with pytest.raises(ProbeError, match=message):
        NcclProbe().run(params)


def test_bad_construction_is_refused() -> None:
    with pytest.raises(ValueError, match="min_ranks"):
        NcclProbe(min_ranks=0)
    for sizes in ([2], [1 << 20, 6], []):
        with pytest.raises(ValueError, match="sizes"):
            NcclProbe(sizes=sizes)


def test_a_ranks_error_is_its_closing_line(tmp_path: Path) -> None:
    log = tmp_path / "rank1.log"
    log.write_text(
        "Traceback (most recent call last):\n  File x, line 1\nRuntimeError: boom\n"
        "nccl_worker rank 1: RuntimeError: NCCL error: unhandled system error\n"
    )
    assert _tail(log) == "RuntimeError: NCCL error: unhandled system error"
    log.write_text("Fatal Python error: Segmentation fault\n\nthread 1\n  File a\n")
    assert _tail(log) == "Fatal Python error: Segmentation fault | thread 1 | File a"
    assert _tail(tmp_path / "missing.log") == ""


class FakeRank:
    """A rank process as _Launch sees it: poll() gives its exit status (None: running)."""

    def __init__(self, code: int | None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


def launch(tmp_path: Path, ranks: int) -> _Launch:
    return _Launch(
        tmp=tmp_path,
        backend="gloo",
        gpus=[-1] * ranks,
        sizes=[1 << 20],
        budget=1.0,
        max_iters=20,
        check_bytes=1 << 20,
        limit=30.0,
        inject_fault="",
    )


def rank_failed(tmp_path: Path, rank: int, exc: BaseException, at: float) -> None:
    """What a failing nccl_worker leaves: its failure record and its closing line."""
    record = failure_record(rank, exc, at)
    failure_record_path(tmp_path / f"rank{rank}.json").write_text(json.dumps(record))
    (tmp_path / f"rank{rank}.log").write_text(f"nccl_worker rank {rank}: {record['error']}\n")


GLOO_PEER_GONE = RuntimeError(
    "[third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:59595. "
    "This is typically caused by a remote worker crashing."
)


def blame(tmp_path: Path, codes: list[int | None], exited: dict[int, float]) -> str:
    procs: Any = [FakeRank(c) for c in codes]
    logs = [tmp_path / f"rank{r}.log" for r in range(len(codes))]
    return launch(tmp_path, len(codes))._blame(procs, logs, exited)


def test_a_peer_gone_error_is_recognised() -> None:
    assert failure_record(0, GLOO_PEER_GONE, 1.0)["peer"] is True
    nccl = RuntimeError("NCCL error: remote process exited or there was a network error")
    assert failure_record(0, nccl, 1.0)["peer"] is True
    own = failure_record(1, RuntimeError("injected failure (test hook)"), 2.5)
    assert own == {"rank": 1, "error": "RuntimeError: injected failure (test hook)", "peer": False, "at": 2.5}


def test_the_rank_that_failed_is_blamed_not_the_peer_seen_exiting_first(tmp_path: Path) -> None:
    # Rank 1 failed (its record at t=10), rank 0 lost its peer (t=11) and exited first; rank 1 has
    # exited by now too. Index order, exit order and poll order would all name rank 0.
    rank_failed(tmp_path, 1, RuntimeError("injected failure (test hook)"), at=10.0)
    rank_failed(tmp_path, 0, GLOO_PEER_GONE, at=11.0)
    text = blame(tmp_path, [1, 1], exited={0: 11.1, 1: 11.2})
    assert text.startswith("nccl rank 1 exited with status 1: RuntimeError: injected failure (test hook)")
    assert "(then also failed: rank 0: RuntimeError: [third_party/gloo" in text


def test_a_failed_rank_still_exiting_is_blamed_by_its_record(tmp_path: Path) -> None:
    rank_failed(tmp_path, 1, RuntimeError("injected failure (test hook)"), at=10.0)
    rank_failed(tmp_path, 0, GLOO_PEER_GONE, at=11.0)
    text = blame(tmp_path, [1, None], exited={0: 11.1})
    assert text.startswith("nccl rank 1 is still exiting: RuntimeError: injected failure")


def test_own_errors_go_before_peer_errors_then_the_earliest(tmp_path: Path) -> None:
    # A peer-gone error recorded first (clock skew cannot happen on one host, but the words decide
    # before the time does) and two own errors: the earlier own error is blamed.
    rank_failed(tmp_path, 0, GLOO_PEER_GONE, at=5.0)
    rank_failed(tmp_path, 1, RuntimeError("CUDA error: an illegal memory access"), at=7.0)
    rank_failed(tmp_path, 2, RuntimeError("CUDA error: out of memory"), at=6.0)
    text = blame(tmp_path, [1, 1, 1], exited={0: 8.0, 1: 8.0, 2: 8.0})
    assert text.startswith("nccl rank 2 exited with status 1: RuntimeError: CUDA error: out of memory")
    assert text.index("rank 1:") < text.index("rank 0:")


def test_a_rank_killed_without_a_record_is_blamed_before_its_peers(tmp_path: Path) -> None:
    # Rank 1 segfaulted (no record, only what the interpreter printed); rank 0 saw the peer go.
    (tmp_path / "rank1.log").write_text("Fatal Python error: Segmentation fault\n")
    rank_failed(tmp_path, 0, GLOO_PEER_GONE, at=3.0)
    text = blame(tmp_path, [1, -signal.SIGSEGV], exited={0: 3.1, 1: 3.3})
    assert text.startswith("nccl rank 1 exited with signal SIGSEGV: Fatal Python error: Segmentation fault")
