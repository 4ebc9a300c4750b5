"""The controller's /metrics page, written with the per-node families as text directly.

prometheus_client's generate_latest makes a Sample (a labels dict) per series and formats each
one by one: at 12,500 nodes the per-node families (node_health: one series per node and state,
node_last_frame_timestamp_seconds, finding_active) are 75,000 series, 0.4 s of the event loop per
scrape on the development machine, and acks wait behind it. A TextGauge keeps each series as its
label values and a number and writes its lines itself; every other family is written by
generate_latest as before. The page is byte for byte what generate_latest writes for the same
families (a test holds the two to that), and a TextGauge is still a Metric whose samples any other
exposition can read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from protos.prom_text import family_header, go_float, label_value


class TextGauge(Metric):
    """A gauge family of many series, written to text by `text()`; `samples` is built on demand."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.labels = tuple(labels)
        self.series: list[tuple[tuple[str, ...], float]] = []
        super().__init__(name, documentation, "gauge")

    def add_metric(self, values: Sequence[str], value: float) -> None:
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.labels)} label values expected, got {len(values)}")
        self.series.append((tuple(values), value))

    @property
    def samples(self) -> list[Sample]:
        return [
            Sample(self.name, dict(zip(self.labels, values, strict=True)), v) for values, v in self.series
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric.__init__ sets it empty; a TextGauge's series come through add_metric
            raise TypeError(f"{self.name}: add series with add_metric")

    def text(self) -> str:
        """The family as generate_latest writes it: HELP, TYPE, then one line per series."""
        return family_header(self.name, "gauge", self.documentation) + "".join(self._lines(self.series))

    def _lines(self, series: Sequence[tuple[tuple[str, ...], float]]) -> list[str]:
        """One line per series, its labels sorted by name. Each distinct label value is escaped once,
        and each distinct value formatted once, however many series repeat them (a node's name is
        in one series per health state)."""
        order = sorted(range(len(self.labels)), key=self.labels.__getitem__)
        pairs = ",".join(f'{self.labels[i]}="%s"' for i in order)
        line = f"{self.name}{{{pairs}}} %s\n" if pairs else f"{self.name} %s\n"
        escape = cache(label_value)  # this call's: a value once, however many series repeat it
        number = cache(go_float)  # 0 and 1 (node_health) once; -0.0 and 0.0 are one key, one text
        if order == sorted(order):
            return [line % (*map(escape, values), number(value)) for values, value in series]
        return [line % (*[escape(values[i]) for i in order], number(value)) for values, value in series]


class OneHotGauge(TextGauge):
    """A gauge of one series per key and state: 1 on the key's current state, 0 on the others
    (node_health: a node's series per health state). Added a key and its state at a time
    (`add_current`); the lines of a key in a state are kept in `kept`, the caller's dict from page
    to page, so a node whose state did not change is written by one lookup (at 12,500 nodes its
    50,000 lines took 0.15 s a page). `kept` loses the keys gone when it grows past twice the keys."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: tuple[str, str],
        states: Sequence[str],
        kept: dict[tuple[str, str], str],
    ) -> None:
        super().__init__(name, documentation, labels)
        self.states = tuple(states)
        self.kept = kept
        self.current: list[tuple[str, str]] = []

    def add_current(self, key: str, state: str) -> None:
        """`key`'s series: 1 on `state`, 0 on the others (on every one when `state` is none of them)."""
        self.current.append((key, state))

    def _one_hot(self, key: str, state: str) -> list[tuple[tuple[str, ...], float]]:
        return [((key, s), 1 if s == state else 0) for s in self.states]

    @property
    def samples(self) -> list[Sample]:
        key_label, state_label = self.labels
        return [
            Sample(self.name, {key_label: key, state_label: s}, v)
            for key, state in self.current
            for (_, s), v in self._one_hot(key, state)
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric.__init__ sets it empty
            raise TypeError(f"{self.name}: add series with add_current")

    def text(self) -> str:
        kept = self.kept
        parts = [family_header(self.name, "gauge", self.documentation)]
        for pair in self.current:
            lines = kept.get(pair)
            if lines is None:
                lines = kept[pair] = "".join(self._lines(self._one_hot(*pair)))
            parts.append(lines)
        if len(kept) > 2 * len(self.current):  # (list(): another scrape's thread may add meanwhile)
            live = set(self.current)
            for pair in [p for p in list(kept) if p not in live]:
                kept.pop(pair, None)
        return "".join(parts)


class _Families:
    """Already collected families, as generate_latest reads a registry."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def collected(registry: Collector) -> Callable[[], bytes]:
    """The registry's families, read now (on the event loop: between two of the app's updates), and
    a function that writes them as the page in the text format 0.0.4, TextGauges directly. The
    families are the registry's copies, so the page can be written on another thread: at 12,500
    nodes the loop reads for 0.07 s, and the 0.08 s of writing (0.5 s on the first scrape, which
    writes every node's node_health lines) no longer holds acks back."""
    metrics = list(registry.collect())

    def write() -> bytes:
        parts: list[bytes] = []
        others: list[Metric] = []
        for metric in metrics:
            if not isinstance(metric, TextGauge):
                others.append(metric)
                continue
            if others:
                parts.append(generate_latest(_Families(others)))
                others = []
            parts.append(metric.text().encode("utf-8"))
        if others:
            parts.append(generate_latest(_Families(others)))
        return b"".join(parts)

    return write


def page(registry: Collector) -> bytes:
    """The registry's page in the text format 0.0.4, its TextGauges written directly."""
    return collected(registry)()
