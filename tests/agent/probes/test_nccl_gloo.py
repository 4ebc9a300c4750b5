"""The all-reduce probe end to end on CPU: two gloo ranks on loopback, as in CI.

The same launcher, rendezvous, timing loop, check and clean-up as on GPUs; only the backend and
the message sizes differ. Faults are injected through the probe's test hook.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from agent.probes.kernel import ProbeError, ProbeParams
from agent.probes.nccl import WORKER_MODULE, NcclProbe
from tests.support import require

CPU = ProbeParams(variant="all_reduce", device="cpu", budget_seconds=2.0)


@pytest.fixture(autouse=True)
def _torch() -> None:
    require(importlib.util.find_spec("torch") is not None, "torch (the CPU build `make test` installs)")


def _ranks_left() -> list[psutil.Process]:
    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            if WORKER_MODULE in " ".join(child.cmdline()):
                left.append(child)
        except psutil.Error:  # exited while we looked
            continue
    return left


def test_two_gloo_ranks_measure_a_plausible_bus_bandwidth() -> None:
    out = NcclProbe().run(CPU)
    p = out.params
    assert (out.probe, out.variant, out.gpu, out.unit, out.device) == (
        "nccl",
        "all_reduce",
        None,
        "GB/s",
        "cpu",
    )
    assert (p["ranks"], p["backend"], p["timing"]) == ("2", "gloo", "perf_counter")
    # Loopback between two processes on one host: well above a slow disk, well below memory speed.
    assert 0.01 < out.value < 200
    sizes = [int(s) for s in p["sizes_bytes"].split(",")]
    busbw = [float(b) for b in p["busbw_gbps_by_size"].split(",")]
    algbw = [float(b) for b in p["algbw_gbps_by_size"].split(",")]
    assert sizes == sorted(sizes) and int(p["size_bytes"]) == sizes[-1] == 8 << 20
    assert busbw == algbw  # two ranks: 2(n-1)/n = 1
    assert out.value == pytest.approx(busbw[-1], abs=0.01)
    assert all(int(i) >= 2 for i in p["iterations_by_size"].split(","))
    assert out.check_passed is True
    assert out.check_relative_error is not None and out.check_relative_error < 1e-5
    assert 0 < float(p["measure_seconds"]) <= 2.0 * 1.5
    assert 0 < out.duration_seconds < 60
    assert _ranks_left() == []


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failing_rank_is_named_with_its_error_and_the_others_are_killed(failing: int) -> None:
    # The other rank fails too (its peer went away) and may exit first: the one that failed first is
    # named, by its own record, whichever the parent saw exit first (see test_nccl.py's blame tests).
    with pytest.raises(ProbeError) as info:
        NcclProbe(inject_fault=f"fail:{failing}").run(CPU)
    assert re.match(
        rf"nccl rank {failing} (exited with status 1|is still exiting): RuntimeError: injected failure",
        str(info.value),
    ), str(info.value)
    assert f"rank {1 - failing}: RuntimeError: injected" not in str(info.value)
    assert _ranks_left() == []


def test_the_failed_rank_is_blamed_even_when_its_peer_exits_first() -> None:
    # The race made certain: rank 1 fails, closes its connections (rank 0 fails: "Connection closed
    # by peer", and exits) and exits 3 s later, after the parent has seen rank 0 exit.
    t0 = time.monotonic()
    with pytest.raises(ProbeError) as info:
        NcclProbe(inject_fault="linger:1").run(CPU)
    text = str(info.value)
    # (a loaded machine may even let it exit before rank 0 does: then it is named all the same)
    named = r"nccl rank 1 (is still exiting|exited with status 1): RuntimeError: injected failure"
    assert re.match(named, text), text
    # gloo says "Connection closed by peer" or "Read error ...: Connection reset by peer"
    assert "(then also failed: rank 0: RuntimeError:" in text and "by peer" in text
    assert time.monotonic() - t0 < 60  # the settle wait is 2 s, then the lingering rank is killed
    assert _ranks_left() == []


def test_a_hung_rank_is_killed_at_the_time_limit() -> None:
    probe = NcclProbe(startup_seconds=5.0, inject_fault="hang:1")
    params = ProbeParams(variant="all_reduce", device="cpu", budget_seconds=0.5)
    t0 = time.monotonic()
    # Rank 1 got past start-up and hung (its last line says so); rank 0 waits in a collective.
    with pytest.raises(ProbeError, match=r"timed out after 6 s .*killed every rank.*rank 1: hanging"):
        probe.run(params)
    elapsed = time.monotonic() - t0
    assert 5.75 <= elapsed < 20.0  # the limit is startup + 1.5 x budget; slack for a loaded machine
    assert _ranks_left() == []


def test_the_check_catches_a_corrupted_sum() -> None:
    out = NcclProbe(inject_fault="corrupt:1").run(dataclasses.replace(CPU, size=1 << 20))
    assert out.check_passed is False
    assert out.check_relative_error == pytest.approx(0.5, rel=1e-3)  # +1 on an element summing to ~2
    assert out.error == "correctness check failed: sum off by a relative 0.5 (band 1e-05)"
    assert out.value > 0 and out.params["sizes_bytes"] == str(1 << 20)  # the figure stays, flagged
    assert _ranks_left() == []


def _cuda_devices() -> int:
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
def test_nccl_across_the_nodes_gpus() -> None:
    n = _cuda_devices()
    if n < 2:
        pytest.skip(f"needs two CUDA GPUs, found {n}")
    out = NcclProbe().run(ProbeParams(variant="all_reduce", device="cuda", gpus=tuple(range(n))))
    p = out.params
    assert (p["backend"], p["timing"], p["ranks"]) == ("nccl", "cuda_events", str(n))
    assert int(p["size_bytes"]) == 1 << 30 and p["nccl_version"]
    assert out.value > 5  # GB/s: even PCIe without peer-to-peer beats this; NVLink is ~100x more
    assert out.check_passed is True
    assert _ranks_left() == []


@pytest.mark.gpu
def test_nccl_path_on_one_gpu() -> None:
    """The lent machines have one GPU: one rank exercises NCCL, CUDA events and clean-up; its bus
    bandwidth is 0 by definition, so the probe only runs it when told `min_ranks=1`."""
    if _cuda_devices() < 1:
        pytest.skip("needs a CUDA GPU")
    out = NcclProbe(min_ranks=1).run(ProbeParams(variant="all_reduce", device="cuda", gpus=(0,)))
    assert (out.params["ranks"], out.params["backend"]) == ("1", "nccl")
    assert out.value == 0.0 and float(out.params["algbw_gbps"]) > 0
    assert out.check_passed is True
    assert _ranks_left() == []


def test_ranks_do_not_outlive_a_killed_probe_process() -> None:
    # The worker client kills the probe worker's process group when a step hangs; the ranks run in
    # sessions of their own, so they must notice that their parent is gone and exit.
    code = (
        "from agent.probes.kernel import ProbeParams\n"
        "from agent.probes.nccl import NcclProbe\n"
        "NcclProbe(startup_seconds=120.0, inject_fault='hang:1').run(\n"
        "    ProbeParams(variant='all_reduce', device='cpu', budget_seconds=0.5))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    ranks: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 30
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            ranks = [
                p for p in psutil.Process(parent.pid).children() if WORKER_MODULE in " ".join(p.cmdline())
            ]
        assert len(ranks) == 2
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10  # without the watch: startup + 1.5 x budget + 15 s
        while _living(ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _living(ranks) == []
    finally:
        for rank in ranks:
            with contextlib.suppress(psutil.Error):
                rank.kill()
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()


def _living(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes still running (a zombie waiting for init to reap it has exited)."""
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out
