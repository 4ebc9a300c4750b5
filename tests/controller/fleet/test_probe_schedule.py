"""The probe scheduler's rules (controller/fleet/probe_schedule.py): due times, jitter, idle GPUs,
stale readings, the fleet share, and the bookkeeping of commands in flight."""

from __future__ import annotations

import math
import statistics

import pytest

from controller.config import ProbeConfig
from controller.fleet.model import Fleet, FrameWrite, GpuState, NodeState, ProbeRecord
from controller.fleet.probe_schedule import (
    ProbePlan,
    ProbeTarget,
    fleet_slots,
    idle_gpus,
    jitter_offset,
    last_probed,
    plan_probes,
)
from controller.fleet.state import apply_frame
from controller.probe_commands import ProbeCommand, ProbeCommands
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import H100, T0

INTERVAL = 1800.0
AGE = 60.0  # max_reading_age: the controller's stale_after_seconds
OFFERED = ("gemm", "membw", "pcie", "nccl")


def cfg(**fields: object) -> ProbeConfig:
    return ProbeConfig(**{"interval_seconds": INTERVAL, "jitter_ratio": 0.0, **fields})  # type: ignore[arg-type]


def sample(index: int, util: float | None = 0.0, processes: int = 0) -> pb.GpuSample:
    s = pb.GpuSample(index=index)
    if util is not None:
        s.gpu_utilization_ratio = util
    for i in range(processes):
        s.processes.add(pid=1000 + i, used_memory_bytes=1 << 30)
    return s


def add_node(
    fleet: Fleet,
    name: str,
    *,
    gpus: int = 4,
    util: float | None = 0.0,
    busy: tuple[int, ...] = (),
    at: float = T0,
    connected: bool = True,
    capabilities: tuple[str, ...] = ("run_probes",),
    probes: tuple[str, ...] = OFFERED,
    infos: tuple[pb.ProbeInfo, ...] = (),
) -> NodeState:
    """A node whose GPUs last read at `at` with utilisation `util`; GPUs in `busy` run a job. Its
    Hello names `probes` and describes them with `infos` (none: an agent older than ProbeInfo)."""
    hello = pb.Hello(node=name, boot_id="b1", capabilities=capabilities, probes=probes, probe_infos=infos)
    for i in range(gpus):
        hello.inventory.gpus.add(index=i, uuid=f"GPU-{name}-{i}", name=H100)
    node = NodeState(name, hello, at, at, connected=connected)
    for i in range(gpus):
        s = sample(i, 0.97, 1) if i in busy else sample(i, util)
        node.gpus[i] = GpuState(i, s, at)
    fleet.nodes[name] = node
    return node


def probed(fleet: Fleet, node: str, gpu: int | None, at: float, probe: str = "gemm") -> None:
    result = pb.ProbeResult(probe=probe, variant="bf16", value=700.0, unit="TFLOP/s")
    fleet.probes[(node, gpu, probe, "bf16")] = ProbeRecord(
        node, gpu, probe, "bf16", 700.0, "TFLOP/s", at, result.SerializeToString()
    )
    fleet.probe_version += 1  # as apply_frame does: what was worked out from the results is stale


def probed_all(fleet: Fleet, node: str, at: float) -> None:
    for gpu in range(len(fleet.nodes[node].hello.inventory.gpus)):
        probed(fleet, node, gpu, at)
    probed(fleet, node, None, at, probe="nccl")


def plans(
    fleet: Fleet,
    now: float = T0,
    *,
    in_flight: tuple[str, ...] = (),
    attempts: dict[ProbeTarget, float] | None = None,
    **config: object,
) -> list[ProbePlan]:
    return plan_probes(
        fleet,
        in_flight=in_flight,
        attempts=attempts or {},
        now=now,
        config=cfg(**config),
        max_reading_age=AGE,
    )


def test_a_never_probed_idle_node_gets_a_full_run_now() -> None:
    fleet = Fleet()
    add_node(fleet, "n1")
    (plan,) = plans(fleet)
    assert (plan.node, plan.gpus, plan.probes) == ("n1", (), ())  # every GPU, the agent's default suite
    assert plan.overdue_seconds == math.inf
    (configured,) = plans(fleet, probes=["gemm", "nccl"])
    assert configured.probes == ("gemm", "nccl")


def test_a_node_is_due_once_the_interval_has_passed_since_its_newest_result() -> None:
    fleet = Fleet()
    add_node(fleet, "n1")
    probed_all(fleet, "n1", T0 - INTERVAL + 1)
    assert plans(fleet) == []  # one second to go
    probed_all(fleet, "n1", T0 - INTERVAL)
    (plan,) = plans(fleet)
    assert plan.overdue_seconds == 0.0 and plan.gpus == ()
    (later,) = plans(fleet, T0 + 30)  # the readings still fresh
    assert later.overdue_seconds == 30.0


def test_a_command_without_results_postpones_the_next_run_by_an_interval() -> None:
    fleet = Fleet()
    add_node(fleet, "n1")
    targets: list[ProbeTarget] = [("n1", g) for g in range(4)] + [("n1", None)]
    asked = dict.fromkeys(targets, T0 - 60)
    assert plans(fleet, attempts=asked) == []
    add_node(fleet, "n1", at=T0 + INTERVAL - 60)  # fresh readings then
    assert plans(fleet, T0 + INTERVAL - 61, attempts=asked) == []
    assert len(plans(fleet, T0 + INTERVAL - 60, attempts=asked)) == 1


def test_one_gpu_due_on_an_idle_node_brings_a_full_run() -> None:
    fleet = Fleet()
    add_node(fleet, "n1")
    probed_all(fleet, "n1", T0 - 60)
    probed(fleet, "n1", 2, T0 - INTERVAL - 5)  # older than the rest: a result of another probe
    fleet.probes[("n1", 2, "gemm", "bf16")].time = T0 - INTERVAL - 5
    (plan,) = plans(fleet)
    assert plan.gpus == () and plan.overdue_seconds == 5.0


def test_jitter_is_fixed_per_node_within_the_ratio_and_spread_across_nodes() -> None:
    offsets = [jitter_offset(f"node-{i:04d}", INTERVAL, 0.1) for i in range(2000)]
    assert all(-180.0 <= o <= 180.0 for o in offsets)
    assert jitter_offset("node-0001", INTERVAL, 0.1) == offsets[1]  # the same after a restart
    assert jitter_offset("node-0001", INTERVAL, 0.0) == 0.0
    # Uniform over +-180 s: the fleet's due times spread over six minutes, not bunched.
    assert abs(statistics.mean(offsets)) < 10.0
    assert statistics.pstdev(offsets) == pytest.approx(180.0 / math.sqrt(3), rel=0.05)
    deciles = [sum(1 for o in offsets if -180 + 36 * k <= o < -180 + 36 * (k + 1)) for k in range(10)]
    assert min(deciles) > 150, deciles


def test_a_nodes_due_time_moves_by_its_offset() -> None:
    fleet = Fleet()
    add_node(fleet, "n1")
    shift = jitter_offset("n1", INTERVAL, 0.1)
    assert shift != 0.0
    probed_all(fleet, "n1", T0 - INTERVAL - shift + 1)
    assert plans(fleet, jitter_ratio=0.1) == []
    probed_all(fleet, "n1", T0 - INTERVAL - shift)
    assert len(plans(fleet, jitter_ratio=0.1)) == 1


def test_idle_means_fresh_low_utilisation_and_no_compute_process() -> None:
    node = add_node(Fleet(), "n1", gpus=6)
    node.gpus[0].sample = sample(0, 0.1)  # at the threshold: idle
    node.gpus[1].sample = sample(1, 0.11)
    node.gpus[2].sample = sample(2, 0.0, processes=1)  # a job that has not started its kernels yet
    node.gpus[3].sample = sample(3, None)  # no utilisation reading: unknown, not idle
    node.gpus[4].time = T0 - AGE - 1  # stale
    del node.gpus[5]  # never read
    assert idle_gpus(node, T0, 0.1, AGE) == [0]
    node.gpus[4].time = T0 - AGE
    assert idle_gpus(node, T0, 0.1, AGE) == [0, 4]


def test_stale_readings_keep_a_node_from_being_probed() -> None:
    fleet = Fleet()
    add_node(fleet, "n1", at=T0 - AGE - 1)
    assert plans(fleet) == []
    assert len(plans(fleet, T0 - 1)) == 1


def test_some_idle_gpus_get_per_gpu_probes_only() -> None:
    fleet = Fleet()
    add_node(fleet, "n1", busy=(1, 3))
    (plan,) = plans(fleet)
    assert plan.gpus == (0, 2)
    assert plan.probes == ("gemm", "membw", "pcie")  # what the agent offers, without the all-reduce
    (configured,) = plans(fleet, probes=["gemm", "nccl"])
    assert configured.probes == ("gemm",)
    assert plans(fleet, probes=["nccl"]) == []  # nothing it may run on part of the node
    add_node(fleet, "n1", busy=(0, 1, 2, 3))
    assert plans(fleet) == []


def test_per_gpu_runs_only_probe_the_idle_gpus_that_are_due() -> None:
    fleet = Fleet()
    add_node(fleet, "n1", busy=(3,))
    probed_all(fleet, "n1", T0 - INTERVAL)
    probed(fleet, "n1", 0, T0 - 30)  # GPU 0 was probed a moment ago
    (plan,) = plans(fleet)
    assert plan.gpus == (1, 2)


def test_configured_probes_are_asked_only_of_nodes_that_offer_them() -> None:
    fleet = Fleet()
    add_node(fleet, "old", probes=("gemm", "membw"))  # an agent without nccl (or pcie)
    add_node(fleet, "none", probes=("membw",))
    add_node(fleet, "part", busy=(0,), probes=("membw",))
    found = {p.node: p.probes for p in plans(fleet, probes=["gemm", "nccl"], max_fleet_share=1.0)}
    assert found == {"old": ("gemm",)}  # what it has; the others have none of what is asked


def per_gpu(name: str) -> pb.ProbeInfo:
    return pb.ProbeInfo(name=name, unit="GB/s", higher_is_better=True)


def test_a_probe_is_node_level_because_its_probe_info_says_so() -> None:
    whole = pb.ProbeInfo(name="alltoall", unit="GB/s", higher_is_better=True, node_level=True)
    fleet = Fleet()
    add_node(fleet, "new", probes=("gemm", "alltoall"), infos=(per_gpu("gemm"), whole))
    for gpu in range(4):
        probed(fleet, "new", gpu, T0 - 60)  # every GPU probed a minute ago; the node as a whole never
    (plan,) = plans(fleet)
    assert (plan.gpus, plan.probes, plan.overdue_seconds) == ((), (), math.inf)  # due: the node target
    later = T0 + INTERVAL
    add_node(fleet, "new", busy=(1,), at=later, probes=("gemm", "alltoall"), infos=(per_gpu("gemm"), whole))
    (plan,) = plans(fleet, later)
    assert (plan.gpus, plan.probes) == ((0, 2, 3), ("gemm",))  # the all-to-all needs the whole node
    # The same names, each described as per-GPU: no node target, and a part of the node may run both.
    add_node(fleet, "new", probes=("gemm", "alltoall"), infos=(per_gpu("gemm"), per_gpu("alltoall")))
    assert plans(fleet) == []
    add_node(
        fleet,
        "new",
        busy=(1,),
        at=later,
        probes=("gemm", "alltoall"),
        infos=(per_gpu("gemm"), per_gpu("alltoall")),
    )
    (plan,) = plans(fleet, later)
    assert (plan.gpus, plan.probes) == ((0, 2, 3), ("gemm", "alltoall"))


def test_a_hello_without_probe_infos_is_an_older_agent_whose_nccl_is_node_level() -> None:
    fleet = Fleet()
    add_node(fleet, "old", busy=(1,))  # names only, as agents before ProbeInfo sent them
    (plan,) = plans(fleet)
    assert plan.probes == ("gemm", "membw", "pcie")


def test_only_connected_capable_nodes_without_a_command_in_flight() -> None:
    fleet = Fleet()
    add_node(fleet, "gone", connected=False)
    add_node(fleet, "cannot", capabilities=())
    add_node(fleet, "busy")
    add_node(fleet, "ok")
    assert [p.node for p in plans(fleet, in_flight=("busy",), max_fleet_share=1.0)] == ["ok"]


def test_at_most_a_share_of_connected_nodes_probe_at_once_most_overdue_first() -> None:
    fleet = Fleet()
    for i in range(25):
        add_node(fleet, f"n{i:02d}")
        probed_all(fleet, f"n{i:02d}", T0 - INTERVAL - i)  # n24 is the most overdue
    for i in range(5):
        add_node(fleet, f"off{i}", connected=False)
    assert fleet_slots(25, 0.1) == 2
    assert [p.node for p in plans(fleet)] == ["n24", "n23"]
    assert [p.node for p in plans(fleet, in_flight=("n24",))] == ["n23"]  # in flight takes a slot
    assert plans(fleet, in_flight=("n00", "n01")) == []
    assert [p.node for p in plans(fleet, max_fleet_share=0.2)] == ["n24", "n23", "n22", "n21", "n20"]


def test_a_small_fleet_still_probes_one_node_at_a_time() -> None:
    fleet = Fleet()
    for name in ("a", "b", "c"):
        add_node(fleet, name)
    assert fleet_slots(3, 0.1) == 1 and fleet_slots(0, 0.1) == 1
    assert [p.node for p in plans(fleet)] == ["a"]  # all never probed: by name
    assert plans(fleet, in_flight=("b",)) == []


# The book of probe commands: in flight until the command channel finishes them (its own tests:
# tests/controller/commands/)


def command(node: str = "n1", reason: str = "periodic", at: float = T0, cid: str = "c1") -> ProbeCommand:
    return ProbeCommand(id=cid, node=node, boot_id="b1", reason=reason, sent_at=at, run=pb.RunProbes())


def test_a_command_is_in_flight_until_the_channel_finishes_it() -> None:
    book = ProbeCommands()
    c = command()
    book.start(c, [("n1", 0), ("n1", None)])
    assert book.attempts == {("n1", 0): T0, ("n1", None): T0}
    assert book.sent["periodic"] == 1
    with pytest.raises(ValueError, match="already has probe command c1"):
        book.start(command(cid="c2"), [])
    book.finish(c, ok=False, error="no answer within 600s", failure="timeout")
    assert book.in_flight == {} and c.done and not c.answered and not c.ok
    assert c.error == "no answer within 600s"
    assert book.failed[("periodic", "timeout")] == 1
    book.finish(c, ok=True, error="", failure="")  # too late: finished once
    assert not c.ok and book.failed[("periodic", "timeout")] == 1


def test_answers_and_results_are_kept_by_command_id() -> None:
    book = ProbeCommands()
    c = command(reason="operator")
    book.start(c, [])
    mine = pb.ProbeResult(probe="gemm", variant="bf16", gpu=0, value=1.0, command_id="c1")
    other = pb.ProbeResult(probe="gemm", variant="bf16", gpu=1, value=1.0, command_id="elsewhere")
    unstamped = pb.ProbeResult(probe="gemm", variant="bf16", gpu=2, value=1.0)
    book.add_results("n1", [mine, other, unstamped, mine])  # a resent frame: kept once
    book.add_results(
        "n2", [pb.ProbeResult(probe="pcie", variant="h2d", gpu=0, command_id="c1")]
    )  # not its node
    assert c.result_list() == [mine] and c.results_seen.is_set()
    book.finish(c, ok=False, error="gemm/bf16: NaN", failure="error")
    assert (c.answered, c.ok, c.error) == (True, False, "gemm/bf16: NaN")
    assert book.failed[("operator", "error")] == 1 and book.in_flight == {}
    assert book.get("c1") is c


def test_a_command_never_sent_is_discarded() -> None:
    book = ProbeCommands()
    c = command(reason="operator")
    book.start(c, [("n1", 0)])
    book.discard(c)
    assert book.in_flight == {} and book.get("c1") is None and book.sent["operator"] == 0
    book.start(command(cid="c2"), [])  # the node is free again


def test_last_probed_follows_new_results_and_merges_attempts() -> None:
    """The results' part is kept between passes until a result comes in (Fleet.probe_version)."""
    fleet = Fleet()
    gemm = pb.ProbeResult(probe="gemm", variant="bf16", unit="TFLOP/s", value=700.0)

    def result(gpu: int, time: float) -> None:
        write = FrameWrite("n1", "b1", 1, time)
        write.probes = [
            ProbeRecord("n1", gpu, "gemm", "bf16", 700.0, "TFLOP/s", time, gemm.SerializeToString())
        ]
        fleet.nodes.setdefault("n1", NodeState("n1", pb.Hello(node="n1"), T0, T0))
        apply_frame(fleet, write)

    result(0, T0)
    assert last_probed(fleet, {}) == {("n1", 0): T0}
    assert last_probed(fleet, {("n1", 0): T0 + 5, ("n1", 1): T0 + 1}) == {
        ("n1", 0): T0 + 5,
        ("n1", 1): T0 + 1,
    }
    assert last_probed(fleet, {}) == {("n1", 0): T0}  # an attempt does not stick to the kept part
    result(0, T0 + 60)
    result(2, T0 + 61)
    assert last_probed(fleet, {("n1", 0): T0 + 5}) == {("n1", 0): T0 + 60, ("n1", 2): T0 + 61}


def test_results_arriving_update_the_kept_last_probed_without_walking_every_result() -> None:
    """apply_frame carries new results into last_probed's kept part (probed()): the next pass does
    not walk every stored result again, and what it reads is what a walk would find, an older
    result (a replayed spool) included."""
    fleet = Fleet()
    fleet.nodes["n1"] = NodeState("n1", pb.Hello(node="n1"), T0, T0)
    gemm = pb.ProbeResult(probe="gemm", variant="bf16", unit="TFLOP/s", value=700.0)

    def result(gpu: int | None, time: float, probe: str = "gemm") -> None:
        write = FrameWrite("n1", "b1", 1, time)
        write.probes = [
            ProbeRecord("n1", gpu, probe, "bf16", 700.0, "TFLOP/s", time, gemm.SerializeToString())
        ]
        apply_frame(fleet, write)

    for gpu in range(4):
        result(gpu, T0 + gpu)
    assert last_probed(fleet, {}) == {("n1", g): T0 + g for g in range(4)}
    kept = fleet.derived["last_probed"][1]
    result(1, T0 + 100)
    result(None, T0 + 101, "nccl")
    result(2, T0 - 50)  # older than what is held for GPU 2
    # carried forward and current, not left stale for the next pass to walk every result again
    assert fleet.derived["last_probed"] == ((fleet.probe_version, len(fleet.probes)), kept)
    expected = {
        ("n1", 0): T0,
        ("n1", 1): T0 + 100,
        ("n1", 2): T0 + 2,
        ("n1", 3): T0 + 3,
        ("n1", None): T0 + 101,
    }
    assert last_probed(fleet, {}) == expected
    del fleet.derived["last_probed"]
    assert last_probed(fleet, {}) == expected  # a walk of every stored result finds the same


def test_a_new_hello_is_planned_from_what_it_says_not_from_the_last() -> None:
    """A node's Hello facts (its GPUs, the probes it offers) are kept between passes only while
    the Hello is the same: an agent that comes back offering other probes is planned afresh."""
    fleet = Fleet()
    node = add_node(fleet, "n1", gpus=2, probes=("membw",))
    config = cfg(probes=["gemm"])
    assert plan_probes(fleet, in_flight={}, attempts={}, now=T0, config=config, max_reading_age=AGE) == []
    node.hello = pb.Hello(node="n1", boot_id="b2", capabilities=["run_probes"], probes=["gemm", "membw"])
    for i in range(2):
        node.hello.inventory.gpus.add(index=i, uuid=f"GPU-n1-{i}", name=H100)
    plans = plan_probes(fleet, in_flight={}, attempts={}, now=T0, config=config, max_reading_age=AGE)
    assert [(p.node, p.gpus, p.probes) for p in plans] == [("n1", (), ("gemm",))]
