"""Tables that never cut what identifies a row.

A column is a `Col`: `key` columns (node name, GPU, finding id, ...) are never wrapped, cut or
dropped. When a table is wider than the terminal, `wrap` columns (free text: evidence, reasons)
wrap, down to WRAP_MIN characters or their longest word, and the others go, highest `drop` first.
Piped output (no terminal, no $COLUMNS) is never narrowed: every row stays on one line, whole,
for grep and awk. A table whose cells then all fit their columns on one line is printed by
table_body.WholeRows: the same characters, without rich's layout of each cell (seconds at 12,500 rows).

Text that came from a node (names, versions, BMC messages, pod names: anything) is data, never rich
markup, and its control characters (ESC and the ANSI/OSC sequences it starts, C1, DEL, bidi
overrides, newlines) are shown as escapes (`\\x1b`): `plain` makes such a cell, `clean` such a
line for print(). `make_table` and `show` apply the same to every cell, title and line they are
given (a newline our own code put in a Text is kept), so text a renderer forgot is still safe.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.table import Column, Table
from rich.text import Span, Text

from controller.cli.table_body import WholeRows, measure, whole_rows
from protos.logsafe import CONTROL, escape_control

Cell = str | Text
PIPE_WIDTH = 1000  # text beside the tables when piped: never folded
WRAP_MIN = 16


class Listing(Table):
    """A table that, with no rows, prints as one line, `<title>: <empty>` (no box of headers over
    nothing): "Silences: none active (--all shows ended ones too)"."""

    empty: str = "none"


@dataclass
class Col(Column):
    key: bool = False  # identifies the row: never wrapped, cut or dropped
    drop: int = 0  # when too narrow, dropped highest first; 0: never dropped
    wrap: bool = False  # free text: wraps when too narrow (other columns are whole or dropped)
    wide: bool = False  # shown only with -o wide


def clean(value: str) -> str:
    """A line of node-supplied text for print(): control characters shown as escapes."""
    return escape_control(value)


def plain(value: str, style: str = "", justify: JustifyMethod | None = None) -> Text:
    """A cell (or line) of node-supplied text: never markup, control characters shown as escapes."""
    return Text(escape_control(value), style=style, justify=justify)


def safe_text(text: Text) -> Text:
    """`text` with its control characters escaped, styles kept; newlines (our own line breaks) stay."""
    source = text.plain
    if not any(ch != "\n" for ch in CONTROL.findall(source)):
        return text
    pieces: list[str] = []
    offsets = [0] * (len(source) + 1)
    at = 0
    for i, ch in enumerate(source):
        offsets[i] = at
        piece = ch if ch == "\n" or not CONTROL.match(ch) else escape_control(ch)
        pieces.append(piece)
        at += len(piece)
    offsets[len(source)] = at
    out = Text(
        "".join(pieces),
        style=text.style,
        justify=text.justify,
        overflow=text.overflow,
        no_wrap=text.no_wrap,
        end=text.end,
        tab_size=text.tab_size,
    )
    out.spans = [Span(offsets[s.start], offsets[min(s.end, len(source))], s.style) for s in text.spans]
    return out


def _safe(item: RenderableType) -> RenderableType:
    """`item` with every Text and string in it made safe (tables and groups are walked)."""
    if isinstance(item, str):
        return plain(item)
    if isinstance(item, Text):
        return safe_text(item)
    if isinstance(item, Group):
        item._renderables = tuple(_safe(r) for r in item._renderables)
    elif isinstance(item, Table):
        if item.title is not None:
            item.title = plain(item.title) if isinstance(item.title, str) else safe_text(item.title)
        for column in item.columns:
            column._cells = [_safe(c) for c in column._cells]
    return item


def make_table(
    title: str,
    columns: Sequence[Col],
    rows: Iterable[Sequence[Cell]],
    *,
    wide: bool = False,
    empty: str = "none",
) -> Table:
    """A table of the columns `wide` selects; each row gives a cell for every column in `columns`.
    With no rows, `show` prints `<title>: <empty>` instead."""
    shown = [i for i, c in enumerate(columns) if wide or not c.wide]
    table = Listing(*(columns[i] for i in shown), title=plain(title), title_justify="left")
    table.empty = empty
    for row in rows:
        # Cells are data (node names, BMC messages, sources like "tuned.conf ([cpu] governor)"):
        # plain text, never rich markup, control characters escaped.
        table.add_row(*(plain(c) if isinstance(c, str) else safe_text(c) for c in (row[i] for i in shown)))
    for column in table.columns:
        if isinstance(column, Col) and column.key:
            column.no_wrap = True
            column.min_width = max(_widths(column)[1], column.min_width or 0)
    return table


def _widths(column: Column) -> tuple[int, int]:
    """The narrowest (longest word) and widest (one line) the column's cells can be, padding excluded."""
    console = Console(width=PIPE_WIDTH)
    options = console.options
    cells: list[RenderableType] = [column.header, *column.cells]
    measured = [measure(console, options, c) for c in cells]
    return max(low for low, _ in measured), max(high for _, high in measured)


def _narrowest(column: Column, low: int, high: int) -> int:
    if isinstance(column, Col) and column.wrap and not column.key:
        return min(high, max(low, WRAP_MIN))
    return high


def _border(table: Table) -> int:
    """Borders and padding around the cells: one rule per column and the edge, one space each side."""
    n = len(table.columns)
    return (n + 1 if table.box else 0) + 2 * n


def fit(table: Table, width: int | None) -> tuple[list[int], int]:
    """Narrow `table` to `width` (None: leave it whole); its columns' widths (padding excluded) and
    the width it will print at."""
    ranges = [_widths(c) for c in table.columns]
    natural = sum(high for _, high in ranges) + _border(table)
    if width is None or natural <= width:
        return [high for _, high in ranges], natural
    lows = [_narrowest(c, low, high) for c, (low, high) in zip(table.columns, ranges, strict=True)]
    while sum(lows) + _border(table) > width:
        droppable = [i for i, c in enumerate(table.columns) if isinstance(c, Col) and c.drop and not c.key]
        if not droppable:
            break  # only what identifies a row is left: print it wider than the terminal, whole
        i = max(droppable, key=lambda j: getattr(table.columns[j], "drop", 0))
        del table.columns[i], ranges[i], lows[i]
    widths = [high for _, high in ranges]
    excess = sum(widths) + _border(table) - width
    while excess > 0:  # take a character at a time from the widest column that can still wrap
        shrinkable = [i for i in range(len(widths)) if widths[i] > lows[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda j: widths[j])
        widths[widest] -= 1
        excess -= 1
    for column, w in zip(table.columns, widths, strict=True):
        column.width = w
    for i, column in enumerate(table.columns):
        column._index = i
    return widths, max(width, sum(widths) + _border(table))


def fit_table(table: Table, width: int | None) -> tuple[RenderableType, int]:
    """`table` narrowed to `width` (fit) and the width it will print at; as WholeRows when every
    cell then fits its column on one line (the same table, without rich's per-cell layout)."""
    widths, needed = fit(table, width)
    return (WholeRows(table, widths) if whole_rows(table, widths) else table), needed


def terminal_width() -> int | None:
    """The terminal's width ($COLUMNS first); None when piped without $COLUMNS."""
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console.width
    return None


def show(*items: RenderableType, width: int | None = None) -> None:
    """Print tables (fitted to the terminal) and text on stdout; `width` overrides the terminal's."""
    width = width or terminal_width()
    for item in map(_safe, items):
        if isinstance(item, Listing) and not item.row_count:
            Console(width=width or PIPE_WIDTH).print(_empty_line(item), markup=False)
            continue
        if not isinstance(item, Table):
            Console(width=width or PIPE_WIDTH).print(item, markup=False)  # data, not markup
            continue
        fitted, needed = fit_table(item, width)
        console = Console(width=max(width or PIPE_WIDTH, needed))
        console.print(fitted, markup=False, crop=fitted is item)  # whole rows are never cropped


def _empty_line(table: Listing) -> Text:
    """`<title>: <empty>`, what a listing with no rows prints."""
    title = table.title if isinstance(table.title, Text) else plain(str(table.title or ""))
    return Text.assemble(title, plain(f": {table.empty}"))
