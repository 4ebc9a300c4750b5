"""The all-reduce probe's arithmetic and argument checks: no process is started here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.probes.kernel import REGISTRY, ProbeError, ProbeParams
from agent.probes.nccl import (
    GIB,
    MIB,
    NcclProbe,
    _tail,
    algbw_gbps,
    busbw_gbps,
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
