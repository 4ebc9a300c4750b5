"""The /metrics page written directly in the Prometheus text format 0.0.4.

prometheus_client's generate_latest validates and escapes every label of every sample; on an
8-GPU node with dcgm-exporter compatibility that is ~2,000 series of 5 to 7 labels, re-done for
label sets that repeat in every family. Here a label set's text is made once per page and reused.
The output is byte for byte what generate_latest writes for the same families (a test holds the
two to that), so the Collector (Exporter.collect) and this writer are two views of one page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agent.exporter.catalogue import MetricSpec
from agent.exporter.families import LOG_LINES_SUPPRESSED, LOG_LINES_SUPPRESSED_HELP, finite_samples
from agent.exporter.view import ExportView, Labels, Row
from protos.prom_text import family_header, go_float, label_value

LabelKey = tuple[tuple[str, ...], tuple[str, ...]]


class PageWriter:
    """Accumulates families; label-set text is cached for the life of the writer (one page)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._label_text: dict[LabelKey, str] = {}
        self._by_dict: dict[tuple[int, tuple[str, ...]], tuple[Labels, str]] = {}

    def family(self, spec: MetricSpec, view: ExportView, rows: list[Row]) -> None:
        """Write `spec`'s HELP, TYPE and samples; nothing when it has no sample.

        Counters keep the catalogue's name: gpufleet_* counters end in _total there, and
        dcgm-exporter's counters are named without it, as dcgm-exporter writes them.
        """
        samples = finite_samples(spec, view, rows)
        if not samples:
            return
        name = spec.name
        kind = "counter" if spec.type == "counter" else "gauge"
        parts = self._parts
        parts.append(family_header(name, kind, spec.help))
        names = spec.labels
        for labels, value in samples:
            parts.append(f"{name}{self._labels(names, labels)} {go_float(value)}\n")

    def _labels(self, names: tuple[str, ...], labels: Labels) -> str:
        if not names:
            return ""
        # The view hands the same label dict to every family of a GPU (or port, sensor, ...): look
        # it up by identity first. The entry holds the dict, so its id cannot be reused meanwhile.
        seen = self._by_dict.get((id(labels), names))
        if seen is not None:
            return seen[1]
        values = tuple(labels[n] for n in names)
        key = (names, values)
        text = self._label_text.get(key)
        if text is None:
            pairs = sorted(zip(names, values, strict=True))
            text = "{" + ",".join(f'{n}="{label_value(v)}"' for n, v in pairs) + "}"
            self._label_text[key] = text
        self._by_dict[(id(labels), names)] = (labels, text)
        return text

    def page(self) -> bytes:
        return "".join(self._parts).encode("utf-8")


def log_lines_suppressed_text(counts: Mapping[str, int]) -> bytes:
    """families.log_lines_suppressed as generate_latest writes it; nothing while there are none."""
    if not counts:
        return b""
    name = LOG_LINES_SUPPRESSED + "_total"
    lines = [family_header(name, "counter", LOG_LINES_SUPPRESSED_HELP)]
    for logger, n in sorted(counts.items()):
        lines.append(f'{name}{{logger="{label_value(logger)}"}} {go_float(float(n))}\n')
    return "".join(lines).encode("utf-8")


def render_page(native: Iterable[MetricSpec], dcgm: Iterable[MetricSpec] | None, view: ExportView) -> bytes:
    """The whole page: the native families, then dcgm-exporter's when `dcgm` is given."""
    writer = PageWriter()
    for spec in native:
        writer.family(spec, view, view.rows(spec.scope))
    if dcgm is not None:
        rows = view.dcgm_rows()
        for spec in dcgm:
            writer.family(spec, view, rows)
    return writer.page()
