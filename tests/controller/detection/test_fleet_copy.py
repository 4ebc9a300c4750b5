"""A detection process's copy of the fleet, sent in slices (controller/detection/fleet_copy.py): the
copy equals the fleet, changes applied while it is sent reach it in order, a fleet far bigger than
the hung-pipe limit gets through, and a process that reads nothing is stopped."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.detect.base import DetectContext, discover
from controller.detect.runner import run_detectors
from controller.detection import fleet_copy
from controller.detection import process as process_module
from controller.detection.fleet_copy import NodeEntries, install, shell, slice_message
from controller.detection.pool import DetectionPool
from controller.detection.process import DetectionProcess
from controller.detection.wire import HEADER, decode, encode
from controller.fleet.expiry import forget
from controller.fleet.state import apply_hello
from tests.simfleet import SimFleet

FAULTS = {
    "node-01": [FaultSpec("power_cap", 0)],
    "node-04": [FaultSpec("thermal_throttle", 6)],
    "node-06": [FaultSpec("clocks_locked_low", 1)],
}


def wired(message: tuple[Any, ...]) -> tuple[Any, ...]:
    """The message as the process reads it from its pipe."""
    return decode(encode(message)[HEADER:])


def names() -> list[str]:
    config = DetectConfig()
    return config.enabled(sorted(discover()))


def count_slices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now, [how many slices were encoded]."""
    sliced = [0]
    real_slice = NodeEntries.slice_message

    def counted(entries: NodeEntries, chunk: list[str]) -> tuple[object, ...]:
        sliced[0] += 1
        return real_slice(entries, chunk)

    monkeypatch.setattr(NodeEntries, "slice_message", counted)
    return sliced


def test_slices_rebuild_the_fleet_as_it_is() -> None:
    sim = SimFleet(7, FAULTS)
    sim.step(10.0, probes=True)
    sim.step(10.0)
    copy = wired(("init", shell(sim.fleet)))[1]
    order = list(sim.fleet.nodes)
    for start in range(0, len(order), 3):
        install(copy, wired(slice_message(sim.fleet, order[start : start + 3])))
    assert copy.nodes == sim.fleet.nodes
    assert copy.probes == sim.fleet.probes and len(copy.probes) > 7 * 8  # every GPU's results
    assert copy.history == sim.fleet.history
    assert copy.acked == sim.fleet.acked
    # A slice replaces what the copy built of its nodes: their results from before are gone too.
    stale = next(key for key in copy.probes if key[0] == "node-02")
    del sim.fleet.probes[stale]
    install(copy, wired(slice_message(sim.fleet, ["node-02", "gone"])))
    assert stale not in copy.probes and copy.probes == sim.fleet.probes


def test_the_keys_of_each_node_are_kept_up_as_keys_come_and_go() -> None:
    sim = SimFleet(4)
    sim.step(10.0, probes=True)
    fleet = sim.fleet
    entries = NodeEntries(fleet)
    asyncio.run(entries.prepare())
    first = entries.slice_message(["node-00"])
    assert entries.builds == 1 and set(first[2]) == {k for k in fleet.probes if k[0] == "node-00"}
    sim.step(10.0, probes=True)  # new values, the same keys
    again = entries.slice_message(["node-00"])
    assert again[2] == {k: v for k, v in fleet.probes.items() if k[0] == "node-00"}
    key = next(k for k in fleet.probes if k[0] == "node-02")
    new_key = (key[0], key[1], key[2], "new-variant")
    fleet.probes[new_key] = fleet.probes[key]  # a new kind of result: found from the dict's end
    fleet.acked[("node-02", "boot-2")] = 1  # a new boot
    message = entries.slice_message(["node-02"])
    assert new_key in message[2] and ("node-02", "boot-2") in message[4] and entries.builds == 1
    # As many keys gone (node-01 forgotten) as come (node-02's): the sizes stand, built again.
    tables: tuple[dict[Any, Any], ...] = (fleet.probes, fleet.history, fleet.acked)
    sizes = tuple(map(len, tables))
    of_01 = [[k for k in table if k[0] == "node-01"] for table in tables]
    forget(fleet, ["node-01"])
    for table, keys in zip(tables, of_01, strict=True):
        for k in keys:
            table[("node-02", *k[1:-1], f"{k[-1]}-again")] = table[next(iter(table))]
    assert tuple(map(len, tables)) == sizes
    message = entries.slice_message(["node-02", "node-01"])
    assert entries.builds == 2 and "node-01" not in message[1]
    assert set(message[2]) == {k for k in fleet.probes if k[0] == "node-02"}
    assert set(message[4]) == {k for k in fleet.acked if k[0] == "node-02"}


def test_changes_made_while_the_copy_is_sent_reach_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_copy, "NODES_PER_SLICE", 2)
    monkeypatch.setattr(fleet_copy, "LOW_WATER_BYTES", 1)  # each slice waits for the pipe to empty

    async def go() -> None:
        sim = SimFleet(9, FAULTS)
        sim.step(10.0)
        config, detectors = DetectConfig(), names()
        process = DetectionProcess(config, detectors)
        sliced = count_slices(monkeypatch)

        async def after_slice(count: int) -> None:
            while sliced[0] < count:
                assert not copying.done()
                await asyncio.sleep(0)

        async def meanwhile() -> None:
            # Between slices: frames (with a probe round: new results for nodes not sent yet), a
            # node forgotten before its slice, and a node's new boot (its Hello) before its slice.
            await after_slice(1)
            sim.step(10.0, probes=True, mirror=process)
            await after_slice(2)
            forget(sim.fleet, ["node-08"])  # the last slice's
            process.forget(["node-08"])
            del sim.sims["node-08"]
            hello = sim.hello("node-07")  # the fourth slice's
            apply_hello(sim.fleet, hello, 0, sim.now)
            process.hello(hello, 0, sim.now)
            for count in (2, 3, 4):
                await after_slice(count)
                sim.step(10.0, mirror=process)

        copying = asyncio.create_task(process.start(sim.fleet))
        try:
            await asyncio.wait_for(asyncio.gather(copying, meanwhile()), 60)
            assert sliced[0] == 5 and process.running
            for _ in range(2):
                sim.step(10.0, mirror=process)
            here = run_detectors(DetectContext(sim.fleet, config, sim.now), detectors)
            there = await process.run_pass(sim.now)
            assert there.findings == here.findings
            causes = {(f.node, f.cause) for f in there.findings}
            assert {("node-01", "power_cap"), ("node-04", "thermal_throttle")} <= causes, causes
            assert any(f.cause == "clocks_locked_low" for f in there.findings), causes  # from probes
        finally:
            await process.stop()

    asyncio.run(go())


def test_a_fleet_far_over_the_hung_pipe_limit_is_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimFleet(48, FAULTS)  # 2.6 MB of fleet (frames leave each NVLink's traffic with the agent)
    sim.step(10.0, probes=True)
    limit = 256 * 1024
    # In one message, what the pipe could not take was taken as a hung process's: stopped.
    assert len(encode(("init", sim.fleet))) > 1.5 * 1024 * 1024 + limit
    monkeypatch.setattr(process_module, "MAX_BUFFERED_BYTES", limit)
    monkeypatch.setattr(fleet_copy, "LOW_WATER_BYTES", limit // 4)
    monkeypatch.setattr(fleet_copy, "NODES_PER_SLICE", 1)

    async def go() -> None:
        config, detectors = DetectConfig(), names()
        pool = DetectionPool(config, detectors, 2)
        try:
            await pool.start(sim.fleet)
            sim.step(10.0, mirror=pool)
            report = await pool.run_pass(sim.now)
            assert pool.running and pool.starts == 2
            here = run_detectors(DetectContext(sim.fleet, config, sim.now), detectors)
            assert report.findings == here.findings
        finally:
            await pool.stop()

    asyncio.run(go())


def test_a_process_that_reads_nothing_of_its_copy_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_copy, "STALL_SECONDS", 0.5)
    monkeypatch.setattr(fleet_copy, "LOW_WATER_BYTES", 1)
    monkeypatch.setattr(fleet_copy, "NODES_PER_SLICE", 1)
    monkeypatch.setattr(process_module, "STOP_TIMEOUT_SECONDS", 0.5)
    sim = SimFleet(32, FAULTS)
    sim.step(10.0, probes=True)

    async def go() -> None:
        process = DetectionProcess(DetectConfig(), ["throttle"])
        await process.spawn()
        pid = process._process.pid if process._process else 0
        os.kill(pid, signal.SIGSTOP)  # alive, reading nothing: its pipe fills and stays full
        assert len(encode(("init", sim.fleet))) > 1.5 * process.pipe_bytes
        try:
            copying = fleet_copy.send_fleet([process], sim.fleet, process.config, process.names)
            await asyncio.wait_for(copying, 30)
            assert not process.running
        finally:
            await process.stop()

    asyncio.run(go())


def test_the_copy_waits_while_agents_are_taken_in_and_at_most_yield_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Agents first: no slice is encoded while busy() (Hellos under way, as at a lead the dead
    leader's agents move in), the copy goes on once they are in, and waits YIELD_SECONDS at most."""
    monkeypatch.setattr(fleet_copy, "NODES_PER_SLICE", 2)
    monkeypatch.setattr(fleet_copy, "YIELD_POLL_SECONDS", 0.01)
    sliced = count_slices(monkeypatch)
    sim = SimFleet(6, FAULTS)
    sim.step(10.0)

    async def go() -> None:
        config, detectors = DetectConfig(), names()
        pool = DetectionPool(config, detectors, 1)
        busy = [True]
        try:
            copying = asyncio.create_task(pool.start(sim.fleet, busy=lambda: busy[0]))
            await asyncio.sleep(0.3)
            assert sliced[0] == 0 and not copying.done()
            busy[0] = False
            await asyncio.wait_for(copying, 30)
            assert sliced[0] == 3
            here = run_detectors(DetectContext(sim.fleet, config, sim.now), detectors)
            assert (await pool.run_pass(sim.now)).findings == here.findings
            await pool.stop()

            monkeypatch.setattr(fleet_copy, "YIELD_SECONDS", 0.2)
            busy[0] = True  # never done: the copy waits 0.2 s in all, then goes on
            began = asyncio.get_running_loop().time()
            await asyncio.wait_for(pool.start(sim.fleet, busy=lambda: busy[0]), 30)
            assert sliced[0] == 6 and asyncio.get_running_loop().time() - began >= 0.2
        finally:
            await pool.stop()

    asyncio.run(go())
