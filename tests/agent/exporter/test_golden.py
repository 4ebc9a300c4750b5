"""The whole /metrics page of a simulated 8-GPU node, pinned: fixed seed, fixed clock.

Any change to a name, label, type, help text, value formatting or ordering shows up as a diff of
golden/sim-node-8gpu.prom. When the change is intended, regenerate it and review the diff:

    GPUFLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/agent/exporter
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from agent.snapshot import Snapshot
from protos.logsafe import SuppressedCounts
from tests.agent.exporter.simnode import SimAgent, build, scrape, serve

GOLDEN = Path(__file__).parent / "golden" / "sim-node-8gpu.prom"
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
INTERVAL = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def _pin_durations(snapshot: Snapshot) -> None:
    """Collector durations are the one wall-clock measurement in a snapshot: give them fixed values."""
    for i, name in enumerate(sorted(snapshot.collectors)):
        snapshot.collectors[name].duration_seconds = 0.001 * (i + 1)


def _name(line: str) -> str:
    """The metric a page line belongs to ("# HELP NAME ...", "# TYPE NAME ...", "NAME{...} value")."""
    if line.startswith("# "):
        return line.split(" ")[2]
    return line.split("{", maxsplit=1)[0].split(" ", maxsplit=1)[0]


def _golden_node(*, dcgm_compat: bool) -> SimAgent:
    """Two sampling cycles 10 s apart with one probe round between: counters, rates and probes all set."""
    clock = Clock()
    sim = build(
        node="sim-node-1", seed=42, dcgm_compat=dcgm_compat, clock=clock, faults=["thermal_throttle:3"]
    )
    _pin_durations(sim.sample())
    sim.run_probes()
    clock.now += INTERVAL
    _pin_durations(sim.sample())
    return sim


def _page(monkeypatch: pytest.MonkeyPatch, *, dcgm_compat: bool) -> str:
    monkeypatch.setattr("agent.exporter.derive.version", lambda: "0.0.0-golden")  # not the installed one
    # The process's count of suppressed log lines, as this node alone left it (none): not what
    # tests run before in the same process suppressed.
    monkeypatch.setattr("agent.exporter.exporter.SUPPRESSED", SuppressedCounts())
    sim = _golden_node(dcgm_compat=dcgm_compat)
    try:
        with serve(sim.exporter) as server:
            return scrape(server)
    finally:
        sim.close()


def test_the_page_matches_the_golden_file(monkeypatch: pytest.MonkeyPatch) -> None:
    page = _page(monkeypatch, dcgm_compat=True)
    if os.environ.get("GPUFLEET_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(page)
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: run with GPUFLEET_UPDATE_GOLDEN=1 to create it"
    golden = GOLDEN.read_text()
    if page != golden:
        diff = difflib.unified_diff(
            golden.splitlines(), page.splitlines(), "golden", "page", lineterm="", n=1
        )
        pytest.fail("the /metrics page differs from the golden file:\n" + "\n".join(list(diff)[:60]))


def test_the_page_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _page(monkeypatch, dcgm_compat=True) == _page(monkeypatch, dcgm_compat=True)


def test_without_dcgm_compat_the_page_is_the_golden_less_the_dcgm_families(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    native = _page(monkeypatch, dcgm_compat=False)
    full = _page(monkeypatch, dcgm_compat=True)
    without_dcgm = "".join(
        line for line in full.splitlines(keepends=True) if not _name(line).startswith("DCGM_")
    )
    assert "DCGM_" not in native
    assert native == without_dcgm
