"""The metric catalogue (catalogue.yaml) as typed, validated specs.

The YAML is the one place a metric's name, type, help, labels and source are written; the
exporter, the tests and the dashboards read it. Loading checks it against what the exporter can
produce (known scopes and derivations, labels the scope provides, `_total` on native counters), so
a typo fails at start-up rather than as a missing series.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import msgspec
import yaml

from agent.exporter.derive import DERIVES
from agent.exporter.view import DCGM_LABELS, SCOPE_LABELS

MetricType = Literal["gauge", "counter", "info"]
Transform = Literal["bool", "health"]


class CatalogueError(Exception):
    """catalogue.yaml does not describe metrics the exporter can produce; the message says which."""


class _Entry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: MetricType
    help: str
    source: str
    labels: list[str] = msgspec.field(default_factory=list)
    scale: float | None = None
    transform: Transform | None = None
    equals: str | None = None
    derive: str | None = None
    skip_failed: bool = False


class _Dcgm(msgspec.Struct, forbid_unknown_fields=True):
    labels: list[str]
    label_sources: dict[str, str]
    metrics: dict[str, _Entry]


class _File(msgspec.Struct, forbid_unknown_fields=True):
    metrics: dict[str, _Entry]
    dcgm: _Dcgm


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family: where its value comes from and how it is shaped."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    source: str
    scope: str  # the Snapshot path iterated for rows ("gpus[]", "host.cpus[]", "" for the snapshot)
    field: str  # the attribute read on each row ("" for derived metrics)
    scale: float | None = None
    transform: Transform | None = None
    equals: str | None = None
    derive: str | None = None
    skip_failed: bool = False


@dataclass(frozen=True, slots=True)
class Catalogue:
    metrics: tuple[MetricSpec, ...]  # gpufleet_* names
    dcgm: tuple[MetricSpec, ...]  # dcgm-exporter's names; every one has DCGM_LABELS

    def names(self) -> list[str]:
        return [m.name for m in self.metrics]


def split_source(source: str) -> tuple[str, str]:
    """("gpus[]", "sm_clock_hz") from "gpus[].sm_clock_hz"; the first term of a compound source."""
    first = source.replace(",", " ").split()[0]
    if first in SCOPE_LABELS:
        return first, ""
    scope, _, field = first.rpartition(".")
    return scope, field


def _spec(name: str, entry: _Entry, *, dcgm: bool) -> MetricSpec:
    scope, field = split_source(entry.source)
    where = f"catalogue metric {name}"
    if scope not in SCOPE_LABELS:
        raise CatalogueError(f"{where}: unknown source scope {scope!r} in {entry.source!r}")
    labels = tuple(DCGM_LABELS) if dcgm else tuple(entry.labels)
    if dcgm and entry.labels:
        raise CatalogueError(f"{where}: dcgm metrics take the section's labels, not their own")
    extra: tuple[str, ...] = ()
    if entry.derive is not None:
        if entry.derive not in DERIVES:
            raise CatalogueError(f"{where}: unknown derivation {entry.derive!r}")
        extra = DERIVES[entry.derive].labels
    elif not field:
        raise CatalogueError(f"{where}: source {entry.source!r} names no field")
    available = set(DCGM_LABELS if dcgm else SCOPE_LABELS[scope]) | set(extra)
    missing = [label for label in labels if label not in available]
    if missing or len(set(labels)) != len(labels):
        raise CatalogueError(f"{where}: labels {missing or list(labels)} are not what {scope!r} provides")
    if not dcgm:
        if not name.startswith("gpufleet_"):
            raise CatalogueError(f"{where}: native names start with gpufleet_")
        # A gauge may end in _total where that is what it counts (gpufleet_host_hugepages_total).
        if entry.type == "counter" and not name.endswith("_total"):
            raise CatalogueError(f"{where}: counters end in _total")
        if "node" not in labels:
            raise CatalogueError(f"{where}: every gpufleet_* series carries node")
    return MetricSpec(
        name=name,
        type=entry.type,
        help=entry.help,
        labels=labels,
        source=entry.source,
        scope=scope,
        field=field,
        scale=entry.scale,
        transform=entry.transform,
        equals=entry.equals,
        derive=entry.derive,
        skip_failed=entry.skip_failed,
    )


def parse(text: str) -> Catalogue:
    """A catalogue from YAML text; CatalogueError for anything the exporter could not produce."""
    try:
        raw = msgspec.convert(yaml.safe_load(text), _File)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise CatalogueError(f"catalogue is not valid: {exc}") from exc
    if raw.dcgm.labels != list(DCGM_LABELS) or set(raw.dcgm.label_sources) != set(DCGM_LABELS):
        raise CatalogueError(f"dcgm labels must be {list(DCGM_LABELS)}, each with a label source")
    return Catalogue(
        metrics=tuple(_spec(name, entry, dcgm=False) for name, entry in raw.metrics.items()),
        dcgm=tuple(_spec(name, entry, dcgm=True) for name, entry in raw.dcgm.metrics.items()),
    )


@functools.cache
def load() -> Catalogue:
    """The catalogue shipped with the agent (package data)."""
    return parse(resources.files("agent.exporter").joinpath("catalogue.yaml").read_text())
