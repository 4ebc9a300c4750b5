"""How many NVLinks a GPU's peers have active: a GPU's inactive links are a fault only below that.

Some GPUs have links that are off by design. An H100 PCIe SKU uses 12 of its 18 links, and NVML
reports the other six inactive (as `nvidia-smi nvlink -s` does); a PCIe card without its NVLink
bridge has none active. Judged link by link, every such GPU was nvlink_down, critical, fleet-wide
(and a slow collective on such a node was put down to its links). So a GPU's active links are
compared with its peers': the GPUs of the same model and board part number (the SKU variant) with as
many links, in the whole fleet. The number of active links most of them have (on a tie, the higher)
is what that kind of GPU has here; a GPU with fewer has links down. The part number keeps a fleet
that mixes a 12-link variant with full 18-link boards of the same name from judging the minority's
design against the majority's.

A fleet whose GPUs of a model all miss the same number of links is taken to be built that way, so
a lone node whose GPUs all lost their links the same way shows no nvlink_down (its nccl probe still
reads slow, and the agent's per-link alert still compares link by link).

Read once a pass, and only when some GPU has a link inactive: a GPU without one has them all
active (its `held` conditions say so, fleet/conditions.py), so most GPUs cost a set lookup.
"""

from __future__ import annotations

from collections import Counter

from controller.detect.base import DetectContext
from controller.fleet.model import Fleet, GpuState, NodeState

Kind = tuple[str, str, int]  # (GPU model, board part number, NVLinks it reports)
Skus = dict[int, tuple[str, str]]  # (model, board part number) of a node's GPUs by index


def skus(node: NodeState) -> Skus:
    """The node's GPUs' (model, board part number) by index (the first of an index, as gpu_name)."""
    return {g.index: (g.name, g.board_part_number) for g in reversed(node.hello.inventory.gpus)}


MEMO = "nvlink_peers"


def links_of(gpu: GpuState) -> tuple[int, int]:
    """(links, active links) of the GPU's latest reading; (0, 0) when it reports no NVLink."""
    sample = gpu.sample
    total = len(sample.nvlinks)
    if not total or "nvlink_inactive" not in gpu.held:
        return total, total
    if sample.HasField("nvlinks_inactive"):  # as the agent counted them (an older agent's: read)
        return total, total - sample.nvlinks_inactive
    return total, sum(1 for link in sample.nvlinks if link.active)


def usual_active(fleet: Fleet) -> dict[Kind, int]:
    """Each kind of GPU in the fleet: the number of active links most of its GPUs have (ties: the
    higher)."""
    counts: Counter[tuple[Kind, int]] = Counter()
    for node in fleet.nodes.values():
        names: Skus | None = None
        for index, gpu in node.gpus.items():
            total, active = links_of(gpu)
            if not total:
                continue
            names = skus(node) if names is None else names
            counts[(*names.get(index, ("", "")), total), active] += 1
    best: dict[Kind, tuple[int, int]] = {}
    for (kind, active), n in counts.items():
        if (n, active) > best.get(kind, (0, -1)):
            best[kind] = (n, active)
    return {kind: active for kind, (_, active) in best.items()}


class LinkNorms:
    """A pass's view of what each kind of GPU has active, worked out the first time it is asked."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._usual: dict[Kind, int] | None = None
        self._names: tuple[NodeState, Skus] | None = None  # the last node asked about

    def usual(self, node: NodeState, index: int, total: int) -> int:
        """The active links GPU `index` of `node` (reporting `total` links) should have."""
        if self._usual is None:
            self._usual = usual_active(self.fleet)
        if self._names is None or self._names[0] is not node:  # a node's GPUs are asked in a row
            self._names = (node, skus(node))
        return self._usual.get((*self._names[1].get(index, ("", "")), total), total)


def link_norms(ctx: DetectContext) -> LinkNorms:
    """The pass's LinkNorms (shared by the detectors of one pass)."""
    found = ctx.memo.get(MEMO)
    if not isinstance(found, LinkNorms):
        found = ctx.memo[MEMO] = LinkNorms(ctx.fleet)
    return found
