"""A driver branch slower than another: GPUs built alike that probe slower on one branch.

Probe results are judged among GPUs of one class (fleet/peers.py gpu_class), the driver branch part
of it: a node on another branch is no outlier for being on it. That hides the one thing a rolling
driver upgrade has to show, the new branch itself being slower, and a lone node on an odd branch is
judged among its own GPUs alone. So per probe, variant and unit, the results of GPUs alike but for
the branch (same model, board part number, NVLinks, default power limit) are compared branch by
branch: each branch's median, where it has `min_peers` results, against the best median of a
branch on MIN_NODES nodes at least (one node is no reference for a branch: it may be slow for
reasons of its own). A branch more than `margin` worse than that, widened to `min_robust_z` robust
sigmas of the reference's results (a noisy group's threshold follows its spread), is slow on every
node of it, a lone node too: one finding per node, on the probe where its branch is furthest
behind (each other probe it is behind on as supporting evidence), cause driver_branch_slow
(investigate: no setting of the node fixes it).

A branch with fewer than `min_peers` results (a lone node of one, two or three GPUs on an odd
branch) has no median worth the name; it is judged by its best result instead: slow only when every
one of its results is beyond the threshold, so one GPU slow for reasons of its own (heat, a power
cap) does not make its node's branch slow. Such a node is otherwise judged by nothing: its class
holds its own GPUs alone.

Per-GPU results only (a node-level result's class mixes its GPUs'). The judgement reads only probe
results, the Hellos and the config, so it is reused until one of them changes, as probe_outlier's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import islice

from controller.detect.base import DetectContext, register
from controller.detect.probe_outlier import reused, worse_by
from controller.detect.stats import Baseline, baseline
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import ProbeKey, ProbeRecord
from controller.fleet.probe_groups import described, grouped

NAME = "driver_branch_slow"
MIN_NODES = 2  # the reference branch's nodes at least: one node's median is that node's
SAMPLE = 2048  # results a branch's median is taken from at most
DRIVER = "driver "

# (model, the class but for its branch, probe, variant, unit, "higher" | "lower")
Family = tuple[str, ...]


def split_branch(rest: str) -> tuple[str, str]:
    """A GpuClass's rest as (the rest but the driver branch, the branch): ("692-2G520-0200-000,
    18 NVLinks, 700 W", "550") of "692-2G520-0200-000, 18 NVLinks, 700 W, driver 550"."""
    head, _, last = rest.rpartition(", ")
    if last.startswith(DRIVER):
        return head, last.removeprefix(DRIVER)
    return rest, ""


@dataclass(frozen=True, slots=True)
class Branch:
    name: str
    results: Baseline
    nodes: frozenset[str] = frozenset()  # read for a branch behind, and the best one, only
    best_result: float | None = None  # a small branch's (fewer than min_peers results): judged by it

    @property
    def value(self) -> float:
        """What the branch is judged by: its median, or a small branch's best result."""
        return self.results.median if self.best_result is None else self.best_result

    def words(self, unit: str) -> str:
        gpus, nodes = self.results.count, len(self.nodes)
        on = f"on {nodes} node{'' if nodes == 1 else 's'}"
        if self.best_result is not None:
            of = f"its {gpus} GPU results" if gpus > 1 else "its one GPU result"
            return f"driver {self.name} (best of {of} {self.best_result:.1f} {unit} {on})"
        return f"driver {self.name} (median {self.results.median:.1f} {unit} over {gpus} GPU results {on})"


@dataclass(frozen=True, slots=True)
class Behind:
    """A branch behind the best branch of a family on one probe."""

    family: Family
    slow: Branch
    best: Branch
    worse: float  # how much worse its median is than the best's, as a share

    @property
    def higher_better(self) -> bool:
        return self.family[-1] == "higher"


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    """One finding per node of a branch behind: its evidence the probe where the branch is furthest
    behind, every other probe it is behind on as supporting evidence (furthest first)."""
    behind_on: dict[str, list[Behind]] = {}
    for behind in sorted(judged(ctx), key=lambda b: -b.worse):
        for node in behind.slow.nodes:
            behind_on.setdefault(node, []).append(behind)
    evidence: dict[int, Evidence] = {}  # id(Behind) -> its evidence, the same on each of its nodes
    for behinds in behind_on.values():
        for behind in behinds:
            if id(behind) not in evidence:
                evidence[id(behind)] = _evidence(behind)
    return [
        _finding(node, behinds[0], [evidence[id(b)] for b in behinds])
        for node, behinds in sorted(behind_on.items())
    ]


def judged(ctx: DetectContext) -> list[Behind]:
    return reused(ctx, NAME, _judge_all)


def _judge_all(ctx: DetectContext) -> list[Behind]:
    """Only families on two branches or more are read result by result: in a fleet on one branch
    (nearly always) a judgement is a walk over the group names. At 12,500 nodes (700,000 results)
    split over two branches it took 0.4 s (0.9 s with one behind), each time a result had come in since
    the last; with each branch's median from SAMPLE of its results, 0.03 s (0.08 s with one behind,
    then 0.13 s to make its 6,250 nodes' findings each pass)."""
    families: dict[Family, dict[str, dict[ProbeKey, ProbeRecord]]] = {}
    for group, members in grouped(ctx.fleet).items():
        if len(group) < 4 or group[2] != "gpu":
            continue
        rest, name = split_branch(group[1])
        if name:
            families.setdefault((group[0], rest, *group[3:]), {})[name] = members
    config = ctx.config
    out: list[Behind] = []
    for family, by_branch in families.items():
        if len(by_branch) < 2:
            continue
        higher_better = family[-1] == "higher"
        branches = [
            _branch(name, members, config.min_peers, higher_better)
            for name, members in sorted(by_branch.items())
        ]
        references = [
            b for b in branches if b.best_result is None and _on_nodes(by_branch[b.name], MIN_NODES)
        ]
        if not references:
            continue
        best = max(references, key=lambda b: b.results.median if higher_better else -b.results.median)
        if not best.results.median:
            continue
        threshold = best.results.margin(config.margin, config.min_robust_z)
        best_read: Branch | None = None
        for branch in branches:
            worse = worse_by(best.results.deviation(branch.value), higher_better)
            if branch is not best and worse > threshold:
                if best_read is None:
                    best_read = replace(best, nodes=_nodes(by_branch[best.name]))
                slow = replace(branch, nodes=_nodes(by_branch[branch.name]))
                out.append(Behind(family, slow, best_read, worse))
    return out


def _branch(name: str, members: dict[ProbeKey, ProbeRecord], min_peers: int, higher_better: bool) -> Branch:
    """A branch of `members`; one of fewer than `min_peers` results is judged by its best result."""
    if len(members) >= min_peers:
        return Branch(name, _baseline(members))
    values = [r.value for r in members.values()]
    return Branch(name, baseline(values), best_result=max(values) if higher_better else min(values))


def _baseline(members: dict[ProbeKey, ProbeRecord]) -> Baseline:
    """The branch's baseline from SAMPLE of its results at most, taken evenly through them (count:
    all of them). Its median moves by far less than any margin for it: about 0.05% at a 1.7% spread."""
    step = max(1, len(members) // SAMPLE)
    found = baseline([r.value for r in islice(members.values(), 0, None, step)])
    return replace(found, count=len(members))


def _on_nodes(members: dict[ProbeKey, ProbeRecord], least: int) -> bool:
    """Whether the results come from `least` nodes or more (read until that many are seen)."""
    seen: set[str] = set()
    for record in members.values():
        seen.add(record.node)
        if len(seen) >= least:
            return True
    return False


def _nodes(members: dict[ProbeKey, ProbeRecord]) -> frozenset[str]:
    return frozenset(key[0] for key in members)


def _evidence(behind: Behind) -> Evidence:
    model, rest, probe, variant, unit = behind.family[:5]
    slow, best = behind.slow, behind.best
    side = "below" if behind.higher_better else "above"
    deviation = best.results.deviation(slow.value)
    alike = described((model, f"{rest}, driver *" if rest else "driver *", "gpu"))
    return Evidence(
        metric=f"probe.{probe}.{variant}",
        value=round(slow.value, 3),
        baseline=round(best.results.median, 3),
        deviation=round(deviation, 4),
        unit=unit,
        peers=best.results.count,
        detail=f"{probe} {variant} on {slow.words(unit)} is {behind.worse:.1%} {side} "
        f"{best.words(unit)}, GPUs otherwise alike ({alike})"
        + ("" if behind.higher_better else ": lower is better"),
        baseline_source="peers",
    )


def _finding(node: str, furthest: Behind, evidence: list[Evidence]) -> Finding:
    """`evidence`: of every probe the node's branch is behind on, the furthest first."""
    probe, variant = furthest.family[2:4]
    side = "below" if furthest.higher_better else "above"
    slow, best = furthest.slow.name, furthest.best.name
    summary = f"driver {slow}: {probe} {variant} {furthest.worse:.0%} {side} driver {best}"
    return Finding(node, None, NAME, "warning", summary, evidence[0], evidence[1:], [NAME])
