"""The demo's fault plan: seeded, reproducible, distinct kinds on distinct nodes, GPU faults on a GPU
and other levels on the node as a whole."""

from __future__ import annotations

import pytest

from controller.demo.catalogue import AgentFault
from controller.demo.plan import Injected, node_names, plan_faults

KINDS = [
    AgentFault("thermal_throttle", "gpu", "thermal_throttle", ("clock_event_reasons",)),
    AgentFault("power_cap", "gpu", "power_cap", ("clock_event_reasons",)),
    AgentFault("nvlink_down", "gpu", "nvlink_down", ("nvlinks.active",)),
    AgentFault("hbm_degraded", "gpu", "hbm_degraded", ("probe.membw",)),
    AgentFault("fan_failure", "bmc", "fan_failure", ("fans.health",)),
]
NAMES = sorted(k.name for k in KINDS)


def test_node_names_are_zero_padded_and_sort_in_order() -> None:
    assert node_names(3) == ["demo-00", "demo-01", "demo-02"]
    names = node_names(120)
    assert names[0] == "demo-000" and names[-1] == "demo-119"
    assert sorted(names) == names and len(set(names)) == 120
    assert node_names(0) == []


@pytest.mark.parametrize("seed", range(6))
def test_faults_have_distinct_kinds_and_nodes_and_valid_gpus(seed: int) -> None:
    nodes = node_names(16)
    plan = plan_faults(nodes, 8, len(KINDS), seed, KINDS)
    assert sorted(i.fault for i in plan) == NAMES
    assert len({i.node for i in plan}) == len(plan)
    for i in plan:
        assert i.node in nodes
        if i.fault == "fan_failure":
            assert i.gpu is None  # a BMC fault is the node's
        else:
            assert i.gpu is not None and 0 <= i.gpu < 8


def test_the_same_seed_gives_the_same_plan_and_seeds_differ() -> None:
    nodes = node_names(16)
    assert plan_faults(nodes, 8, 3, 7, KINDS) == plan_faults(list(nodes), 8, 3, 7, list(KINDS))
    plans = {tuple(plan_faults(nodes, 8, 3, seed, KINDS)) for seed in range(10)}
    assert len(plans) > 5


def test_one_node_one_gpu_and_zero_faults() -> None:
    plan = plan_faults(["only"], 1, 1, 3, KINDS[:1])
    assert plan == [Injected("only", 0, "thermal_throttle", "thermal_throttle")]
    assert plan_faults(node_names(4), 8, 0, 0, KINDS) == []


@pytest.mark.parametrize(
    ("nodes", "faults", "message"),
    [
        (16, -1, "must be >= 0"),
        (16, len(KINDS) + 1, f"at most {len(KINDS)} \\(one of each kind: thermal_throttle, power_cap"),
        (2, 3, "needs at least as many nodes"),
    ],
)
def test_impossible_plans_are_refused_with_a_reason(nodes: int, faults: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_faults(node_names(nodes), 8, faults, 0, KINDS)


@pytest.mark.parametrize("seconds", ["0", "nan", "inf"])
def test_a_run_length_that_is_not_a_finite_number_of_seconds_is_refused(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, NaN passed `seconds <= 0` and the demo ran until Ctrl-C."""
    from controller.main import main

    assert main(["demo", "--nodes", "2", "--seconds", seconds]) == 2
    assert "gpufleet demo: --seconds must be a finite number > 0" in capsys.readouterr().err
