"""NVLinks judged against the GPU's peers (detect/nvlink_peers.py): links off by design (an H100 PCIe
SKU using 12 of its 18, PCIe cards without a bridge) are no fault; a link down beyond what the peers
have is, and so is a whole node's loss against a fleet that has its links. Simulated nodes through
the real frames (tests/simfleet.py)."""

from __future__ import annotations

from controller.config import DetectConfig
from controller.detect import nvlink
from controller.detect.base import DetectContext
from controller.detect.explain import explain_node
from controller.detect.nvlink_peers import link_norms, usual_active
from controller.fleet.state import apply_hello
from tests.simfleet import SimFleet

BY_DESIGN = {4, 5, 10, 11, 16, 17}  # the six links an H100 PCIe SKU leaves unused
H100 = "NVIDIA H100 80GB HBM3"
PART = "692-2G520-0200-000"


def fleet(nodes: int, down: dict[tuple[str, int], set[int]], every_gpu: set[int] | None = None) -> SimFleet:
    sim = SimFleet(nodes)
    for name, node in sim.sims.items():
        for index, gpu in enumerate(node.gpus):
            gpu.condition.nvlinks_down = set(down.get((name, index), every_gpu or set()))
    sim.step(10)
    sim.step(10)
    return sim


def found(sim: SimFleet) -> list[tuple[str, int | None, str, float | None, float | None]]:
    ctx = DetectContext(sim.fleet, DetectConfig(), sim.now)
    return [(f.node, f.gpu, f.summary, f.evidence.value, f.evidence.baseline) for f in nvlink.detect(ctx)]


def test_links_off_by_design_on_every_gpu_are_no_fault() -> None:
    sim = fleet(3, {}, every_gpu=BY_DESIGN)
    assert usual_active(sim.fleet) == {(H100, PART, 18): 12}
    assert found(sim) == []


def test_a_link_down_beyond_the_design_is_found_against_the_peers() -> None:
    sim = fleet(3, {("node-01", 2): BY_DESIGN | {3}}, every_gpu=BY_DESIGN)
    assert found(sim) == [
        (
            "node-01",
            2,
            "GPU 2 7 of 18 NVLinks inactive: 3, 4, 5, 10, 11, 16, 17; its peers have 12 of 18 active",
            11.0,
            12.0,
        )
    ]


def test_cards_without_any_active_link_are_no_fault() -> None:
    sim = fleet(2, {}, every_gpu=set(range(18)))  # PCIe cards without their NVLink bridge
    assert usual_active(sim.fleet) == {(H100, PART, 18): 0}
    assert found(sim) == []


def test_with_every_link_expected_up_a_link_down_is_found_as_before() -> None:
    sim = fleet(3, {("node-02", 5): {3}})
    assert found(sim) == [("node-02", 5, "GPU 5 1 of 18 NVLinks inactive: 3", 17.0, 18.0)]


def test_a_whole_node_down_against_an_even_fleet_is_found() -> None:
    # 8 GPUs with every link up, 8 with none: a tie goes to the higher count, the links being up.
    sim = fleet(2, {("node-01", i): set(range(18)) for i in range(8)})
    assert sorted(gpu or 0 for node, gpu, *_ in found(sim) if node == "node-01") == list(range(8))
    assert {node for node, *_ in found(sim)} == {"node-01"}


def test_a_slow_collective_is_not_put_down_to_links_off_by_design() -> None:
    sim = fleet(3, {}, every_gpu=BY_DESIGN)
    ctx = DetectContext(sim.fleet, DetectConfig(), sim.now)
    node = sim.fleet.nodes["node-00"]
    explained = explain_node(node, usual=link_norms(ctx).usual)
    assert "nvlink_down" not in {cause for _, cause, _ in explained}
    assert {cause for _, cause, _ in explain_node(node)} == {"nvlink_down"}  # link by link, as before
    assert link_norms(ctx) is link_norms(ctx)  # worked out once a pass


def test_a_variant_of_the_same_model_is_judged_against_its_own_design() -> None:
    """Four nodes of 18-link boards and two of a variant with the same name and another part number
    that uses 12 of its 18: by model alone the majority's 18 made the variant's 16 GPUs nvlink_down."""
    sim = SimFleet(6)
    variant = {"node-01", "node-04"}
    for name in variant:
        hello = sim.hello(name)
        for info in hello.inventory.gpus:
            info.board_part_number = "692-2G520-0202-000"
        apply_hello(sim.fleet, hello, 0, sim.now)
        for gpu in sim.sims[name].gpus:
            beyond = {3} if (name, gpu.index) == ("node-04", 6) else set()
            gpu.condition.nvlinks_down = BY_DESIGN | beyond
    sim.step(10)
    sim.step(10)
    assert [(node, gpu, value, baseline) for node, gpu, _, value, baseline in found(sim)] == [
        ("node-04", 6, 11.0, 12.0)
    ]
    assert usual_active(sim.fleet) == {(H100, PART, 18): 18, (H100, "692-2G520-0202-000", 18): 12}
