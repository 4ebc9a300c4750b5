"""Several detection processes (controller/detection/pool.py, detect.processes): each pass's
detectors shared out by their last times, the processes' findings merged into exactly what one
process (or the detectors run here) reports; a process that dies fails the pass, and only it is
started again."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.detect.base import DetectContext, discover
from controller.detect.runner import run_detectors
from controller.detection.pool import DetectionPool, share_out
from controller.detection.process import DetectionUnavailable
from tests.controller.harness import config, frame, hello, running_controller
from tests.simfleet import SimFleet

FAULTS = {
    "node-01": [FaultSpec("power_cap", 0)],
    "node-03": [FaultSpec("thermal_throttle", 6)],
    "node-05": [FaultSpec("pcie_downtrained", 1)],
    "node-06": [FaultSpec("nvlink_crc_errors", 2)],
}


def test_detectors_are_shared_out_longest_first_onto_the_least_loaded() -> None:
    names = ["a", "b", "c", "d", "e"]
    durations = {"a": 5.0, "b": 3.0, "c": 2.0, "d": 1.0}  # e not timed yet: the mean, 2.75
    # a 5 | b 3, e 5.75 | c onto a: 7 | d onto b and e: 6.75
    assert share_out(names, durations, 2) == [["a", "c"], ["b", "d", "e"]]
    assert share_out(names, {}, 2) == [["a", "c", "e"], ["b", "d"]]  # untimed: in turn
    assert share_out(names, durations, 1) == [names]
    parts = share_out(names, durations, 7)
    assert sorted(n for part in parts for n in part) == names and [] in parts


def test_a_pool_reports_what_the_detectors_find_here_pass_after_pass() -> None:
    async def go() -> None:
        sim = SimFleet(8, FAULTS)
        config = DetectConfig()
        names = config.enabled(sorted(discover()))
        pool = DetectionPool(config, names, 3)
        sim.step(10.0)
        await pool.start(sim.fleet)
        try:
            assert pool.running and pool.starts == 3
            sim.step(10.0, probes=True, mirror=pool)
            for passes in range(3):
                for _ in range(3):
                    sim.step(10.0, mirror=pool)
                here = run_detectors(DetectContext(sim.fleet, config, sim.now), names)
                there = await pool.run_pass(sim.now)
                assert there.findings == here.findings, f"pass {passes}"
                assert set(there.durations) == set(names) and not there.failed
            causes = {(f.node, f.cause) for f in there.findings}
            assert {("node-01", "power_cap"), ("node-03", "thermal_throttle")} <= causes, causes
            assert all(share_out(names, pool.durations, 3))  # every process has detectors to run
        finally:
            await pool.stop()
        assert not any(process.running for process in pool.processes)

    asyncio.run(go())


def test_a_dead_process_fails_the_pass_and_only_it_starts_again() -> None:
    async def go() -> None:
        sim = SimFleet(4, {"node-01": [FaultSpec("power_cap", 0)]})
        for _ in range(3):
            sim.step(10.0)
        pool = DetectionPool(DetectConfig(), ["throttle", "xid"], 2)
        await pool.start(sim.fleet)
        try:
            first, second = pool.processes
            os.kill(second._process.pid if second._process else 0, signal.SIGKILL)
            with pytest.raises(DetectionUnavailable):
                await asyncio.wait_for(pool.run_pass(sim.now), 10)
            assert not pool.running and first.running
            await pool.start(sim.fleet)
            assert (first.starts, second.starts) == (1, 2)
            report = await pool.run_pass(sim.now)
            assert {(f.node, f.cause) for f in report.findings} == {("node-01", "power_cap")}
        finally:
            await pool.stop()

    asyncio.run(go())


def test_the_controller_runs_detect_processes_of_them() -> None:
    with pytest.raises(ValueError, match=r"detect.processes must be within 1..16"):
        DetectConfig(processes=0)
    with pytest.raises(ValueError, match=r"detect.processes must be within 1..16"):
        DetectConfig(processes=17)

    async def go() -> None:
        cfg = config(detect=DetectConfig(processes=2))
        async with running_controller(cfg) as running:
            app = running.app
            await app.start_detection_process()
            try:
                assert app.detection is not None and len(app.detection.processes) == 2
                await app.ingest.hello(hello("n1"))
                await app.ingest.frame("n1", frame(1, "n1"))
                report = await app.detection_pass()
                assert set(report.durations) == set(app.detectors) and not report.failed
                assert app.detection.starts == 2
            finally:
                await app.detection.stop() if app.detection else None

    asyncio.run(go())
