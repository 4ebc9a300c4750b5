"""Metric families from catalogue specs over one ExportView.

A None reading gives no sample, and neither does NaN or an infinity: a series that is missing says
"not read", a number on the page is always a real reading.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.exporter.catalogue import MetricSpec
from agent.exporter.derive import DERIVES, HEALTH
from agent.exporter.view import ExportView, Labels, Row


def _value(spec: MetricSpec, raw: Any) -> float | None:
    if raw is None:
        return None
    if spec.equals is not None:
        return (1.0 if raw == spec.equals else 0.0) if raw != "" else None
    if spec.transform == "health":
        return HEALTH.get(raw)
    value = float(raw)  # bool too: True 1, False 0
    if spec.scale is not None:
        value *= spec.scale
    return value


def _samples(spec: MetricSpec, view: ExportView, rows: list[Row]) -> Iterable[tuple[Labels, float]]:
    if spec.skip_failed:
        rows = [(labels, obj) for labels, obj in rows if not obj.error]
    if spec.derive is not None:
        yield from DERIVES[spec.derive].fn(view, rows)
        return
    field = spec.field
    for labels, obj in rows:
        value = _value(spec, getattr(obj, field))
        if value is not None:
            yield labels, value


def finite_samples(spec: MetricSpec, view: ExportView, rows: list[Row]) -> list[tuple[Labels, float]]:
    """The samples of `spec` over `rows` that are real numbers (no None, NaN or infinity)."""
    return [(labels, value) for labels, value in _samples(spec, view, rows) if math.isfinite(value)]


def family(
    spec: MetricSpec, view: ExportView, rows: list[Row], *, bare_counter: bool = False
) -> Metric | None:
    """The family of `spec` over `rows`, or None when it has no sample.

    `bare_counter` (dcgm-exporter's names) keeps a counter's name as written, without `_total`.
    """
    names = spec.labels
    fam: Metric
    add: Callable[[Labels, float], None]
    if spec.type == "counter" and bare_counter:
        fam = Metric(spec.name, spec.help, "counter")
        add = lambda labels, value: fam.add_sample(spec.name, {n: labels[n] for n in names}, value)  # noqa: E731
    elif spec.type == "counter":
        counter = fam = CounterMetricFamily(spec.name, spec.help, labels=names)
        add = lambda labels, value: counter.add_metric([labels[n] for n in names], value)  # noqa: E731
    else:
        gauge = fam = GaugeMetricFamily(spec.name, spec.help, labels=names)
        add = lambda labels, value: gauge.add_metric([labels[n] for n in names], value)  # noqa: E731
    samples = finite_samples(spec, view, rows)
    for labels, value in samples:
        add(labels, value)
    return fam if samples else None


def native(specs: Iterable[MetricSpec], view: ExportView) -> Iterator[Metric]:
    for spec in specs:
        fam = family(spec, view, view.rows(spec.scope))
        if fam is not None:
            yield fam


LOG_LINES_SUPPRESSED = "gpufleet_agent_log_lines_suppressed"  # _total: a counter
LOG_LINES_SUPPRESSED_HELP = (
    "Log lines not written: more than the limit per (logger, message, first argument) a minute."
)


def log_lines_suppressed(counts: Mapping[str, int]) -> Metric | None:
    """The process's log lines held back by the rate limit (protos/logsafe.py) per logger; None
    while there are none (no sample, no family, as for the catalogue's)."""
    if not counts:
        return None
    fam = CounterMetricFamily(LOG_LINES_SUPPRESSED, LOG_LINES_SUPPRESSED_HELP, labels=["logger"])
    for logger, n in sorted(counts.items()):
        fam.add_metric([logger], n)
    return fam


def dcgm(specs: Iterable[MetricSpec], view: ExportView) -> Iterator[Metric]:
    rows = view.dcgm_rows()
    for spec in specs:
        fam = family(spec, view, rows, bare_counter=True)
        if fam is not None:
            yield fam
