"""protos/logsafe.py: node text escaped in log lines, repeated lines rate-limited and counted."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest

from protos.logsafe import (
    SUPPRESSED,
    EscapeFilter,
    RateLimitFilter,
    SuppressedCounts,
    escape_control,
    has_control,
)

ROOT = Path(__file__).resolve().parents[2]
FORGING_NAME = "evil\n2026-01-01 00:00:00,000 INFO gpufleet.controller: node ok joined"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Logs:
    """A logger whose lines go to one handler with the two filters, as configure_logging sets them."""

    def __init__(self, name: str, clock: Clock, counts: SuppressedCounts | None = None) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.counts = counts or SuppressedCounts()
        self.limiter = RateLimitFilter(self.handler, counts=self.counts, clock=clock)
        self.handler.addFilter(self.limiter)
        self.handler.addFilter(EscapeFilter())
        self.logger = logging.getLogger(name)
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)
        self.logger.propagate = False

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = True


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def logs(request: pytest.FixtureRequest, clock: Clock) -> Iterator[Logs]:
    out = Logs(f"tests.logsafe.{request.node.name}", clock)
    yield out
    out.close()


def test_escape_control_shows_every_control_character_and_keeps_the_rest() -> None:
    assert escape_control("a\x1b[31mred\x1b]8;;http://x\x07") == "a\\x1b[31mred\\x1b]8;;http://x\\x07"
    assert escape_control("n1\nforged\r\t") == "n1\\nforged\\r\\t"
    assert escape_control("\x00\x7f\x85\x9b") == "\\x00\\x7f\\x85\\x9b"  # NUL, DEL, C1 (NEL, CSI)
    assert escape_control("abc\u202eexe.txt\u2066\u2028") == "abc\\u202eexe.txt\\u2066\\u2028"
    ordinary = "gpu-node-7 [/] [bold]x[/bold] Grüße 日本 \\x1b"
    assert escape_control(ordinary) == ordinary
    assert not has_control(escape_control("\x1b\n\u202e\x9b"))


def test_a_newline_in_a_node_name_cannot_forge_a_log_line(logs: Logs) -> None:
    logs.logger.warning("bad frame from %s: %s", FORGING_NAME, ValueError("seq\x1b[2J out of range"))
    logs.logger.warning(f"f-string from {FORGING_NAME}")  # an f-string: escaped whole
    logs.logger.warning("%(node)s sent %(n)d frames", {"node": FORGING_NAME, "n": 3})
    lines = logs.lines()
    assert len(lines) == 3, lines
    assert lines[0] == (
        f"WARNING {logs.logger.name}: bad frame from evil\\n2026-01-01 00:00:00,000 INFO "
        "gpufleet.controller: node ok joined: seq\\x1b[2J out of range"
    )
    assert lines[1].endswith(
        "f-string from evil\\n2026-01-01 00:00:00,000 INFO gpufleet.controller: node ok joined"
    )
    assert lines[2].endswith("node ok joined sent 3 frames")
    assert not any(has_control(line) for line in lines)


def test_our_own_tracebacks_keep_their_lines(logs: Logs) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logs.logger.exception("stream of %s failed", "n\n1")
    lines = logs.lines()
    assert lines[0].endswith("stream of n\\n1 failed")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: boom"


def test_ten_thousand_identical_warnings_are_bounded_and_counted(logs: Logs, clock: Clock) -> None:
    for _ in range(10_000):
        logs.logger.warning("refused frame from %s: over the size limit", "n1")
    assert len(logs.lines()) == 10
    assert logs.counts.snapshot() == {logs.logger.name: 9_990}
    clock.now += 61  # the window turns: one summary, then the line that turned it
    logs.logger.warning("refused frame from %s: over the size limit", "n1")
    lines = logs.lines()
    assert len(lines) == 12
    assert lines[10] == (
        f"WARNING {logs.logger.name}: 9990 similar lines suppressed in 60s, the last: "
        "refused frame from n1: over the size limit"
    )
    assert lines[11].endswith("refused frame from n1: over the size limit")
    assert logs.counts.snapshot() == {logs.logger.name: 9_990}


def test_distinct_nodes_and_messages_are_limited_separately(logs: Logs) -> None:
    for i in range(30):
        logs.logger.warning("bad frame from %s", "n1")
        logs.logger.warning("bad frame from %s", "n2")
        logs.logger.warning("stream of %s closed", "n1")
        logs.logger.info("quiet node %s", f"n{100 + i}")  # 30 nodes, one line each
    lines = logs.lines()
    assert sum(line.endswith("bad frame from n1") for line in lines) == 10
    assert sum(line.endswith("bad frame from n2") for line in lines) == 10
    assert sum(line.endswith("stream of n1 closed") for line in lines) == 10
    assert sum("quiet node" in line for line in lines) == 30
    assert logs.counts.snapshot() == {logs.logger.name: 60}


def test_the_summary_line_escapes_the_node_name_too(logs: Logs, clock: Clock) -> None:
    for _ in range(12):
        logs.logger.error("bad frame from %s", FORGING_NAME)
    clock.now += 60
    logs.logger.error("an unrelated line")
    lines = logs.lines()
    assert len(lines) == 12  # 10, the summary, the unrelated line
    assert "2 similar lines suppressed" in lines[10] and "from evil\\n2026" in lines[10]
    assert not any(line.startswith("2026") for line in lines)


def test_flush_writes_what_an_unfinished_window_suppressed(logs: Logs) -> None:
    for _ in range(15):
        logs.logger.warning("probe on %s failed", "n1")
    logs.limiter.flush()
    assert logs.lines()[-1].endswith("5 similar lines suppressed in 60s, the last: probe on n1 failed")


def test_a_flood_of_distinct_first_arguments_shares_one_key_past_max_keys(clock: Clock) -> None:
    logs = Logs("tests.logsafe.overflow", clock)
    logs.limiter.max_keys = 100
    try:
        for i in range(10_000):
            logs.logger.warning("hello from unknown node %s", f"n{i}")
        assert len(logs.lines()) == 100 + 10  # one per key in the table, then 10 for the overflow key
        assert logs.counts.snapshot() == {logs.logger.name: 10_000 - 110}
    finally:
        logs.close()


def test_configure_logging_in_a_process_bounds_a_flood_and_reports_it_at_exit() -> None:
    program = (
        "import logging\n"
        "from protos.logsafe import configure_logging\n"
        "configure_logging('info')\n"
        "log = logging.getLogger('gpufleet.controller.ingest')\n"
        "for _ in range(10_000):\n"
        f"    log.warning('bad frame from %s', {FORGING_NAME!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 11, lines[:20]  # 10 lines, then the summary written at exit
    assert all(
        " WARNING gpufleet.controller.ingest: bad frame from evil\\n2026" in line for line in lines[:10]
    )
    assert "9990 similar lines suppressed in 60s, the last: bad frame from evil\\n2026" in lines[-1]


def test_both_metrics_pages_count_the_suppressed_lines(clock: Clock) -> None:
    from controller.app import ControllerApp
    from controller.config import ControllerConfig
    from controller.metrics import controller_registry
    from tests.agent.exporter.simnode import build

    logs = Logs("tests.logsafe.metrics", clock, counts=SUPPRESSED)
    try:
        before = SUPPRESSED.snapshot().get(logs.logger.name, 0)
        for _ in range(25):
            logs.logger.warning("bad frame from %s", "n1")
        assert SUPPRESSED.snapshot()[logs.logger.name] == before + 15
    finally:
        logs.close()
    series = f'log_lines_suppressed_total{{logger="{logs.logger.name}"}} {before + 15:.1f}'

    app = ControllerApp(ControllerConfig(db=":memory:"))
    try:
        assert f"gpufleet_controller_{series}\n" in generate_latest(controller_registry(app)).decode()
    finally:
        app.close()

    sim = build(node="sim-node-1", seed=7)
    try:
        sim.exporter.observe(sim.sample())
        page = sim.exporter.render()
        assert f"gpufleet_agent_{series}\n".encode() in page
        assert page == generate_latest(sim.exporter.registry)  # the written page and the Collector agree
    finally:
        sim.close()
