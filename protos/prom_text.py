"""Pieces of the Prometheus text format 0.0.4 as prometheus_client's generate_latest writes them,
for the pages written directly (agent/exporter/text.py, controller/metrics_text.py): the same
escaping and float formatting, so such a page is byte for byte what generate_latest makes of the
same families."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.utils import floatToGoString

go_float: Callable[[float], str] = floatToGoString  # Go's float formatting, as prometheus_client writes it
_LABEL_VALUE = str.maketrans({"\\": r"\\", "\n": r"\n", '"': r"\""})


def label_value(value: str) -> str:
    """A label value escaped for the inside of its double quotes."""
    return value.translate(_LABEL_VALUE)


def family_header(name: str, kind: str, documentation: str) -> str:
    """The HELP and TYPE lines of a family."""
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
