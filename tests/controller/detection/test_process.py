"""The detection process (controller/detection/): fed the changes the controller applies, in order,
its passes find exactly what the detectors find on the controller's own fleet; a process that dies
fails its pass, and the next starts a new one from the controller's fleet."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from agent.sources.sim import FaultSpec
from controller import event_loop
from controller.config import DetectConfig
from controller.detect.base import DetectContext, discover
from controller.detect.runner import run_detectors
from controller.detection.process import DetectionProcess, DetectionUnavailable
from tests.controller.loops import FORKS, LOOPS, pipe_capacity
from tests.simfleet import SimFleet

FAULTS = {
    "node-01": [FaultSpec("power_cap", 0)],
    "node-03": [FaultSpec("thermal_throttle", 6)],
    "node-05": [FaultSpec("pcie_downtrained", 1)],
}


@pytest.mark.parametrize("loop", LOOPS)
def test_the_process_finds_what_the_detectors_find_here(loop: str) -> None:
    async def go() -> None:
        forks = len(FORKS)
        sim = SimFleet(8, FAULTS)
        config = DetectConfig()
        names = config.enabled(sorted(discover()))
        process = DetectionProcess(config, names)
        sim.step(10.0)  # some state before the process starts: it gets a copy
        await process.start(sim.fleet)
        assert process.pipe_bytes == pipe_capacity()  # every frame's change goes through it
        try:
            sim.step(10.0, probes=True, mirror=process)
            for _ in range(4):
                sim.step(10.0, mirror=process)
            process.connected("node-02", True)
            sim.fleet.nodes["node-02"].connected = True
            here = run_detectors(DetectContext(sim.fleet, config, sim.now), names)
            there = await process.run_pass(sim.now)
            assert there.findings == here.findings
            causes = {(f.node, f.cause) for f in there.findings}
            assert {("node-01", "power_cap"), ("node-03", "thermal_throttle")} <= causes, causes
            process.forget(["node-01"])
            there = await process.run_pass(sim.now)
            assert all(f.node != "node-01" for f in there.findings)
        finally:
            await process.stop()
        assert not process.running
        assert len(FORKS) == forks  # started without a fork's handlers (controller/children.py)

    event_loop.run(go(), loop)


def test_changes_wait_to_be_written_together_and_a_pass_takes_them_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Changes sent over several turns of the loop wait in one batch (COALESCE_SECONDS, here an
    hour); a pass request does not wait, and goes after them: its report has every one."""
    monkeypatch.setattr("controller.detection.process.COALESCE_SECONDS", 3600.0)

    async def go() -> None:
        sim = SimFleet(4, {"node-01": [FaultSpec("power_cap", 0)]})
        sim.step(10.0)
        process = DetectionProcess(DetectConfig(), ["throttle"])
        await process.start(sim.fleet)
        try:
            await asyncio.sleep(0.05)
            assert process.waiting_bytes() == 0  # the copy is written at its end (send_fleet)
            for _ in range(3):
                sim.step(10.0, mirror=process)
                await asyncio.sleep(0.01)
            assert process._writer is not None and process._writer.pending_bytes() > 0
            report = await asyncio.wait_for(process.run_pass(sim.now), 10)
            assert {(f.node, f.cause) for f in report.findings} == {("node-01", "power_cap")}
            assert process.waiting_bytes() == 0
        finally:
            await process.stop()

    asyncio.run(go())


def test_a_dead_process_fails_its_pass_and_a_new_one_starts_from_the_fleet() -> None:
    async def go() -> None:
        sim = SimFleet(4, {"node-01": [FaultSpec("power_cap", 0)]})
        for _ in range(3):
            sim.step(10.0)
        process = DetectionProcess(DetectConfig(), ["throttle"])
        await process.start(sim.fleet)
        try:
            pid = process._process.pid if process._process else 0
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(DetectionUnavailable):
                await asyncio.wait_for(process.run_pass(sim.now), 10)
            assert not process.running
            await process.start(sim.fleet)
            report = await process.run_pass(sim.now)
            assert {(f.node, f.cause) for f in report.findings} == {("node-01", "power_cap")}
            assert process.starts == 2
        finally:
            await process.stop()

    asyncio.run(go())
