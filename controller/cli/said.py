"""What an evidence's detail sentence already says, so that a line does not say it twice.

A detector writes its evidence's detail as a sentence ("pcie h2d 27.8 GB/s is 49.6% below the median
of 128 peers (55.0; ...)") and also fills the evidence's numbers (value, baseline, deviation, peers)
and reasons. The CLI prints the numbers after the detail only where the detail leaves one of them
out: every figure is still on the line once, and in `--json` always.
"""

from __future__ import annotations

import re

# A figure as a sentence writes it: "55", "55.0", "2,952.2", "49.6" of "49.6%", "4" of "gen4".
_FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?")
_EDGES = ",;:()[]"


def figures(text: str) -> list[tuple[float, float]]:
    """Each figure in `text` with half a unit of its last place: what a value rounded to it may be off
    by ("55.0" -> (55.0, 0.05), "128" -> (128.0, 0.5))."""
    found = []
    for match in _FIGURE.finditer(text):
        digits = match.group().rstrip(",").replace(",", "")
        places = len(digits.partition(".")[2])
        found.append((float(digits), 0.5 * 10.0**-places))
    return found


def says_figure(said: list[tuple[float, float]], value: float) -> bool:
    """Whether one of the figures is `value` (its magnitude), as rounded for the sentence."""
    size = abs(value)
    slack = 1e-9 + 1e-9 * size
    return any(abs(figure - size) <= half + slack for figure, half in said)


def says_words(text: str, phrases: list[str]) -> bool:
    """Whether every word of every phrase stands in `text` as a word of its own."""
    words = {w.strip(_EDGES) for w in text.split()}
    return all(w.strip(_EDGES) in words for phrase in phrases for w in phrase.split())
