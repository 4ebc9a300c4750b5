"""Run every enabled detector, each in a guard, and merge what they say about the same thing."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace

from controller.detect.base import DetectContext, discover
from controller.fleet.finding import Finding, FindingKey, worse

log = logging.getLogger("gpufleet.controller.detect")


@dataclass(slots=True)
class PassReport:
    findings: list[Finding]  # merged (see merge)
    durations: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    # With merged=False: each detector's own findings, in the order the detectors ran, and no merge
    # yet (`findings` empty): reports of detectors run apart are merged together (detection/pool.py).
    raw: dict[str, list[Finding]] = field(default_factory=dict)


def run_detectors(ctx: DetectContext, names: list[str] | None = None, *, merged: bool = True) -> PassReport:
    steps = _Steps(ctx, names)
    for _ in steps:
        pass
    if not merged:
        steps.report.findings = []
        steps.report.raw = steps.raw
    return steps.report


YIELD_SHARE = 0.5  # after each detector, the loop gets this share of the time it took...
YIELD_MAX_SECONDS = 0.25  # ...up to this


async def run_detectors_yielding(ctx: DetectContext, names: list[str] | None = None) -> PassReport:
    """run_detectors, handing the event loop back after each detector for half the time it took:
    frames that arrived meanwhile are stored and acked (each takes several turns of the loop: read,
    commit, ack) within about one detector's time, not the whole pass's (issue 17). The pass's wall
    time grows by that half; its CPU does not. Each detector still reads the fleet in one go; the next
    may see a few frames more."""
    steps = _Steps(ctx, names)
    for name in steps:
        await asyncio.sleep(min(steps.report.durations[name] * YIELD_SHARE, YIELD_MAX_SECONDS))
    return steps.report


class _Steps:
    """Each enabled detector in turn, each in a guard; `report` holds the merged findings at the end."""

    def __init__(self, ctx: DetectContext, names: list[str] | None) -> None:
        registry = discover()
        self.ctx = ctx
        self.registry = registry
        self.pending = list(names if names is not None else ctx.config.enabled(sorted(registry)))
        self.raw: dict[str, list[Finding]] = {}
        self.report = PassReport(findings=[])

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> str:
        if not self.pending:
            self.report.findings = merge([f for found in self.raw.values() for f in found])
            raise StopIteration
        name = self.pending.pop(0)
        start = time.perf_counter()
        try:
            self.raw[name] = list(self.registry[name](self.ctx))
        except Exception as exc:  # one broken detector must not hide what the others found
            log.exception("detector %s failed", name)
            self.report.failed[name] = str(exc)
        self.report.durations[name] = time.perf_counter() - start
        return name


# A node's slow probe results that nothing else explains are explained by its driver branch being
# slower than GPUs alike on another (detect/driver_branches.py) on those probes: both say
# "investigate", one of them says why. A node of fewer GPUs than min_peers is judged by the
# datasheet ratio besides, and would show the branch's slowness twice, once as slow_unknown per GPU.
# Only results of probes the branch is behind on are explained: a GPU's slow membw beside a branch
# slow at GEMM stays a finding of its own.
EXPLAINS_SLOW_UNKNOWN = ("driver_branch_slow",)


def merge(findings: list[Finding]) -> list[Finding]:
    """One finding per (node, gpu, cause): the worst severity, the first detector's evidence as primary
    (probe evidence, which says how slow, comes first), the rest as supporting. A node's slow_unknown
    findings fold into its finding of a cause that explains them (EXPLAINS_SLOW_UNKNOWN), as
    supporting evidence, where every metric of theirs is one that finding's evidence names: nothing
    is dropped, and no drainable cause is hidden (both investigate)."""
    return _fold_unknown(_merge(findings))


def _fold_unknown(findings: list[Finding]) -> list[Finding]:
    explaining = {f.node: f for f in findings if f.cause in EXPLAINS_SLOW_UNKNOWN}
    if not explaining:
        return findings
    explained = {node: {e.metric for e in (f.evidence, *f.supporting)} for node, f in explaining.items()}
    out = []
    for f in findings:
        into = explaining.get(f.node) if f.cause == "slow_unknown" else None
        if into is None or not {e.metric for e in (f.evidence, *f.supporting)} <= explained[f.node]:
            out.append(f)
            continue
        into.severity = worse(into.severity, f.severity)
        gpu = "" if f.gpu is None else f"GPU {f.gpu}: "
        for ev in (f.evidence, *f.supporting):
            shown = replace(ev, detail=gpu + ev.detail) if ev.detail else ev
            if shown not in into.supporting and shown != into.evidence:
                into.supporting.append(shown)
        into.detectors.extend(d for d in f.detectors if d not in into.detectors)
    return out


def _merge(findings: list[Finding]) -> list[Finding]:
    merged: dict[FindingKey, Finding] = {}
    for f in sorted(findings, key=lambda f: (f.key[0], -1 if f.gpu is None else f.gpu, f.cause, _rank(f))):
        current = merged.get(f.key)
        if current is None:
            merged[f.key] = Finding(
                f.node,
                f.gpu,
                f.cause,
                f.severity,
                f.summary,
                f.evidence,
                list(f.supporting),
                list(f.detectors),
            )
            continue
        current.severity = worse(current.severity, f.severity)
        for ev in (f.evidence, *f.supporting):
            if ev not in current.supporting and ev != current.evidence:
                current.supporting.append(ev)
        current.detectors.extend(d for d in f.detectors if d not in current.detectors)
    return list(merged.values())


def _rank(f: Finding) -> int:
    return 0 if f.evidence.metric.startswith("probe.") else 1
