"""Detectors whose verdict on a GPU reads only that GPU: each GPU is judged again only when its
state is new since the last pass.

Six detectors (throttle, xid, nvlink_errors, row_remap, pcie_link, nvlink) judge each GPU from its
GpuState (sample, time, held), its node's trends for that GPU, and the config. Under load about an
eighth of the GPUs get a new reading between two passes, yet every pass judged every GPU. each_gpu
keeps each node's verdicts in Fleet.derived with the objects they were judged from, and judges a
node's GPUs again only where those are not the same objects (`is`: protobuf equality would cost
what judging does).

Identity is exact, as every change to what a verdict reads replaces an object:
- an accepted reading replaces the GPU's GpuState with a new one (fleet/state.py apply_frame,
  fleet/adopt.py; store/stored_nodes.py and a detection process's slice build new ones), never
  changes one in place: its sample is screened before, its held dict built anew (update_held);
- a GPU's counter trends (fleet/trends.py) change only in observe_gpu for that GPU, which those same
  places call together with the replacement;
- a node built anew (a Hello after it was forgotten, a slice replacing a detection process's copy)
  is a new NodeState: all its GPUs are judged again;
- but not the node's XID events (Trends.xids), which every GPU's readings change: a GPU's new events
  are appended, and the node's events past XID_KEEP_SECONDS drop from the front whichever GPU was
  read, as does the oldest once the deque is full. Another GPU's reading can thus drop the events a
  GPU's xid finding stands on, its own GpuState unchanged. So xid passes `also`: the deque's first
  and last event. Each event is a new object, only appended and only dropped from the front, so
  those two name what the deque holds; when either is another, the node's GPUs are judged again.
A different DetectConfig (compared with == once a pass) judges every GPU again.

The verdicts' Finding objects are returned again on later passes: nothing downstream changes them
(detect/runner.py merge builds new ones; a detection process sends copies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from operator import itemgetter

from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.fleet.derived import carried, keep, same_objects
from controller.fleet.finding import Finding
from controller.fleet.model import GpuState, NodeState

Judge = Callable[[NodeState, GpuState, DetectConfig], list[Finding]]
Also = Callable[[NodeState], tuple[object, ...]]
# One node's verdicts: the node, also(node), its GpuStates in node.gpus order, each one's findings
# in that order (None: none on any, as on most nodes; () for a GPU with none), and all of them in
# GPU index order. Two objects a node per detector (three with findings), kept for the whole fleet.
_Kept = tuple[
    NodeState, tuple[object, ...], tuple[GpuState, ...], list[Sequence[Finding]] | None, tuple[Finding, ...]
]
_FIRST = itemgetter(0)


def each_gpu(ctx: DetectContext, name: str, judge: Judge, also: Also | None = None) -> list[Finding]:
    """`judge`'s findings on every GPU, node by node in fleet order and GPUs in index order, judged
    again only where the GPU's state, its node or also(node) is not what it was judged from (kept
    in Fleet.derived under "per_gpu:NAME" with the config). Nodes gone from the fleet drop out.

    Per node, not per GPU: a node whose GpuStates are all the ones judged (most of them) costs one
    look at its entry and one walk of its GPUs in C, and adds its findings in one go."""
    config, key = ctx.config, f"per_gpu:{name}"
    kept: dict[str, _Kept] = carried(ctx.fleet, key, config) or {}  # another config: all judged again
    nodes = ctx.fleet.nodes
    findings: list[Finding] = []
    for node_name, node in nodes.items():
        extra = () if also is None else also(node)
        entry = kept.get(node_name)
        gpus = node.gpus
        if entry is None or entry[0] is not node or not (entry[1] is extra or same_objects(entry[1], extra)):
            entry = kept[node_name] = _judge(node, extra, None, judge, config)
        elif not same_objects(entry[2], gpus.values()):
            entry = kept[node_name] = _judge(node, extra, entry, judge, config)
        if entry[4]:
            findings += entry[4]
    if len(kept) > len(nodes):  # every node has its entry now: the rest are of nodes gone
        kept = {n: entry for n, entry in kept.items() if n in nodes}
    keep(ctx.fleet, key, config, kept)
    return findings


def _judge(
    node: NodeState, extra: tuple[object, ...], entry: _Kept | None, judge: Judge, config: DetectConfig
) -> _Kept:
    """The node's entry: each GPU's findings as `entry` has them where the GpuState in its place
    is the one judged (a GPU removed or added shifts the rest: judged again), else judged now."""
    gpus = tuple(node.gpus.values())
    found: list[Sequence[Finding]]
    if entry is None or len(entry[2]) != len(gpus):
        found = [judge(node, gpu, config) or () for gpu in gpus]
    else:
        known = repeat(()) if entry[3] is None else entry[3]
        found = [
            before if was is gpu else judge(node, gpu, config) or ()
            for was, gpu, before in zip(entry[2], gpus, known, strict=False)
        ]
    if not any(found):
        return node, extra, gpus, None, ()
    ordered = sorted(zip(node.gpus, found, strict=True), key=_FIRST)
    return node, extra, gpus, found, tuple(f for _, of_gpu in ordered for f in of_gpu)
