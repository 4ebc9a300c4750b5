"""The breaker's pure decisions: the budget, the sliding window, who counts, tripping, recovery."""

from __future__ import annotations

import pytest

from controller.remediate.breaker import (
    FLEET,
    Limits,
    Request,
    State,
    budget,
    decide,
    finish,
    reset,
    usage,
)

LIMITS = Limits(window_seconds=3600.0, share=0.05)
T0 = 1_000_000.0


def req(
    node: str, group: str = "A", *, kind: str = "retune", healthy: bool = True, is_recovery: bool = False
) -> Request:
    return Request(f"r-{node}", kind, node, group, healthy=healthy, is_recovery=is_recovery)


@pytest.mark.parametrize(
    ("size", "limit"), [(0, 1), (1, 1), (10, 1), (20, 1), (21, 2), (40, 2), (100, 5), (101, 6), (1000, 50)]
)
def test_budget_is_max_one_ceil_share_times_n(size: int, limit: int) -> None:
    assert budget(0.05, size) == limit


def test_ten_nodes_allow_one_then_refuse_and_trip() -> None:
    sizes = {"A": 10}
    first = decide(State(), req("n1"), T0, LIMITS, sizes)
    assert first.allowed and not first.state.tripped
    second = decide(first.state, req("n2"), T0 + 1, LIMITS, sizes)
    assert not second.allowed and second.state.tripped
    assert "1 of 1" in second.why and "n1" in second.why
    assert second.state.tripped_at == T0 + 1


def test_hundred_nodes_allow_five_per_group_and_fleet() -> None:
    sizes = {"A": 100}
    state = State()
    for i in range(5):
        d = decide(state, req(f"n{i}"), T0 + i, LIMITS, sizes)
        assert d.allowed, d.why
        state = d.state
    refused = decide(state, req("n5"), T0 + 6, LIMITS, sizes)
    assert not refused.allowed and refused.state.tripped


def test_the_group_budget_binds_before_the_fleet_budget() -> None:
    # Fleet of 100 (limit 5) in two groups: A has 90 nodes (limit 5), B has 10 (limit 1).
    sizes = {"A": 90, "B": 10}
    d = decide(State(), req("b1", "B"), T0, LIMITS, sizes)
    assert d.allowed
    refused = decide(d.state, req("b2", "B"), T0, LIMITS, sizes)
    assert not refused.allowed and "peer group B" in refused.why
    # ...while group A still had room: only B's budget was spent.
    assert decide(d.state, req("a1", "A"), T0, LIMITS, sizes).allowed


def test_the_fleet_budget_binds_across_groups() -> None:
    # 20 groups of 5 nodes: each group allows 1, the fleet of 100 allows 5.
    sizes = {f"G{i}": 5 for i in range(20)}
    state = State()
    for i in range(5):
        d = decide(state, req(f"n{i}", f"G{i}"), T0, LIMITS, sizes)
        assert d.allowed
        state = d.state
    refused = decide(state, req("n5", "G5"), T0, LIMITS, sizes)
    assert not refused.allowed and "fleet-wide" in refused.why


def test_the_window_slides() -> None:
    sizes = {"A": 10}
    d = decide(State(), req("n1"), T0, LIMITS, sizes)
    ended = finish(d.state, "r-n1", "succeeded", T0)  # a quick action: ended as it started
    # still inside the window: refused (and tripped)
    assert not decide(ended, req("n2"), T0 + 3599, LIMITS, sizes).allowed
    # the action left the window: allowed, and the old one is gone from the state
    later = decide(ended, req("n2"), T0 + 3600.5, LIMITS, sizes)
    assert later.allowed and [a.node for a in later.state.actions] == ["n2"]


def test_the_same_node_again_takes_no_second_slot() -> None:
    sizes = {"A": 10}
    d = decide(State(), req("n1"), T0, LIMITS, sizes)
    again = decide(d.state, req("n1", kind="drain"), T0 + 5, LIMITS, sizes)
    assert again.allowed and not again.state.tripped


def test_nodes_not_in_service_do_not_count_and_scale_up_raises_the_budget() -> None:
    state = State()
    # 10 nodes join a fleet of 10: acting on them (not yet in service) spends nothing.
    for i in range(10):
        d = decide(state, req(f"new{i}", healthy=False), T0, LIMITS, {"A": 20})
        assert d.allowed
        state = d.state
    assert state.actions == () and not state.tripped
    # The fleet grew from 10 to 100: the same window now holds 5, not 1.
    for i in range(5):
        d = decide(state, req(f"n{i}"), T0 + 1, LIMITS, {"A": 100})
        assert d.allowed
        state = d.state
    assert [u.used for u in usage(state, T0 + 1, LIMITS, {"A": 100})] == [5, 5]


def test_failed_and_rolled_back_actions_keep_counting() -> None:
    sizes = {"A": 100}
    state = State()
    for i, outcome in enumerate(["failed", "rolled_back", "failed", "succeeded", "failed"]):
        d = decide(state, req(f"n{i}"), T0 + i, LIMITS, sizes)
        assert d.allowed
        state = finish(d.state, f"r-n{i}", outcome)
    assert sorted(a.outcome for a in state.actions) == [
        "failed",
        "failed",
        "failed",
        "rolled_back",
        "succeeded",
    ]
    refused = decide(state, req("n9"), T0 + 10, LIMITS, sizes)
    assert not refused.allowed and refused.state.tripped
    with pytest.raises(ValueError, match="outcome"):
        finish(state, "r-n0", "fine")


def test_a_trip_stays_until_reset_even_when_the_window_empties() -> None:
    sizes = {"A": 10}
    d = decide(State(), req("n1"), T0, LIMITS, sizes)
    tripped = decide(d.state, req("n2"), T0 + 1, LIMITS, sizes).state
    much_later = T0 + 10 * 3600
    still = decide(tripped, req("n3"), much_later, LIMITS, sizes)
    assert not still.allowed and still.state.tripped and "reset" in still.why
    rearmed = reset(still.state)
    assert rearmed == State()
    assert decide(rearmed, req("n3"), much_later, LIMITS, sizes).allowed


def test_recovery_proceeds_while_tripped_and_does_not_count() -> None:
    sizes = {"A": 10}
    d = decide(State(), req("n1"), T0, LIMITS, sizes)
    tripped = decide(d.state, req("n2"), T0 + 1, LIMITS, sizes).state
    for kind in ("rollback", "uncordon", "reapply"):
        r = decide(tripped, req("n2", kind=kind, is_recovery=True), T0 + 2, LIMITS, sizes)
        assert r.allowed and r.state.tripped and r.state.actions == tripped.actions
    assert not decide(tripped, req("n3", kind="drain"), T0 + 2, LIMITS, sizes).allowed


def test_usage_lists_the_fleet_then_each_group() -> None:
    sizes = {"A": 30, "B": 10}
    d = decide(State(), req("a1"), T0, LIMITS, sizes)
    rows = usage(d.state, T0, LIMITS, sizes)
    assert [(u.scope, u.size, u.limit, u.used, u.nodes) for u in rows] == [
        (FLEET, 40, 2, 1, ("a1",)),
        ("A", 30, 2, 1, ("a1",)),
        ("B", 10, 1, 0, ()),
    ]


def test_an_action_in_progress_keeps_its_slot_past_the_window_and_leaves_a_window_after_it_ends() -> None:
    sizes = {"A": 10}  # budget 1
    d = decide(State(), req("n1"), T0, LIMITS, sizes)
    assert d.allowed
    late = T0 + LIMITS.window_seconds + 60  # a long drain, still running
    assert not decide(d.state, req("n2"), late, LIMITS, sizes).allowed
    ended = finish(d.state, "r-n1", "succeeded", late)
    assert not decide(ended, req("n2"), late + 1, LIMITS, sizes).allowed  # ended just now: still counts
    assert decide(ended, req("n2"), late + LIMITS.window_seconds + 1, LIMITS, sizes).allowed
