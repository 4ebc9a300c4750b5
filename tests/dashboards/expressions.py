"""Reading PromQL out of Grafana dashboards and rules files, for the dashboard tests and the
end-to-end check against a real Prometheus.

Grafana's own variables are replaced by values a plain query accepts: `$__rate_interval` and
`$__interval` by 30s, `$__range` by 1m, and every template variable (`$node`, `${gpu}`,
`[[instance]]`, `${node:regex}`) by `.+`, which suits the `label=~"$var"` matchers dashboards use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
ALERTS = DASHBOARDS / "gpufleet-alerts.yaml"
ALERT_TESTS = DASHBOARDS / "gpufleet-alerts.test.yaml"
CATALOGUE = REPO / "agent" / "exporter" / "catalogue.yaml"

JSON = dict[str, Any]

_BUILTINS = {"__rate_interval": "30s", "__interval": "30s", "__range": "1m"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$", re.S)
_GPUFLEET_NAME = re.compile(r"\b(gpufleet_[a-z0-9_]+)")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True, slots=True)
class Query:
    where: str  # "dashboard file: panel title (refId)" or "dashboard file: variable name"
    expr: str


def load_dashboards() -> dict[str, JSON]:
    """Every committed dashboard under dashboards/, by file name."""
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: JSON) -> Iterator[JSON]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(name: str, dashboard: JSON) -> list[Query]:
    return [
        Query(f"{name}: {panel.get('title', '?')} ({target.get('refId', '?')})", target.get("expr", ""))
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variables(dashboard: JSON) -> list[JSON]:
    list_: list[JSON] = dashboard.get("templating", {}).get("list", [])
    return list_


def variable_query(variable: JSON) -> str:
    """A query variable's query text (Grafana stores a string or an object with `query`)."""
    query = variable.get("query", "")
    return str(query.get("query", "") if isinstance(query, dict) else query)


def label_values_check(query: str) -> str | None:
    """`label_values(metric{m}, label)` as a PromQL query that returns data exactly when some series
    of `metric{m}` has `label` (None for another kind of variable query)."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        return None
    selector, label = match["selector"], match["label"]
    if selector is None:
        return f'{{{label}!=""}}'
    if selector.endswith("}"):
        inner = selector[selector.index("{") + 1 : -1].strip()
        joined = f"{inner}, " if inner else ""
        return f'{selector[: selector.index("{")]}{{{joined}{label}!=""}}'
    return f'{selector}{{{label}!=""}}'


def substitute(expr: str) -> str:
    """Grafana variables replaced as the module docstring says."""

    def value(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        return _BUILTINS.get(name, ".+")

    return _VARIABLE.sub(value, expr)


def alert_rules() -> list[JSON]:
    """Every alerting rule of gpufleet-alerts.yaml (recording rules left out)."""
    groups: list[JSON] = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def metric_names(expr: str) -> set[str]:
    """The gpufleet_* metric names an expression reads."""
    return set(_GPUFLEET_NAME.findall(expr))


@cache
def catalogue_names() -> frozenset[str]:
    """Every series name the agent exports (gpufleet_* and dcgm-exporter's): its catalogue's, and its
    stream's (read at each scrape, outside the catalogue)."""
    from agent.exporter.stream_families import NAMES as STREAM_NAMES

    data = yaml.safe_load(CATALOGUE.read_text())
    return frozenset([*data["metrics"], *data["dcgm"]["metrics"], *STREAM_NAMES])


@cache
def controller_names() -> frozenset[str]:
    """Every series name the controller's collector exports, histogram and counter suffixes included."""
    from controller.app import ControllerApp
    from controller.config import ControllerConfig
    from controller.detection.pool import DetectionPool
    from controller.metrics import controller_registry

    app = ControllerApp(ControllerConfig(db=":memory:"))
    # As `gpufleet controller` runs it: the detectors in a process (not started here, none needed)
    app.detection = DetectionPool(app.config.detect, app.detectors)
    try:
        names: set[str] = set()
        for family in controller_registry(app).collect():
            if family.type == "counter":
                names.add(family.name + "_total")
            elif family.type == "histogram":
                names.update(family.name + suffix for suffix in ("", *_HISTOGRAM_SUFFIXES))
            else:
                names.add(family.name)
        return frozenset(names)
    finally:
        app.close()


def unknown_names(expr: str) -> set[str]:
    """Names `expr` reads that neither the agent's catalogue nor the controller exports."""
    known = catalogue_names() | controller_names()
    return {name for name in metric_names(expr) if name not in known}
