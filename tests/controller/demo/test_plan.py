"""The demo's fault plan: seeded, reproducible, distinct kinds on distinct nodes, and in step with the
faults the agent's simulator can inject."""

from __future__ import annotations

import pytest

from agent.sources.sim import FAULTS
from controller.demo.plan import INJECTABLE, Injected, node_names, plan_faults
from protos.names import CAUSES


def test_injectable_faults_are_the_simulators_and_are_causes() -> None:
    assert sorted(INJECTABLE) == sorted(FAULTS)
    assert len(set(INJECTABLE)) == len(INJECTABLE)
    assert set(INJECTABLE) <= set(CAUSES)  # a detector can name what was injected


def test_node_names_are_zero_padded_and_sort_in_order() -> None:
    assert node_names(3) == ["demo-00", "demo-01", "demo-02"]
    names = node_names(120)
    assert names[0] == "demo-000" and names[-1] == "demo-119"
    assert sorted(names) == names and len(set(names)) == 120
    assert node_names(0) == []


@pytest.mark.parametrize("seed", range(6))
def test_faults_have_distinct_kinds_and_nodes_and_valid_gpus(seed: int) -> None:
    nodes = node_names(16)
    plan = plan_faults(nodes, 8, len(INJECTABLE), seed)
    assert len(plan) == len(INJECTABLE)
    assert sorted(i.fault for i in plan) == sorted(INJECTABLE)
    assert len({i.node for i in plan}) == len(plan)
    assert all(i.node in nodes and i.gpu is not None and 0 <= i.gpu < 8 for i in plan)


def test_the_same_seed_gives_the_same_plan_and_seeds_differ() -> None:
    nodes = node_names(16)
    assert plan_faults(nodes, 8, 3, seed=7) == plan_faults(list(nodes), 8, 3, seed=7)
    plans = {tuple(plan_faults(nodes, 8, 3, seed)) for seed in range(10)}
    assert len(plans) > 5


def test_one_node_one_gpu_and_zero_faults() -> None:
    plan = plan_faults(["only"], 1, 1, seed=3)
    assert plan == [Injected("only", 0, plan[0].fault)] and plan[0].fault in INJECTABLE
    assert plan_faults(node_names(4), 8, 0, seed=0) == []


@pytest.mark.parametrize(
    ("nodes", "faults", "message"),
    [
        (16, -1, "must be >= 0"),
        (16, len(INJECTABLE) + 1, f"at most {len(INJECTABLE)}"),
        (2, 3, "needs at least as many nodes"),
    ],
)
def test_impossible_plans_are_refused_with_a_reason(nodes: int, faults: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_faults(node_names(nodes), 8, faults, seed=0)
