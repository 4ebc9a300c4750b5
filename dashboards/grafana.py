"""Small builders for Grafana dashboard JSON (schemaVersion 39): panels, targets, variables, layout.

Every panel and target reads the `${datasource}` template variable, so one import works against
any Prometheus. Panels are laid out by `Layout`, which flows them left to right on Grafana's
24-column grid and starts a new line when a row does not fit.
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

SCHEMA_VERSION = 39
GRID_WIDTH = 24
DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = frozenset(
    {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "state-timeline", "status-history", "row"}
)

# Health values used across gpufleet metrics: ok=0, warning=1, critical=2.
HEALTH_MAPPING: list[JSON] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "ok", "color": "green", "index": 0},
            "1": {"text": "warning", "color": "yellow", "index": 1},
            "2": {"text": "critical", "color": "red", "index": 2},
        },
    }
]
UP_MAPPING: list[JSON] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "down", "color": "red", "index": 0},
            "1": {"text": "up", "color": "green", "index": 1},
        },
    }
]
SUCCESS_MAPPING: list[JSON] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "failed", "color": "red", "index": 0},
            "1": {"text": "ok", "color": "green", "index": 1},
        },
    }
]
YES_NO_MAPPING: list[JSON] = [
    {
        "type": "value",
        "options": {
            "0": {"text": "no", "color": "green", "index": 0},
            "1": {"text": "yes", "color": "red", "index": 1},
        },
    }
]


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> JSON:
    """A Prometheus query; `table` asks for one row per series (instant, format table)."""
    out: JSON = {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expr,
        "range": not (instant or table),
    }
    if instant or table:
        out["instant"] = True
    if table:
        out["format"] = "table"
    if legend:
        out["legendFormat"] = legend
    return out


def thresholds(*steps: tuple[float | None, str]) -> JSON:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


GREEN = thresholds((None, "green"))


def _field_config(
    unit: str,
    *,
    decimals: int | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    steps: JSON | None = None,
    mappings: list[JSON] | None = None,
    custom: JSON | None = None,
) -> JSON:
    defaults: JSON = {"unit": unit, "thresholds": steps or GREEN, "mappings": mappings or []}
    if steps is not None or mappings is not None:
        defaults["color"] = {"mode": "thresholds"}
    else:
        defaults["color"] = {"mode": "palette-classic"}
    if decimals is not None:
        defaults["decimals"] = decimals
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    if custom is not None:
        defaults["custom"] = custom
    return {"defaults": defaults, "overrides": []}


def panel(
    kind: str,
    title: str,
    targets: list[JSON],
    unit: str,
    *,
    description: str = "",
    options: JSON | None = None,
    transformations: list[JSON] | None = None,
    **field: Any,
) -> JSON:
    """Any panel type; `field` goes to fieldConfig.defaults (decimals, min_value, max_value, steps,
    mappings, custom). Refs A, B, C ... are given to the targets in order."""
    if kind not in PANEL_TYPES:
        raise ValueError(f"panel type {kind!r} is not one gpufleet dashboards use")
    refs = [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)]
    out: JSON = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": refs,
        "fieldConfig": _field_config(unit, **field),
        "options": options or {},
    }
    if transformations:
        out["transformations"] = transformations
    return out


def timeseries(
    title: str, targets: list[JSON], unit: str, *, description: str = "", stack: bool = False, **field: Any
) -> JSON:
    custom: JSON = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10 if stack else 0,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    options = {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel(
        "timeseries", title, targets, unit, description=description, options=options, custom=custom, **field
    )


def stat(title: str, targets: list[JSON], unit: str, *, description: str = "", **field: Any) -> JSON:
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "textMode": "auto",
    }
    return panel("stat", title, targets, unit, description=description, options=options, **field)


def gauge(title: str, targets: list[JSON], unit: str, *, description: str = "", **field: Any) -> JSON:
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showThresholdLabels": False,
        "showThresholdMarkers": True,
    }
    return panel("gauge", title, targets, unit, description=description, options=options, **field)


def bargauge(title: str, targets: list[JSON], unit: str, *, description: str = "", **field: Any) -> JSON:
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "displayMode": "gradient",
        "orientation": "horizontal",
        "showUnfilled": True,
    }
    return panel("bargauge", title, targets, unit, description=description, options=options, **field)


def table(
    title: str,
    targets: list[JSON],
    unit: str,
    *,
    description: str = "",
    hide: tuple[str, ...] = ("Time", "__name__", "job", "instance"),
    rename: dict[str, str] | None = None,
    sort: tuple[tuple[str, bool], ...] = (),
    **field: Any,
) -> JSON:
    """An instant table: one row per series, its labels as columns. Several targets are merged on
    their labels (values become "Value #A", "Value #B" ...); `hide` drops columns, `rename` renames
    them and `sort` orders rows by (column, descending) pairs, the first the primary key."""
    transformations: list[JSON] = [{"id": "merge", "options": {}}] if len(targets) > 1 else []
    transformations.append(
        {
            "id": "organize",
            "options": {"excludeByName": dict.fromkeys(hide, True), "renameByName": rename or {}},
        }
    )
    if sort:
        transformations.append(
            {"id": "sortBy", "options": {"sort": [{"field": name, "desc": desc} for name, desc in sort]}}
        )
    options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    return panel(
        "table",
        title,
        targets,
        unit,
        description=description,
        options=options,
        transformations=transformations,
        **field,
    )


def heatmap(
    title: str, targets: list[JSON], unit: str, *, description: str = "", buckets: bool = False
) -> JSON:
    """A heatmap; `buckets` reads Prometheus histogram buckets (le), else Grafana buckets raw values."""
    options: JSON = {
        "calculate": not buckets,
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5, "fill": "dark-orange"},
        "yAxis": {"axisPlacement": "left", "unit": unit},
        "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
        "legend": {"show": True},
        "rowsFrame": {"layout": "auto"},
        "showValue": "never",
    }
    if buckets:
        options["calculation"] = {}
        targets = [{**t, "format": "heatmap"} for t in targets]
    else:
        options["calculation"] = {"xBuckets": {"mode": "size", "value": "1m"}}
    return panel("heatmap", title, targets, unit, description=description, options=options)


def _states(kind: str, title: str, targets: list[JSON], unit: str, description: str, **field: Any) -> JSON:
    options: JSON = {
        "showValue": "never" if kind == "status-history" else "auto",
        "rowHeight": 0.9,
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    if kind == "state-timeline":
        options["mergeValues"] = True
    custom = {"lineWidth": 0, "fillOpacity": 80}
    return panel(kind, title, targets, unit, description=description, options=options, custom=custom, **field)


def state_timeline(
    title: str, targets: list[JSON], unit: str = "none", *, description: str = "", **field: Any
) -> JSON:
    return _states("state-timeline", title, targets, unit, description, **field)


def status_history(
    title: str, targets: list[JSON], unit: str = "none", *, description: str = "", **field: Any
) -> JSON:
    return _states("status-history", title, targets, unit, description, **field)


def datasource_variable() -> JSON:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def query_variable(name: str, label: str, query: str, *, multi: bool = True, all_value: str = ".+") -> JSON:
    """A variable filled by `label_values(...)`; "All" stands for `all_value` in =~ matchers."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values"},
        "current": {},
        "hide": 0,
        "includeAll": multi,
        "allValue": all_value if multi else None,
        "multi": multi,
        "options": [],
        "refresh": 2,  # on time range change: new nodes appear without a reload
        "regex": "",
        "skipUrlSync": False,
        "sort": 3,  # numerical ascending: gpu 2 before gpu 10
    }


class Layout:
    """Places panels on the 24-column grid in order; `row` starts a new titled section."""

    def __init__(self) -> None:
        self.panels: list[JSON] = []
        self._x = 0
        self._y = 0
        self._line_height = 0

    def _newline(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self._y},
                "panels": [],
            }
        )
        self._y += 1

    def add(self, item: JSON, w: int, h: int = 8) -> None:
        if not 0 < w <= GRID_WIDTH:
            raise ValueError(f"panel width {w} outside 1..{GRID_WIDTH}")
        if self._x + w > GRID_WIDTH:
            self._newline()
        self.panels.append({**item, "gridPos": {"h": h, "w": w, "x": self._x, "y": self._y}})
        self._x += w
        self._line_height = max(self._line_height, h)

    def column(self, items: list[JSON], w: int, h: int) -> None:
        """Stack `items` (each `h` high) in one column of width `w`, beside what the line holds."""
        if self._x + w > GRID_WIDTH:
            self._newline()
        for i, item in enumerate(items):
            self.panels.append({**item, "gridPos": {"h": h, "w": w, "x": self._x, "y": self._y + i * h}})
        self._x += w
        self._line_height = max(self._line_height, h * len(items))

    def numbered(self) -> list[JSON]:
        """The panels with ids 1, 2, 3 ... in layout order."""
        return [{"id": i, **p} for i, p in enumerate(self.panels, start=1)]


def dashboard(uid: str, title: str, description: str, layout: Layout, variables: list[JSON]) -> JSON:
    """A whole dashboard: the datasource variable first, then `variables`; stable for diffs."""
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpufleet"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,  # shared crosshair
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "type": "dashboards",
                "tags": ["gpufleet"],
                "asDropdown": True,
                "title": "gpufleet",
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": layout.numbered(),
    }
