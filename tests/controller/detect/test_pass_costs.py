"""What keeps a detection pass cheap and the event loop free at scale (issue 17): probe_outlier's
judgement reused until a probe result, a Hello or the config changes, and the pass giving the loop a
turn after each detector."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict

import pytest

from controller.config import DetectConfig
from controller.detect import probe_outlier
from controller.detect.base import REGISTRY, DetectContext
from controller.detect.runner import run_detectors, run_detectors_yielding
from controller.detect.stats import baseline
from controller.fleet.expiry import forget
from controller.fleet.finding import Finding
from controller.fleet.model import ProbeKey, ProbeRecord
from controller.fleet.probe_groups import PeerGroups, described
from controller.fleet.state import apply_hello
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.test_probe_outlier_baselines import small_group
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
    assert outliers(sim) == [("node-02", 3, "hbm_degraded")] and len(calls) == 4  # the config again
    again = pb.Hello()
    again.CopyFrom(sim.fleet.nodes["node-04"].hello)
    again.boot_id = "restarted"  # the agent restarted; its GPUs and probes the same
    apply_hello(sim.fleet, again, 0, sim.now)
    assert outliers(sim) == [("node-02", 3, "hbm_degraded")] and len(calls) == 4
    changed = pb.Hello()
    changed.CopyFrom(again)
    changed.probe_infos.add(name="stream", unit="GB/s", higher_is_better=True)  # a probe it offers now
    apply_hello(sim.fleet, changed, 0, sim.now)
    outliers(sim)
    assert len(calls) == 5
    forget(sim.fleet, ["node-02"])
    assert outliers(sim) == [] and len(calls) == 6


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


def _one_by_one(ctx: DetectContext) -> set[tuple[ProbeKey, probe_outlier.Slow, bool]]:
    """Every result judged on its own, each against its group's baseline (what _judge_all did before
    it worked out each group's thresholds once)."""
    groups: dict[tuple[str, ...], list[ProbeRecord]] = defaultdict(list)
    peers_of = PeerGroups(ctx.fleet)
    for record in ctx.fleet.probes.values():
        group = peers_of.of(record)
        if group is not None:
            groups[group].append(record)
    usual = probe_outlier.usual_peak_ratios(ctx.fleet.probes.values(), ctx.config.min_peers)
    out: set[tuple[ProbeKey, probe_outlier.Slow, bool]] = set()
    for group, records in groups.items():
        higher = group[-1] == "higher"
        peers = baseline([r.value for r in records]) if len(records) >= ctx.config.min_peers else None
        for record in records:
            if peers is not None:
                slow = probe_outlier._against_peers(ctx, record, peers, higher, described(group))
            else:
                ratios = usual.get((record.probe, record.variant))
                own = probe_outlier._against_own_history(ctx, record, higher)
                slow = own or probe_outlier._against_datasheet(ctx, record, ratios, higher)
            if slow is not None:
                out.add((record.key, slow, higher))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_the_group_thresholds_leave_out_only_results_judging_each_one_finds_not_slow(seed: int) -> None:
    sim = SimFleet(12, seed=seed)
    small_group(sim)  # a group under min_peers: its own history and the datasheet judge it
    for _ in range(6):
        sim.step(3600.0, probes=True)
    for (node, gpu), factor in {("node-01", 2): 0.97, ("node-03", 5): 0.94, ("node-05", 0): 0.8}.items():
        sim.sims[node].gpus[gpu].condition.hbm_factor = factor  # within, near and past the margin
    for _ in range(2):
        sim.step(3600.0, probes=True)
    for state in sim.fleet.nodes.values():  # a probe where lower is better: the other side is slow
        for info in state.hello.probe_infos:
            if info.name == "gemm":
                info.higher_is_better = False
    rng = random.Random(seed)
    for record in sim.fleet.probes.values():  # values all around each group's median and margins
        if rng.random() < 0.5:
            record.value *= rng.uniform(0.8, 1.2)
    sources: set[tuple[str, bool]] = set()
    configs: list[dict[str, float]] = [
        {},
        {"margin": 0.01},
        {"change_peer_margin": 0.0},
        {"margin": 0.3},
        {"min_peers": 500},  # no group has peers enough: each GPU's own history judges it
        # The 96 GPUs' 93 + 3 results of a probe are two groups under 95 peers, while the datasheet
        # baseline (over every model) has its 95; no own history is long enough.
        {"min_peers": 95, "own_history_min_points": 99},
    ]
    for overrides in configs:
        ctx = DetectContext(sim.fleet, DetectConfig(**overrides), sim.now)  # type: ignore[arg-type]
        expected = _one_by_one(ctx)
        got = {(record.key, slow, higher) for record, slow, higher in probe_outlier._judge_all(ctx)}
        assert got == expected, overrides
        sources |= {(slow.source, higher) for _, slow, higher in expected}
    # Every way of judging was compared, both ways round (the datasheet's ratio is higher-is-better).
    assert sources >= {("peers", True), ("peers", False), ("own_history", True), ("datasheet", True)}
