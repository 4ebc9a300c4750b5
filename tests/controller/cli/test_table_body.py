"""A table whose cells all fit is printed without rich's per-cell layout, and looks exactly as rich
would print it: the same characters and the same colours, piped or on a terminal."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator, Sequence

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from controller.cli import layout, tables, watch
from controller.cli.layout import Cell, Col, fit, make_table, plain, show
from controller.cli.table_body import WholeRows, measure, whole_rows
from protos.gpufleet.v1 import operator_pb2


def columns() -> list[Col]:
    """New columns for each table (a table keeps its cells in its columns)."""
    return [
        Col("NODE", key=True),
        Col("HEALTH"),
        Col("GPUS", justify="right"),
        Col("MODEL", wrap=True, drop=2),
        Col("NOTE", justify="center", drop=1),
    ]


def _rows() -> list[Sequence[Cell]]:
    return [
        (plain("node-a"), Text("healthy", style="green"), "8", "NVIDIA H100 80GB HBM3", ""),
        (
            Text.assemble("node-b", (" (plaintext)", "yellow")),
            Text("critical", style="bold red"),
            "16",
            "GB200",
            Text("x", style="dim"),
        ),
        ("节点-c", Text("degraded", style="yellow"), Text("4", justify="left"), "H200 ", "wide 字"),
        ("esc\x1b[31m-d", "stale", plain("2", justify="center"), "[bold]not markup[/bold]", "trailing  "),
    ]


CONSOLES = {
    "piped": {},
    "terminal": {"force_terminal": True, "color_system": "truecolor"},
    "16 colours": {"force_terminal": True, "color_system": "standard"},
}


def _console(kind: str, width: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    options = CONSOLES[kind]
    return Console(file=out, width=width, **options), out  # type: ignore[arg-type]


def _both(table: Table, kind: str, width: int | None) -> tuple[str, str]:
    """`table` printed by rich's own Table and by WholeRows, on the same kind of console."""
    widths, needed = fit(table, width)
    assert whole_rows(table, widths)
    rich_console, rich_out = _console(kind, max(width or layout.PIPE_WIDTH, needed))
    rich_console.print(table, markup=False)
    ours_console, ours_out = _console(kind, max(width or layout.PIPE_WIDTH, needed))
    ours_console.print(WholeRows(table, widths), markup=False, crop=False)
    return rich_out.getvalue(), ours_out.getvalue()


@pytest.mark.parametrize("kind", sorted(CONSOLES))
@pytest.mark.parametrize("width", [None, 200])
def test_whole_rows_print_what_rich_prints(kind: str, width: int | None) -> None:
    table = make_table("Nodes [4]", columns(), _rows())
    theirs, ours = _both(table, kind, width)
    assert ours == theirs
    assert "node-b" in ours and "\\x1b[31m" in ours and "[bold]not markup[/bold]" in ours
    if kind == "terminal":
        assert "\x1b[1;31mcritical" in ours  # the colours came through


class AsciiOut(io.StringIO):
    encoding = "ascii"  # a terminal without UTF-8: rich draws its tables in ASCII


def test_ascii_only_consoles_get_rich_s_ascii_box() -> None:
    rows: list[Sequence[Cell]] = [
        ("node-a", Text("healthy", style="green"), "8", "m", ""),
        ("b", "", "", "", ""),
    ]
    table = make_table("Nodes", columns(), rows)
    widths, needed = fit(table, None)
    ours, theirs = AsciiOut(), AsciiOut()
    Console(file=ours, width=needed).print(WholeRows(table, widths), crop=False)
    Console(file=theirs, width=needed).print(table)
    assert ours.getvalue() == theirs.getvalue()
    assert "|" in ours.getvalue() and "│" not in ours.getvalue()


def test_a_single_row_and_an_empty_table() -> None:
    for rows in ([("only", "row", "1", "m", "n")], []):
        table = make_table("One", columns(), rows)
        theirs, ours = _both(table, "terminal", None)
        assert ours == theirs


def test_the_narrowed_table_still_matches_when_nothing_wraps() -> None:
    """At 70 columns MODEL (79 wide in all) is dropped and the rest kept whole: the fitted columns."""
    table = make_table("Nodes", columns(), _rows())
    theirs, ours = _both(table, "piped", 70)
    assert ours == theirs
    assert "MODEL" not in ours and "NOTE" in ours and all(len(line) <= 70 for line in ours.splitlines())


@pytest.mark.parametrize(
    "row",
    [
        ("node-a", "healthy", "8", Text("two\nlines"), ""),  # a cell of two lines (our own newline)
        ("node-a", "healthy", "8", Text("full", justify="full"), ""),
    ],
    ids=["newline", "full-justify"],
)
def test_cells_rich_must_lay_out_are_left_to_rich(row: Sequence[Cell]) -> None:
    table = make_table("Nodes", columns(), [row])
    widths, _ = fit(table, None)
    assert not whole_rows(table, widths)


def test_tabs_and_cells_that_are_not_text_are_left_to_rich() -> None:
    """make_table escapes a tab and makes every cell a Text; a table made otherwise is rich's."""
    for cell in (Text("tab\there"), "a str"):
        table = Table("A", "B")
        table.add_row("x", cell)
        assert not whole_rows(table, [20, 20])


def test_a_cell_wider_than_its_column_is_left_to_rich() -> None:
    table = make_table("Nodes", columns(), [("node-a", "healthy", "8", "a long model name that wraps", "")])
    widths, _ = fit(table, 60)  # MODEL wraps at this width
    assert not whole_rows(table, widths)


def test_tables_rich_styles_by_row_are_left_to_rich() -> None:
    table = make_table("Nodes", columns(), _rows())
    widths, _ = fit(table, None)
    table.row_styles = ["dim", ""]
    assert not whole_rows(table, widths)
    table.row_styles = []
    table.show_lines = True
    assert not whole_rows(table, widths)


@pytest.mark.parametrize(
    "cell", [Text(""), Text("a b  ccc"), Text("one\nlonger line"), Text("宽字符 x"), "[red]x[/red]"]
)
def test_measure_is_rich_s_measurement(cell: Text | str) -> None:
    from rich.measure import Measurement

    console = Console(width=layout.PIPE_WIDTH)
    m = Measurement.get(console, console.options, cell)
    assert measure(console, console.options, cell) == (m.minimum, m.maximum)


HEALTHS = (
    operator_pb2.NODE_HEALTH_HEALTHY,
    operator_pb2.NODE_HEALTH_DEGRADED,
    operator_pb2.NODE_HEALTH_CRITICAL,
)


def _nodes(n: int) -> Iterator[operator_pb2.NodeSummary]:
    now = int(time.time())
    for i in range(n):
        node = operator_pb2.NodeSummary(
            name=f"node-{i:05d}",
            health=HEALTHS[i % len(HEALTHS)],
            gpu_count=8,
            gpu_model="NVIDIA H100 80GB HBM3",
            source="nvml",
            connected=i % 7 != 0,
            active_findings=i % 4,
            agent_version="0.9.0",
            transport="tls" if i % 5 else "plaintext",
        )
        node.last_seen.seconds = now - 3600  # "1h ago" in both prints
        yield node


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows of each table rich lays out."""
    rows: list[int] = []
    original = Table._render

    def counting(self: Table, *args: object, **kwargs: object) -> object:
        rows.append(len(self.rows))
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Table, "_render", counting)
    return rows


def test_nodes_at_scale_skip_rich_s_per_row_layout(
    capsys: pytest.CaptureFixture[str], drawn: list[int]
) -> None:
    """`gpufleet nodes` of 1,000 nodes: rich draws only the header (a table of no rows), and the
    whole print is what rich's own table prints."""
    nodes = list(_nodes(1000))
    show(tables.nodes_table(nodes))
    ours = capsys.readouterr().out
    assert drawn == [0]
    table = tables.nodes_table(nodes)
    _, needed = fit(table, None)
    reference = io.StringIO()
    Console(file=reference, width=max(layout.PIPE_WIDTH, needed)).print(table, markup=False)
    assert ours == reference.getvalue()
    assert len(ours.splitlines()) == 1000 + 5  # title, top, header, rule, rows, bottom


@pytest.mark.parametrize("width", [200, 20])
def test_the_watch_view_of_a_large_fleet(width: int, drawn: list[int]) -> None:
    """`gpufleet nodes --watch` on a terminal: the same, when the table fits; a table narrower than
    its names (20 columns) is rich's, as before."""
    state = watch.WatchState(nodes=list(_nodes(1000)), fetched_at=time.time())
    screen = io.StringIO()
    console = Console(file=screen, width=width, force_terminal=True, color_system="standard")
    console.print(watch.view("controller:50051", state, 5, time.time(), width, wide=False))
    assert drawn == ([0] if width == 200 else [1000])
    assert screen.getvalue().count("node-00999") == 1 or width < 26  # "node-00000 (plaintext)" and borders
