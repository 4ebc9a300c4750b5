"""The acting half on the controller's /metrics page: the blast-radius breaker (tripped or armed, the
nodes in action in its window against each budget) and the actions asked of it by kind and outcome.

A tripped breaker stops every retune, drain and cordon until an operator resets it, so it has an
alert of its own (GpufleetBreakerTripped, dashboards/gpufleet-alerts.yaml), as have actions that keep
failing or rolling back (GpufleetActionsFailing)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from controller.fleet.peers import group_sizes
from controller.remediate import breaker
from controller.remediate.guard import Breaker

PREFIX = "gpufleet_controller_"
# Every kind the breaker is asked for, with the outcomes it can have: each series shows from the
# start at 0, so a rate over it (a dashboard, an alert) has data before the first action. Only a
# retune rolls back (the agent puts the settings back when the re-probe does not verify).
OUTCOMES = {
    "retune": ("refused", "succeeded", "failed", "rolled_back"),
    "drain": ("refused", "succeeded", "failed"),
    "cordon": ("refused", "succeeded", "failed"),
}


def breaker_families(guard: Breaker, now: float) -> Iterator[Metric]:
    state = breaker.slide(guard.state, now, guard.limits)
    yield GaugeMetricFamily(
        PREFIX + "breaker_tripped",
        "1 while the blast-radius breaker is tripped: every retune, drain and cordon is refused until "
        "`gpufleet breaker reset`; 0 while armed.",
        value=1.0 if state.tripped else 0.0,
    )
    in_action = GaugeMetricFamily(
        PREFIX + "breaker_nodes_in_action",
        "Distinct nodes with an action in the breaker's window (in progress, or ended within "
        "breaker.window_seconds), fleet-wide (scope fleet) and per peer group.",
        labels=["scope"],
    )
    limit = GaugeMetricFamily(
        PREFIX + "breaker_node_limit",
        "The most nodes that may be in action in the breaker's window: max(1, ceil(breaker.share x "
        "nodes)), fleet-wide (scope fleet) and per peer group.",
        labels=["scope"],
    )
    for usage in _usage(guard, state, now):
        in_action.add_metric([usage.scope], usage.used)
        limit.add_metric([usage.scope], usage.limit)
    yield in_action
    yield limit
    actions = CounterMetricFamily(
        PREFIX + "actions",
        "Actions asked of the breaker since the controller started, by kind (retune, drain, cordon) and "
        "outcome: refused by the breaker, or allowed and then succeeded, failed or rolled_back.",
        labels=["kind", "outcome"],
    )
    counts = dict.fromkeys(((k, o) for k, outcomes in OUTCOMES.items() for o in outcomes), 0) | dict(
        guard.counts
    )
    for (kind, outcome), count in sorted(counts.items()):
        actions.add_metric([kind, outcome], count)
    yield actions


def _usage(guard: Breaker, state: breaker.State, now: float) -> list[breaker.Usage]:
    """Fleet-wide always; the peer groups only while the window holds actions (counting every node's
    group is the scrape's cost, and with no action every group's use is 0)."""
    if state.actions:
        return breaker.usage(state, now, guard.limits, group_sizes(guard.fleet()))
    size = len(guard.fleet().nodes)
    return [breaker.Usage(breaker.FLEET, size, breaker.budget(guard.limits.share, size))]
