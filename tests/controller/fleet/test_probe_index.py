"""One node's probe results through the kept index (controller/fleet/probe_index.py): always what a
walk of every stored result finds, through new results, a replayed older one, a Hello and expiry;
and new results are carried into the index rather than making the next reader build it again."""

from __future__ import annotations

import random

from controller.fleet.expiry import forget
from controller.fleet.model import Fleet, FrameWrite, NodeState, ProbeRecord
from controller.fleet.probe_index import BY_NODE, newest_probe, node_probes
from controller.fleet.state import apply_frame, apply_hello
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import T0

RESULT = pb.ProbeResult(probe="gemm", variant="bf16", unit="TFLOP/s", value=700.0)


def result(fleet: Fleet, node: str, gpu: int | None, time: float, probe: str = "gemm") -> None:
    write = FrameWrite(node, "b1", 1, time)
    write.probes = [ProbeRecord(node, gpu, probe, "bf16", 700.0, "TFLOP/s", time, RESULT.SerializeToString())]
    apply_frame(fleet, write)


def order(record: ProbeRecord) -> tuple[int, str, str]:
    return (-1 if record.gpu is None else record.gpu, record.probe, record.variant)


def walked(fleet: Fleet, node: str) -> list[ProbeRecord]:
    return sorted((r for k, r in fleet.probes.items() if k[0] == node), key=order)


def indexed(fleet: Fleet, node: str) -> list[ProbeRecord]:
    return sorted(node_probes(fleet, node), key=order)


def fleet_of(*names: str) -> Fleet:
    fleet = Fleet()
    for name in names:
        fleet.nodes[name] = NodeState(name, pb.Hello(node=name, boot_id="b1"), T0, T0)
    return fleet


def test_new_results_are_carried_into_the_index_without_building_it_again() -> None:
    fleet = fleet_of("n1", "n2", "n3")
    for gpu in range(4):
        result(fleet, "n1", gpu, T0 + gpu)
    result(fleet, "n2", 0, T0)
    assert [r.gpu for r in indexed(fleet, "n1")] == [0, 1, 2, 3] and indexed(fleet, "n3") == []
    kept = fleet.derived[BY_NODE][1]
    result(fleet, "n1", None, T0 + 100, "nccl")  # a new key
    result(fleet, "n1", 2, T0 + 101)  # a newer result of a known key
    result(fleet, "n1", 3, T0 - 50)  # an older one (a replayed spool): not stored over the newer
    result(fleet, "n3", 0, T0 + 5)  # a node the index had no result of
    assert fleet.derived[BY_NODE] == ((fleet.probe_version, len(fleet.probes)), kept)  # carried, current
    assert indexed(fleet, "n1") == walked(fleet, "n1")
    assert {r.gpu: r.time for r in indexed(fleet, "n1")} == {
        0: T0,
        1: T0 + 1,
        2: T0 + 101,
        3: T0 + 3,
        None: T0 + 100,
    }
    assert newest_probe(fleet, "n1") == T0 + 101
    assert indexed(fleet, "n3") == walked(fleet, "n3") and newest_probe(fleet, "n3") == T0 + 5
    assert node_probes(fleet, "ghost") == [] and newest_probe(fleet, "ghost") == 0.0


def test_what_else_changes_the_results_has_the_next_reader_build_the_index_again() -> None:
    """Expiry drops a node's results, a Hello bumps the version, and a writer that stores results
    as the store's load or the detection copy do (bumping the version, not carrying them): the
    index read afterwards is the walk's, in a random sequence of all of them."""
    rng = random.Random(7)
    names = [f"n{i}" for i in range(6)]
    fleet = fleet_of(*names)
    for step in range(400):
        node = rng.choice(names)
        action = rng.random()
        if action < 0.6:
            result(
                fleet,
                node,
                rng.choice([None, 0, 1, 2]),
                T0 + rng.uniform(-100, 100),
                rng.choice(["gemm", "nccl"]),
            )
        elif action < 0.7:
            forget(fleet, [node])
            fleet.nodes[node] = NodeState(node, pb.Hello(node=node, boot_id="b1"), T0, T0)
        elif action < 0.8:
            apply_hello(fleet, pb.Hello(node=node, boot_id=f"b{step}"), 0, T0)
        elif action < 0.9:  # stored as a load or a copy does: the version bumped, nothing carried
            record = ProbeRecord(node, 5, "pcie", "h2d", 50.0, "GB/s", T0 + step, RESULT.SerializeToString())
            fleet.probes[record.key] = record
            fleet.probe_version += 1
        for name in names:  # read after every step: a stale index shows at once
            assert indexed(fleet, name) == walked(fleet, name), (step, name)
            assert newest_probe(fleet, name) == max((r.time for r in walked(fleet, name)), default=0.0)
