"""TorchProbes: the real worker on the CPU, and GPU paths through a stand-in worker and fake GPUs."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.probes.base import ProbeOutcome
from agent.probes.runner import TorchProbes
from agent.probes.worker import NO_CUDA
from agent.probes.worker_client import Timeouts, WorkerError, run_worker
from tests.agent.probes.fakes import H100, Gpus, fake_worker, outcome

MIB = 1024**2
SMALL = {"gemm": 128, "membw": 4 * MIB, "pcie": 4 * MIB}
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


@needs_torch
def test_cpu_run_through_the_worker_keeps_to_the_budget() -> None:
    seen: list[str] = []
    runner = TorchProbes(
        "cpu", sizes=SMALL, budgets={"short": 2.0}, progress=lambda o: seen.append(o.variant)
    )
    outcomes = runner.run(["gemm", "membw", "pcie"], command_id="cmd-7")
    assert [(o.probe, o.variant) for o in outcomes] == [
        ("gemm", "fp32"),
        ("gemm", "bf16"),
        ("membw", "d2d"),
        ("pcie", "h2h"),
    ]
    assert seen == ["fp32", "bf16", "d2d", "h2h"]  # progress as each arrived
    for o in outcomes:
        assert o.error == "" and o.value > 0 and o.check_passed is True
        assert (o.device, o.gpu, o.command_id, o.simulated) == ("cpu", None, "cmd-7", False)
        assert o.during is None and o.peak_ratio is None  # no NVML and no datasheet on a CPU
    assert [o.mode for o in outcomes] == ["concurrent", "concurrent", "isolated", "isolated"]
    # the budget is per device for the whole run; shares plan 65% of it here, overruns are small
    assert sum(o.duration_seconds for o in outcomes) <= 2.0
    assert runner.hello["torch"] and runner.hello["devices"][0]["device"] == "cpu"


def test_unknown_probes_suites_and_gpus_are_refused_before_anything_runs() -> None:
    runner = TorchProbes("cpu")
    with pytest.raises(ValueError, match="unknown probe"):
        runner.run(["warp_drive"])
    with pytest.raises(ValueError, match="unknown suite"):
        runner.run([], suite="long")
    with pytest.raises(ValueError, match="no GPUs"):
        runner.run([], gpus=[0])
    gpus = Gpus(2)
    with pytest.raises(ValueError, match="no GPU 7"):
        TorchProbes(open_source=gpus.open).run([], gpus=[7])
    with pytest.raises(ValueError, match="without NVML"):
        TorchProbes().run([])  # cuda without NVML: cannot tell the GPUs are idle


def hello(*names: str) -> dict[str, Any]:
    devices = [
        {
            "device": f"cuda:{i}",
            "name": name,
            "uuid": "",
            "variants": {"gemm": ["bf16", "fp8"], "pcie": ["h2d"]},
        }
        for i, name in enumerate(names)
    ]
    return {"event": "hello", "torch": "2.13.0", "device": "cuda", "devices": devices}


def plan(*steps: tuple[str, str, list[str], bool]) -> dict[str, Any]:
    return {
        "event": "plan",
        "steps": [
            {
                "probe": p,
                "variant": v,
                "devices": d,
                "node_level": n,
                "mode": "concurrent" if p in ("gemm", "nccl") else "isolated",
                "budget_seconds": 0.2,
            }
            for p, v, d, n in steps
        ],
    }


def test_gpu_results_get_nvml_numbers_readings_and_peaks(tmp_path: Path) -> None:
    gpus = Gpus(4)
    gpus.foreign = {1: [4242]}  # GPU 1 runs someone's job
    uuids = [g.uuid for g in gpus.inventory().gpus]
    events = [
        hello(H100, H100),
        plan(("gemm", "bf16", ["cuda:0", "cuda:1"], False), ("pcie", "h2d", ["cuda:0", "cuda:1"], False)),
        {"event": "start", "step": 0},
        {"sleep": 0.35},
        {"event": "outcome", "step": 0, "outcome": outcome("gemm", "bf16", "cuda:0", 700.0)},
        {"event": "outcome", "step": 0, "outcome": outcome("gemm", "bf16", "cuda:1", 650.0)},
        {"event": "start", "step": 1},
        {"event": "outcome", "step": 1, "outcome": outcome("pcie", "h2d", "cuda:0", 50.0)},
        {"event": "outcome", "step": 1, "outcome": outcome("pcie", "h2d", "cuda:1", 0.0, error="boom")},
        {"event": "done"},
    ]
    runner = TorchProbes(open_source=gpus.open, python=fake_worker(tmp_path, events), sample_interval=0.05)
    outcomes = runner.run(["gemm", "pcie"], gpus=[0, 1, 3], command_id="c1")
    assert gpus.opened == [True, False]  # complete reads for the checks, cheap ones while sampling
    assert gpus.closed == 2
    ran = [(o.probe, o.gpu, o.device) for o in outcomes if not o.error.startswith("refused")]
    assert ran == [("gemm", 0, "cuda:0"), ("gemm", 3, "cuda:3"), ("pcie", 0, "cuda:0"), ("pcie", 3, "cuda:3")]
    first = outcomes[0]
    # the worker saw GPUs 0 and 3 only, by UUID
    assert first.params["visible"] == f"{uuids[0]},{uuids[3]}"
    assert first.peak_ratio == pytest.approx(700.0 / 989.4)
    assert first.params["model"] == H100
    assert first.during is not None and first.during.index == 0
    assert int(first.params["during_samples"]) >= 2
    pcie = outcomes[2]
    link = pcie.params
    assert (link["link_gen_max"], link["link_width_max"]) == ("5", "16")
    assert link["link_gen"] == "1"  # an idle simulated link trains down; read during the copy
    assert pcie.peak_ratio == pytest.approx(50.0 / (3.938 * 16))  # against the GPU's best link
    assert float(link["link_ratio"]) == pytest.approx(50.0 / (0.25 * 16))
    assert outcomes[3].error == "boom" and outcomes[3].peak_ratio is None
    refused = [(o.probe, o.variant, o.gpu) for o in outcomes if o.error.startswith("refused")]
    assert refused == [("gemm", "bf16", 1), ("gemm", "fp8", 1), ("pcie", "h2d", 1)]  # variants as H100s have
    assert all(o.command_id == "c1" and not o.simulated for o in outcomes)


def test_devices_are_matched_by_uuid_before_position(tmp_path: Path) -> None:
    gpus = Gpus(4)
    uuids = [g.uuid for g in gpus.inventory().gpus]
    greeting = hello(H100, H100)
    greeting["devices"][0]["uuid"], greeting["devices"][1]["uuid"] = (
        uuids[3],
        uuids[0],
    )  # listed the other way
    events = [
        greeting,
        plan(("gemm", "bf16", ["cuda:0", "cuda:1"], False)),
        {"event": "start", "step": 0},
        {"event": "outcome", "step": 0, "outcome": outcome("gemm", "bf16", "cuda:0", 700.0)},
        {"event": "outcome", "step": 0, "outcome": outcome("gemm", "bf16", "cuda:1", 650.0)},
        {"event": "done"},
    ]
    runner = TorchProbes(open_source=gpus.open, python=fake_worker(tmp_path, events))
    outcomes = runner.run(["gemm"], gpus=[0, 3])
    assert [(o.gpu, o.value) for o in outcomes] == [(3, 700.0), (0, 650.0)]


def test_a_node_level_probe_asked_for_on_one_gpu_says_why_it_did_not_run(tmp_path: Path) -> None:
    gpus = Gpus(4)
    events = [
        hello(H100),
        plan(("gemm", "bf16", ["cuda:0"], False)),  # the worker plans no all-reduce on one GPU
        {"event": "start", "step": 0},
        {"event": "outcome", "step": 0, "outcome": outcome("gemm", "bf16", "cuda:0", 700.0)},
        {"event": "done"},
    ]
    runner = TorchProbes(open_source=gpus.open, python=fake_worker(tmp_path, events))
    outcomes = runner.run(["gemm", "nccl"], gpus=[2], command_id="c9")
    assert [(o.probe, o.gpu, o.error) for o in outcomes] == [
        ("gemm", 2, ""),
        ("nccl", None, "nccl needs 2 or more GPUs; only GPU 2 may be probed now"),
    ]
    assert outcomes[1].command_id == "c9" and outcomes[1].mode == "concurrent"


def test_a_node_level_result_names_the_gpus_as_nvml_numbers_them(tmp_path: Path) -> None:
    gpus = Gpus(4)
    body = outcome("nccl", "all_reduce", "cuda", 300.0)
    body["params"] = {"gpus": "0,1", "ranks": "2"}  # the ranks' CUDA indices, in the worker
    events = [
        hello(H100, H100),
        plan(("nccl", "all_reduce", ["cuda:0", "cuda:1"], True)),
        {"event": "start", "step": 0},
        {"event": "outcome", "step": 0, "outcome": body},
        {"event": "done"},
    ]
    runner = TorchProbes(open_source=gpus.open, python=fake_worker(tmp_path, events))
    (result,) = runner.run(["nccl"], gpus=[2, 3])
    assert (result.gpu, result.device, result.params["gpus"]) == (None, "cuda", "2,3")


def test_refused_everywhere_runs_nothing_and_force_goes_on(tmp_path: Path) -> None:
    gpus = Gpus(2)
    gpus.busy = {0: 0.9, 1: 0.5}
    marker = tmp_path / "ran"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\nexit 3\n")
    python.chmod(0o755)
    runner = TorchProbes(open_source=gpus.open, python=str(python))
    outcomes = runner.run(["membw", "nccl"])
    by = {(o.probe, o.gpu): o.error for o in outcomes}
    assert by[("membw", 0)].startswith("refused: GPU 0 is 90% busy")
    assert by[("membw", 1)].startswith("refused: GPU 1 is 50% busy")
    assert by[("nccl", None)].startswith("refused: no GPU of the node may be probed now")
    assert marker.exists()  # only to learn the variants: it failed, so they are left empty
    assert {o.variant for o in outcomes if o.probe == "membw"} == {""}
    with pytest.raises(WorkerError, match="exited with status 3"):
        runner.run(["membw"], force=True)  # force skips the checks and starts the worker


def test_a_hung_worker_is_killed_and_every_step_is_accounted_for(tmp_path: Path) -> None:
    events = [
        hello("cpu"),
        plan(
            ("membw", "d2d", ["cpu"], False),
            ("pcie", "h2h", ["cpu"], False),
            ("nccl", "all_reduce", ["cpu"], True),
        ),
        {"event": "start", "step": 0},
        {"event": "outcome", "step": 0, "outcome": outcome("membw", "d2d", "cpu", 10.0)},
        {"event": "start", "step": 1},
    ]
    runner = TorchProbes(
        "cpu",
        python=fake_worker(tmp_path, events, hang=True),
        timeouts=Timeouts(startup_seconds=10, grace_seconds=0.3),
    )
    start = time.monotonic()
    outcomes = runner.run([])
    assert time.monotonic() - start < 9  # the hang is cut at its budget + 0.3 s, not the 10 s start-up limit
    assert [o.probe for o in outcomes] == ["membw", "pcie", "nccl"]
    assert outcomes[0].error == ""
    assert outcomes[1].error.startswith("timed out: no result within its budget plus 0.3 s")
    assert outcomes[2].error.startswith("not run: an earlier probe failed")
    assert outcomes[2].device == "cpu" and outcomes[2].mode == "concurrent"


def test_a_hung_worker_on_some_gpus_keeps_the_results_that_arrived(tmp_path: Path) -> None:
    # The results that arrived were renumbered to NVML's GPUs (2, 3) as they came; the ones made up
    # for the killed worker must be matched against the worker's own numbering (cuda:0, cuda:1).
    gpus = Gpus(4)
    events = [
        hello(H100, H100),
        plan(("gemm", "bf16", ["cuda:0", "cuda:1"], False), ("pcie", "h2d", ["cuda:0", "cuda:1"], False)),
        {"event": "start", "step": 0},
        {"event": "outcome", "step": 0, "outcome": outcome("gemm", "bf16", "cuda:0", 700.0)},
        {"event": "outcome", "step": 0, "outcome": outcome("gemm", "bf16", "cuda:1", 650.0)},
        {"event": "start", "step": 1},
        {"event": "outcome", "step": 1, "outcome": outcome("pcie", "h2d", "cuda:1", 50.0)},
    ]
    runner = TorchProbes(
        open_source=gpus.open,
        python=fake_worker(tmp_path, events, hang=True),
        timeouts=Timeouts(startup_seconds=10, grace_seconds=0.3),
    )
    outcomes = runner.run(["gemm", "pcie"], gpus=[2, 3])
    got = [(o.probe, o.gpu, o.error.split(":")[0]) for o in outcomes]
    assert got == [("gemm", 2, ""), ("gemm", 3, ""), ("pcie", 3, ""), ("pcie", 2, "timed out")]


def test_an_isolated_step_has_its_budget_for_each_of_its_gpus(tmp_path: Path) -> None:
    # membw runs its GPUs one at a time: three GPUs take three budgets, and that is no hang.
    step = {
        "probe": "membw",
        "variant": "d2d",
        "devices": ["cuda:0", "cuda:1", "cuda:2"],
        "node_level": False,
        "mode": "isolated",
        "budget_seconds": 0.5,
    }
    events: list[dict[str, Any]] = [hello(H100, H100, H100), {"event": "plan", "steps": [step]}]
    events.append({"event": "start", "step": 0})
    for i in range(3):
        events += [
            {"sleep": 0.5},
            {"event": "outcome", "step": 0, "outcome": outcome("membw", "d2d", f"cuda:{i}", 3000.0)},
        ]
    events.append({"event": "done"})
    run = run_worker(
        {"device": "cuda"},
        python=fake_worker(tmp_path, events),
        timeouts=Timeouts(startup_seconds=10, grace_seconds=0.6),
    )
    assert [(o.device, o.error) for _, o in run.outcomes] == [("cuda:0", ""), ("cuda:1", ""), ("cuda:2", "")]


def test_a_worker_that_dies_says_so_with_its_stderr(tmp_path: Path) -> None:
    events = [hello("cpu"), plan(("membw", "d2d", ["cpu"], False)), {"event": "start", "step": 0}]
    outcomes = TorchProbes("cpu", python=fake_worker(tmp_path, events, code=9)).run(["membw"])
    assert len(outcomes) == 1
    assert "exited with status 9" in outcomes[0].error and "a line on stderr" in outcomes[0].error


def test_a_fatal_worker_raises(tmp_path: Path) -> None:
    events = [{"event": "fatal", "error": NO_CUDA}]
    with pytest.raises(WorkerError, match=NO_CUDA):
        TorchProbes("cpu", python=fake_worker(tmp_path, events, code=1)).run([])


IDLE_WAIT_SECONDS = 20.0


@pytest.mark.gpu
def test_real_gpu_end_to_end() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    from agent.compose.probes import open_nvml
    from agent.sources.errors import SourceError

    try:
        open_nvml(False).close()
    except SourceError as exc:
        pytest.skip(f"no NVML: {exc}")
    # Run after the other gpu tests, the GPU still read busy from their kernels (NVML's utilization
    # is over its last sample period, about a second): it skipped so on 2026-11-28 and 11-30 (H200).
    # So the busy refusal is waited out, up to IDLE_WAIT_SECONDS, before it is taken as another user.
    waited = 0.0
    while True:
        outcomes = TorchProbes(open_source=open_nvml).run(["gemm", "membw", "pcie"], gpus=[0], command_id="g")
        if not all(o.error.startswith("refused") for o in outcomes):
            break
        if waited >= IDLE_WAIT_SECONDS:
            pytest.skip(f"GPU 0 is busy after {waited:.0f} s: {outcomes[0].error}")
        time.sleep(2.0)
        waited += 2.0
    for o in outcomes:
        assert o.error == "", o.error
        assert (o.gpu, o.device, o.command_id) == (0, "cuda:0", "g")
        assert o.during is not None and o.during.sm_clock_hz
        assert o.peak_ratio is None or 0.05 < o.peak_ratio < 1.2
    pcie = [o for o in outcomes if o.probe == "pcie"]
    assert all("link_gen" in o.params for o in pcie)
    assert sum(o.duration_seconds for o in outcomes) <= 10.0


def test_close_kills_a_run_in_progress_and_the_run_returns_what_arrived(tmp_path: Path) -> None:
    """The agent shutting down mid-run: close() from another thread ends the worker at once."""
    events = [
        hello("cpu"),
        plan(("membw", "d2d", ["cpu"], False), ("pcie", "h2h", ["cpu"], False)),
        {"event": "start", "step": 0},
        {"event": "outcome", "step": 0, "outcome": outcome("membw", "d2d", "cpu", 10.0)},
        {"event": "start", "step": 1},
    ]
    arrived = threading.Event()
    runner = TorchProbes(
        "cpu",
        python=fake_worker(tmp_path, events, hang=True),
        timeouts=Timeouts(startup_seconds=120, grace_seconds=120),  # nothing but close() ends it soon
        progress=lambda _: arrived.set(),
    )
    result: list[list[ProbeOutcome]] = []
    thread = threading.Thread(target=lambda: result.append(runner.run([])))
    start = time.monotonic()
    thread.start()
    assert arrived.wait(30)
    runner.close()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - start < 30
    outcomes = result[0]
    assert [o.probe for o in outcomes] == ["membw", "pcie"]
    assert outcomes[0].error == "" and outcomes[0].value == 10.0
    assert "exited with status -9" in outcomes[1].error
    runner.close()  # again, with nothing running: harmless
