"""`gpufleet nodes --watch`: a refreshing view against a fake controller, with the sleep injected."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import grpc
import pytest
from rich.console import Console

from controller.cli import watch
from controller.cli.layout import show
from controller.main import main
from protos.gpufleet.v1 import operator_pb2
from tests.controller.cli import test_escaping as esc
from tests.controller.cli.fake_operator import FakeOperator, serving
from tests.controller.harness import T0

Capture = pytest.CaptureFixture[str]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def node(
    name: str, health: operator_pb2.NodeHealth.ValueType = operator_pb2.NODE_HEALTH_HEALTHY
) -> operator_pb2.NodeSummary:
    return operator_pb2.NodeSummary(name=name, health=health, gpu_count=8, connected=True)


def sleeper(
    fake: FakeOperator, steps: list[Callable[[], None]]
) -> tuple[Callable[[float], None], list[float]]:
    """A sleep that runs one step per call (changing the fake between refreshes), then is Ctrl-C."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) > len(steps):
            raise KeyboardInterrupt
        steps[len(slept) - 1]()

    return sleep, slept


def ticking() -> Callable[[], float]:
    times = iter(range(int(T0), int(T0) + 1000, 7))
    return lambda: float(next(times))


def test_piped_prints_a_whole_table_each_interval_until_ctrl_c(capsys: Capture) -> None:
    fake = FakeOperator(nodes=[node("n1")], warning="plaintext and no tokens")

    def degrade() -> None:
        fake.nodes = [node("n1"), node("n2", operator_pb2.NODE_HEALTH_CRITICAL)]

    sleep, slept = sleeper(fake, [degrade])
    with serving(fake) as address:
        assert watch.watch_nodes(address, "table", interval=2.5, sleep=sleep, clock=ticking()) == 0
    out, err = capsys.readouterr()
    assert slept == [2.5, 2.5] and len(fake.asked("ListNodes")) == 2
    assert "\x1b" not in out  # piped: no escape codes
    headers = [line for line in out.splitlines() if line.startswith("Every 2.5s: gpufleet nodes at ")]
    assert headers == [
        f"Every 2.5s: gpufleet nodes at {address}, 2027-01-15 08:00:00Z",
        f"Every 2.5s: gpufleet nodes at {address}, 2027-01-15 08:00:07Z",
    ]
    assert out.count("Nodes (1)") == 1 and out.count("Nodes (2)") == 1
    (critical,) = [line for line in out.splitlines() if "n2" in line]
    assert "critical" in critical
    assert err == "WARNING: plaintext and no tokens\n"  # once, on stderr


def test_a_lost_controller_is_one_line_and_the_watch_keeps_trying(capsys: Capture) -> None:
    fake = FakeOperator(nodes=[node("n1")])

    def lose() -> None:
        fake.fail = grpc.StatusCode.UNAVAILABLE

    def recover() -> None:
        fake.fail = None

    sleep, _ = sleeper(fake, [lose, recover])
    with serving(fake) as address:
        assert watch.watch_nodes(address, "table", interval=1, sleep=sleep, clock=ticking()) == 0
    out, err = capsys.readouterr()
    assert len(fake.asked("ListNodes")) == 3 and err == ""
    (lost,) = [line for line in out.splitlines() if "retrying" in line]
    assert lost.startswith(f"cannot reach controller at {address}: fake says UNAVAILABLE")
    assert lost.endswith("(retrying every 1s; the table is from 2027-01-15 08:00:00Z)")
    assert out.count("Nodes (1)") == 2  # before and after; none while lost


def test_on_a_terminal_the_view_is_redrawn_in_place() -> None:
    fake = FakeOperator(nodes=[node("n1")], warning="plaintext")

    def lose() -> None:
        fake.fail = grpc.StatusCode.UNAVAILABLE

    sleep, _ = sleeper(fake, [lose])
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system="standard")
    with serving(fake) as address:
        assert (
            watch.watch_nodes(address, "table", interval=5, sleep=sleep, clock=ticking(), console=console)
            == 0
        )
    raw = screen.getvalue()
    assert "\x1b[" in raw  # rich Live: cursor movement and colours
    text = ANSI.sub("", raw)
    assert f"Every 5s: gpufleet nodes at {address}, 2027-01-15 08:00:07Z" in text  # the second drawing
    assert text.count("Every 5s: ") >= 2  # (Live draws the last view once more as it stops)
    assert "WARNING: plaintext" in text and "Nodes (1)" in text
    assert "retrying every 5s; the table is from 2027-01-15 08:00:00Z" in text  # lost, last table kept


def test_a_refusal_ends_the_watch_with_one_line(capsys: Capture) -> None:
    fake = FakeOperator(fail=grpc.StatusCode.PERMISSION_DENIED)
    sleep, slept = sleeper(fake, [])
    with serving(fake) as address:
        assert watch.watch_nodes(address, "table", interval=1, sleep=sleep) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert slept == [] and err == "gpufleet: permission denied: fake says PERMISSION_DENIED\n"


@pytest.mark.parametrize(
    ("output", "interval", "message"),
    [
        ("json", 5.0, "--watch shows a table"),
        ("table", 0.0, "--interval must be"),
        ("wide", float("nan"), "--interval"),
    ],
)
def test_bad_arguments_exit_2(output: str, interval: float, message: str, capsys: Capture) -> None:
    assert watch.watch_nodes("127.0.0.1:1", output, interval=interval) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"gpufleet: {message}") and err.count("\n") == 1


def test_main_dispatches_watch_and_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str, float]] = []

    def fake_watch(target: str, output: str, *, interval: float) -> int:
        calls.append((target, output, interval))
        return 0

    monkeypatch.setattr(watch, "watch_nodes", fake_watch)
    assert main(["nodes", "--watch", "--controller", "h:1", "--interval", "0.5", "-o", "wide"]) == 0
    assert main(["nodes", "--watch", "--controller", "h:1"]) == 0
    assert calls == [("h:1", "wide", 0.5), ("h:1", "table", 5.0)]


@pytest.mark.parametrize("width", [60, 200])
def test_hostile_node_text_in_the_view_is_escaped(width: int, capsys: Capture) -> None:
    state = watch.WatchState(
        nodes=[esc.hostile(operator_pb2.NodeSummary)], fetched_at=T0, warning=esc.HOSTILE, error=esc.HOSTILE
    )
    show(watch.view(esc.HOSTILE, state, 5, T0, width, wide=True), width=width)
    esc.assert_safe(capsys.readouterr().out, whole=False)


def test_on_a_terminal_only_the_worst_nodes_that_fit_are_laid_out() -> None:
    """12,500 nodes on a 30-line terminal: the view is a screenful (the worst first), not a table of
    12,500 rows cropped by Live; a line says how many more there are. Without a height: every node."""
    nodes = [node(f"bad-{i:02d}", operator_pb2.NODE_HEALTH_CRITICAL) for i in range(3)]
    nodes += [node(f"n-{i:05d}") for i in range(12_497)]
    state = watch.WatchState(nodes=nodes, fetched_at=T0, warning="plaintext")
    screen = io.StringIO()
    console = Console(file=screen, width=120, height=30, force_terminal=True, color_system="standard")
    console.print(watch.view("c:1", state, 5, T0, 120, wide=False, height=console.height))
    text = ANSI.sub("", screen.getvalue())
    lines = text.splitlines()
    room = 30 - 2 - watch.CHROME - 1  # header and warning lines, the table's chrome, the "more" line
    assert len(lines) == 30
    assert f"Nodes (12500, the worst {room} shown)" in text
    assert lines[-1] == f"... and {12_500 - room} more: gpufleet nodes lists them all"
    assert [line.split("│")[1].strip() for line in lines if line.startswith("│")][:4] == [
        "bad-00",
        "bad-01",
        "bad-02",
        "n-00000",
    ]
    whole = io.StringIO()
    Console(file=whole, width=120).print(
        watch.view("c:1", watch.WatchState(nodes[:50], T0), 5, T0, 120, wide=False)
    )
    assert "Nodes (50)" in whole.getvalue() and "more:" not in whole.getvalue()
