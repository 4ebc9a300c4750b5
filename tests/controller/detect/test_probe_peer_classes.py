"""Probe results compared among GPUs built alike (controller/fleet/peers.py gpu_class), never by the
model name alone: a 500 W board of the same model as 700 W ones, a board of another part number, a
node on another driver branch are no slow outliers for being what they are; a slow GPU among its own
kind still is. Simulated nodes through the real frames (tests/simfleet.py)."""

from __future__ import annotations

from dataclasses import replace

from agent.sources.sim import FaultSpec, SimNode
from agent.sources.sim.profile import H100_SXM, GpuProfile
from controller.config import DetectConfig
from controller.detect import probe_outlier
from controller.detect.base import DetectContext
from controller.fleet.model import ProbeKey, ProbeRecord
from controller.fleet.peers import driver_branch, gpu_classes, node_class, node_group
from controller.fleet.probe_groups import described, grouped
from controller.fleet.state import apply_hello
from tests.simfleet import SimFleet

H100 = "NVIDIA H100 80GB HBM3"
LOW_POWER = replace(H100_SXM, default_power_limit_watts=500.0, max_power_limit_watts=500.0)


def fleet(others: dict[str, GpuProfile], faults: dict[str, list[FaultSpec]] | None = None) -> SimFleet:
    """12 simulated H100 nodes, those in `others` built from another profile."""
    sim = SimFleet(12, faults)
    for name, profile in others.items():
        sim.sims[name] = SimNode(
            name, seed=1, profile=profile, faults=(faults or {}).get(name, []), clock=lambda: sim.now
        )
        apply_hello(sim.fleet, sim.hello(name), 0, sim.now)
    for _ in range(3):
        sim.step(3600.0, probes=True)
    return sim


def slow(sim: SimFleet) -> set[tuple[str, int | None, str]]:
    ctx = DetectContext(sim.fleet, DetectConfig(), sim.now)
    return {(f.node, f.gpu, f.cause) for f in probe_outlier.detect(ctx)}


def test_a_lower_power_board_of_the_same_model_is_no_slow_outlier() -> None:
    sim = fleet({"node-00": LOW_POWER, "node-06": LOW_POWER})
    first = (0, "gemm", "bf16")
    gemm = {r.node: r.value for r in sim.fleet.probes.values() if (r.gpu, r.probe, r.variant) == first}
    assert gemm["node-00"] < 0.9 * gemm["node-01"]  # its GEMM is well below the 700 W boards'
    assert slow(sim) == set()  # by the model name alone: 64 slow_unknown findings on the two nodes
    classes = {c for node in sim.fleet.nodes.values() for c in gpu_classes(node.hello).values()}
    assert classes == {
        (H100, "692-2G520-0200-000, 18 NVLinks, 700 W, driver 550"),
        (H100, "692-2G520-0200-000, 18 NVLinks, 500 W, driver 550"),
    }
    assert node_group(sim.fleet.nodes["node-00"]) == node_group(sim.fleet.nodes["node-01"]) == f"{H100} x8"


def test_a_slow_gpu_is_still_found_among_its_own_kind() -> None:
    faults = {"node-06": [FaultSpec("clocks_locked_low", 3)], "node-04": [FaultSpec("clocks_locked_low", 5)]}
    sim = fleet({"node-00": LOW_POWER, "node-06": LOW_POWER, "node-09": LOW_POWER}, faults)
    assert slow(sim) == {("node-06", 3, "clocks_locked_low"), ("node-04", 5, "clocks_locked_low")}
    # The evidence names the kind of GPU it was compared with.
    ctx = DetectContext(sim.fleet, DetectConfig(), sim.now)
    kind = "peers ({:.1f}; NVIDIA H100 80GB HBM3, 692-2G520-0200-000, 18 NVLinks, {} W, driver 550)"
    found = {f.node: f.evidence for f in probe_outlier.detect(ctx)}
    assert kind.format(found["node-06"].baseline, 500) in found["node-06"].detail
    assert kind.format(found["node-04"].baseline, 700) in found["node-04"].detail


def test_a_groups_kind_in_words() -> None:
    gpu = ("NVIDIA H100 80GB HBM3", "692-2G520-0200-000, 18 NVLinks, 700 W, driver 550", "gpu", "gemm")
    assert described(gpu) == "NVIDIA H100 80GB HBM3, 692-2G520-0200-000, 18 NVLinks, 700 W, driver 550"
    node = ("NVIDIA H100 80GB HBM3", "8", "692-2G520-0200-000, 18 NVLinks, 700 W, driver 550", "nccl")
    assert described(node) == "8 x NVIDIA H100 80GB HBM3, 692-2G520-0200-000, 18 NVLinks, 700 W, driver 550"
    assert described(("", "", "gpu", "gemm")) == "unknown model"
    assert described(("NVIDIA L40S", "", "gpu", "gemm")) == "NVIDIA L40S"


def test_part_number_nvlink_count_and_driver_branch_each_make_another_class() -> None:
    sim = SimFleet(4)
    base = gpu_classes(sim.fleet.nodes["node-00"].hello)[0]
    hello = sim.hello("node-01")
    hello.inventory.gpus[1].board_part_number = "692-2G520-0202-000"
    hello.inventory.gpus[2].nvlink_count = 12
    hello.inventory.gpus[3].driver_version = "535.161.08"
    hello.inventory.gpus[4].driver_version = "550.127.05"  # the same branch
    hello.inventory.gpus[5].ClearField("default_power_limit_watts")  # an older agent: unknown
    apply_hello(sim.fleet, hello, 0, sim.now)
    classes = gpu_classes(sim.fleet.nodes["node-01"].hello)
    assert classes[0] == classes[4] == base
    assert classes[1] == (H100, "692-2G520-0202-000, 18 NVLinks, 700 W, driver 550")
    assert classes[2] == (H100, "692-2G520-0200-000, 12 NVLinks, 700 W, driver 550")
    assert classes[3] == (H100, "692-2G520-0200-000, 18 NVLinks, 700 W, driver 535")
    assert classes[5] == (H100, "692-2G520-0200-000, 18 NVLinks, driver 550")  # an older agent's
    assert classes[0] is classes[6]  # GPUs built alike share one class
    # A node's node-level results: its model and GPU count, then each distinct class of its GPUs.
    node = sim.fleet.nodes["node-01"]
    assert node_class(sim.fleet.nodes["node-00"]) == (H100, "8", base[1])
    assert node_class(node) == (H100, "8", "; ".join(sorted({rest for _, rest in classes.values()})))
    assert node_class(node) is node_class(node)  # read once per Hello
    apply_hello(sim.fleet, sim.hello("node-01"), 0, sim.now)  # the board replaced as it was
    assert node_class(node) == (H100, "8", base[1])


def test_a_node_on_another_driver_branch_has_its_own_peers() -> None:
    sim = SimFleet(6)
    hello = sim.hello("node-02")
    hello.inventory.driver_version = "535.161.08"
    for info in hello.inventory.gpus:
        info.driver_version = "535.161.08"
    apply_hello(sim.fleet, hello, 0, sim.now)
    sim.step(3600.0, probes=True)
    groups = {group: len(members) for group, members in grouped(sim.fleet).items()}
    gemm = {group[1][-3:]: count for group, count in groups.items() if group[-4:-2] == ("gemm", "bf16")}
    assert gemm == {"535": 8, "550": 40}  # GPU results: the class, then "gpu"
    nccl = {group[2][-3:]: count for group, count in groups.items() if group[-4] == "nccl"}
    assert nccl == {"535": 1, "550": 5}  # node-level results: model, count, then its GPUs' class
    assert driver_branch(" 550.90.07") == "550"
    assert driver_branch("") == ""


def test_an_agent_older_than_the_power_limit_field_joins_its_class_from_its_readings() -> None:
    """A rolling agent upgrade: node-03's agent does not say GpuInfo.default_power_limit_watts in its
    Hello, only in each reading. Its first frame fills the Hello in, and its results are grouped
    again with the other 700 W boards', not in a class of their own."""
    sim = SimFleet(12)
    old = sim.hello("node-03")
    for info in old.inventory.gpus:
        info.ClearField("default_power_limit_watts")
    apply_hello(sim.fleet, old, 0, sim.now)
    node, peer = sim.fleet.nodes["node-03"], sim.fleet.nodes["node-04"]
    assert node.limits_unknown and not peer.limits_unknown
    assert gpu_classes(node.hello)[0] == (H100, "692-2G520-0200-000, 18 NVLinks, driver 550")
    sim.step(3600.0, probes=True)
    assert not node.limits_unknown and node.hello is not old
    assert gpu_classes(node.hello) == gpu_classes(peer.hello)
    assert [g.default_power_limit_watts for g in node.hello.inventory.gpus] == [700.0] * 8
    groups = grouped(sim.fleet)  # worked out after the fill: one group holds both nodes' results
    [members] = [m for m in groups.values() if ("node-04", 0, "gemm", "bf16") in m]
    assert ("node-03", 0, "gemm", "bf16") in members and len(members) == 12 * 8
    # The old agent says hello again: its results are in a class of their own until its next
    # readings, and grouped again with their peers' then (the fill bumps the probes' version).
    apply_hello(sim.fleet, old, 0, sim.now)
    assert sim.fleet.nodes["node-03"].limits_unknown

    def group_of(node: str) -> dict[ProbeKey, ProbeRecord]:
        [members] = [m for m in grouped(sim.fleet).values() if (node, 0, "gemm", "bf16") in m]
        return members

    assert ("node-03", 0, "gemm", "bf16") not in group_of("node-04")
    sim.step(60.0)  # readings only, no probe results
    assert ("node-03", 0, "gemm", "bf16") in group_of("node-04")
