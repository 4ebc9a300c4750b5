"""What keeps a detection pass cheap and the event loop free at scale (issue 17): probe_outlier's
judgement reused until a probe result, a Hello or the config changes, and the pass giving the loop a
turn after each detector."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.config import DetectConfig
from controller.detect import probe_outlier
from controller.detect.base import REGISTRY, DetectContext
from controller.detect.runner import run_detectors, run_detectors_yielding
from controller.fleet.expiry import forget
from controller.fleet.finding import Finding
from controller.fleet.state import apply_hello
from tests.simfleet import SimFleet

CONFIG = DetectConfig(throttle_window_seconds=5.0)


def outliers(sim: SimFleet, config: DetectConfig = CONFIG) -> list[tuple[str, int | None, str]]:
    found = probe_outlier.detect(DetectContext(sim.fleet, config, sim.now))
    return sorted((f.node, f.gpu, f.cause) for f in found)


def test_the_judgement_is_reused_until_a_probe_result_a_hello_or_the_config_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = SimFleet(6, seed=3)
    sim.step(probes=True)
    calls: list[int] = []
    real = probe_outlier._judge_all

    def counted(ctx: DetectContext) -> list[tuple[object, ...]]:
        calls.append(ctx.fleet.probe_version)
        return real(ctx)  # type: ignore[return-value]

    monkeypatch.setattr(probe_outlier, "_judge_all", counted)
    assert outliers(sim) == []
    sim.step()  # telemetry only: the judgement stands
    assert outliers(sim) == [] and len(calls) == 1
    sim.sims["node-02"].gpus[3].condition.hbm_factor = 0.8
    sim.step(probes=True)  # new results: judged again, and the slow GPU found
    assert outliers(sim) == [("node-02", 3, "hbm_degraded")] and len(calls) == 2
    assert outliers(sim) == [("node-02", 3, "hbm_degraded")] and len(calls) == 2
    assert outliers(sim, DetectConfig(throttle_window_seconds=5.0, margin=0.5)) == []  # another config
    assert len(calls) == 3
    apply_hello(sim.fleet, sim.fleet.nodes["node-04"].hello, 0, sim.now)  # a reconnect
    outliers(sim)
    assert len(calls) == 4
    forget(sim.fleet, ["node-02"])
    assert outliers(sim) == [] and len(calls) == 5


def test_a_pass_gives_the_event_loop_a_turn_between_detectors(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []

    def slow(ctx: DetectContext) -> list[Finding]:
        time.sleep(0.05)
        order.append("slow")
        return []

    def after(ctx: DetectContext) -> list[Finding]:
        order.append("after")
        return []

    monkeypatch.setitem(REGISTRY, "zz_slow", slow)
    monkeypatch.setitem(REGISTRY, "zz_after", after)
    sim = SimFleet(2, seed=1)
    ctx = DetectContext(sim.fleet, CONFIG, sim.now)

    async def go() -> None:
        asyncio.get_running_loop().call_soon(order.append, "frame")  # as a frame's ack would wait
        await run_detectors_yielding(ctx, ["zz_slow", "zz_after"])

    asyncio.run(go())
    assert order == ["slow", "frame", "after"]
    order.clear()
    assert run_detectors(ctx, ["zz_slow", "zz_after"]).durations.keys() == {"zz_slow", "zz_after"}
    assert order == ["slow", "after"]
