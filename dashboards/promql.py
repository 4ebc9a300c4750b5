"""PromQL pieces the dashboards share: label selectors over the template variables, rate windows,
and the node-health and throttle-reason vocabularies.

Plain Python with no imports from the project, so `python dashboards/build.py` runs anywhere; the
vocabularies are spelled as protos.names spells them, which tests/dashboards checks.
"""

from __future__ import annotations

NODE = 'node=~"$node"'
GPU = 'node=~"$node", gpu=~"$gpu"'
AGENT_JOB = 'job=~"$job"'

# Reasons that slow a busy GPU down (not idle, not an operator's clock setting).
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")
POWER_REASONS = ("hw_power_brake_slowdown", "sw_power_cap")
THROTTLE_REASONS = (*THERMAL_REASONS, *POWER_REASONS, "hw_slowdown")

# gpufleet_controller_node_health{state} values (protos NodeHealth), in declaration order.
NODE_HEALTH_STATES = ("healthy", "degraded", "critical", "stale")
NODE_HEALTH_COLORS = {"healthy": "green", "degraded": "yellow", "critical": "red", "stale": "text"}


def rate(metric: str, selector: str = "") -> str:
    """`rate(metric{selector}[$__rate_interval])`."""
    matchers = f"{{{selector}}}" if selector else ""
    return f"rate({metric}{matchers}[$__rate_interval])"


def regex(names: tuple[str, ...]) -> str:
    return "|".join(names)


def node_health_code(selector: str = NODE) -> str:
    """One series per node whose value is its health state's index in NODE_HEALTH_STATES
    (healthy 0, degraded 1, critical 2, stale 3): the controller exports one 0|1 series per state."""
    terms = [
        f'(gpufleet_controller_node_health{{{selector}, state="{state}"}} == 1) * {code}'
        for code, state in enumerate(NODE_HEALTH_STATES)
    ]
    return "max by (node) (\n  " + "\n  or ".join(terms) + "\n)"


def node_health_mapping() -> list[dict[str, object]]:
    return [
        {
            "type": "value",
            "options": {
                str(code): {"text": state, "color": NODE_HEALTH_COLORS.get(state, "text"), "index": code}
                for code, state in enumerate(NODE_HEALTH_STATES)
            },
        }
    ]


def probe_vs_peers(selector: str = NODE) -> str:
    """Each probe result divided by the fleet median of the same probe and variant (1 = typical)."""
    return (
        f"gpufleet_probe_value{{{selector}}}\n"
        "  / on (probe, variant) group_left ()\n"
        "quantile by (probe, variant) (0.5, gpufleet_probe_value)"
    )
