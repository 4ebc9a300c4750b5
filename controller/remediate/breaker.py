"""The blast-radius breaker, decided in pure functions: state in, decision and new state out.

One sliding window (default one hour) holds the actions (retunes now, drains later) taken on nodes
the fleet knows (a node joining the fleet, never seen, is not counted; scale-up never trips it;
a known node that went silent counts like any other). An action holds its place while it is in
progress, however long, and for a window after it ends. Inside the window at most `max(1, ceil(share x N))`
distinct nodes may be in action, per peer group (N: the group's current size) and fleet-wide (N:
the current fleet). An action counts whatever its outcome: a failed or rolled-back action keeps its
place (its outcome never frees it). A degrading request that would exceed either budget is refused
and trips the breaker; a tripped breaker refuses every degrading request until `reset` (an audited
operator command) re-arms it with a fresh window. Recovery (rollback, uncordon, re-apply of desired
state) always proceeds and never counts. There is no bypass: no parameter skips these checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

FLEET = "fleet"  # the usage scope of the whole fleet
OUTCOMES = ("in_progress", "succeeded", "failed", "rolled_back")


@dataclass(frozen=True, slots=True)
class Limits:
    window_seconds: float = 3600.0
    share: float = 0.05  # p: at most max(1, ceil(p x N)) nodes in action per window


@dataclass(frozen=True, slots=True)
class Action:
    id: str
    kind: str  # retune, drain, ...
    node: str
    group: str  # the node's peer group (controller/fleet/peers.py)
    time: float
    outcome: str = "in_progress"  # in_progress, succeeded, failed, rolled_back
    finished: float | None = None  # when it ended; it leaves the window `window_seconds` after


@dataclass(frozen=True, slots=True)
class State:
    actions: tuple[Action, ...] = ()  # in the window (older ones are dropped as it slides)
    tripped: bool = False
    why: str = ""  # why it tripped
    tripped_at: float | None = None


@dataclass(frozen=True, slots=True)
class Request:
    id: str
    kind: str
    node: str
    group: str
    healthy: bool = True  # the node is known to the fleet (False: joining, never seen): only then it counts
    is_recovery: bool = False  # rollback, uncordon, re-apply of desired state: always proceeds


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    why: str
    state: State


@dataclass(frozen=True, slots=True)
class Usage:
    scope: str  # FLEET or a peer group
    size: int  # N: nodes in the fleet or group now
    limit: int
    nodes: tuple[str, ...] = field(default=())  # distinct nodes in action inside the window

    @property
    def used(self) -> int:
        return len(self.nodes)


def budget(share: float, size: int) -> int:
    """max(1, ceil(share x size)): N=10 -> 1, N=100 -> 5 at 5%."""
    return max(1, math.ceil(share * size - 1e-9))


def slide(state: State, now: float, limits: Limits) -> State:
    """Drop the actions that left the window: ended more than `window_seconds` ago. One still in
    progress stays, however long it takes (a long drain must not free its slot)."""
    since = now - limits.window_seconds
    kept = tuple(
        a
        for a in state.actions
        if a.outcome == "in_progress" or (a.time if a.finished is None else a.finished) > since
    )
    return state if len(kept) == len(state.actions) else replace(state, actions=kept)


def usage(state: State, now: float, limits: Limits, sizes: dict[str, int]) -> list[Usage]:
    """Fleet-wide first, then each group with actions in the window or a known size."""
    state = slide(state, now, limits)
    fleet_size = sum(sizes.values())
    groups = sorted(set(sizes) | {a.group for a in state.actions})
    out = [Usage(FLEET, fleet_size, budget(limits.share, fleet_size), _nodes(state.actions))]
    for g in groups:
        out.append(Usage(g, sizes.get(g, 0), budget(limits.share, sizes.get(g, 0)), _nodes(state.actions, g)))
    return out


def _nodes(actions: tuple[Action, ...], group: str | None = None) -> tuple[str, ...]:
    return tuple(sorted({a.node for a in actions if group is None or a.group == group}))


def decide(state: State, request: Request, now: float, limits: Limits, sizes: dict[str, int]) -> Decision:
    """Allow or refuse `request`; `sizes` is each peer group's current node count (the fleet is their sum)."""
    state = slide(state, now, limits)
    if request.is_recovery:
        return Decision(True, "recovery always proceeds", state)
    if state.tripped:
        return Decision(False, f"breaker tripped: {state.why}; `gpufleet breaker reset` re-arms it", state)
    if not request.healthy:
        return Decision(True, "node joining the fleet (never seen): not counted", state)
    action = Action(request.id, request.kind, request.node, request.group, now)
    for scope in usage(state, now, limits, sizes):
        if scope.scope not in {FLEET, request.group}:
            continue
        if request.node in scope.nodes or scope.used < scope.limit:
            continue
        where = "fleet-wide" if scope.scope == FLEET else f"in peer group {scope.scope}"
        why = (
            f"{request.kind} on {request.node} refused: {scope.used} of {scope.limit} nodes already "
            f"in action {where} within {limits.window_seconds:.0f}s ({', '.join(scope.nodes)})"
        )
        return Decision(False, why, replace(state, tripped=True, why=why, tripped_at=now))
    return Decision(True, "within budget", replace(state, actions=(*state.actions, action)))


def finish(state: State, action_id: str, outcome: str, now: float | None = None) -> State:
    """Record an action's outcome (at `now`); it stays in the window whatever the outcome."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
    actions = tuple(
        replace(a, outcome=outcome, finished=now) if a.id == action_id else a for a in state.actions
    )
    return replace(state, actions=actions)


def reset(state: State) -> State:
    """Re-arm: not tripped, and a fresh window (the operator has looked at what filled the last one)."""
    return State()
