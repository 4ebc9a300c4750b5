"""A table whose every cell fits its column on one line, printed without rich's per-cell layout.

rich lays out each cell on its own (measure, pad, wrap, crop, shape): about 1 ms a row of nine
columns, so `gpufleet nodes` took 4.6 s at 4,000 nodes and would take 15-20 s at 12,500. When every
cell of the body fits its column whole, on one line (always so when piped, and at any width the
table fits), there is nothing to lay out: `WholeRows` has rich draw the title, the header and the
borders (a copy of the table without rows) and builds each body line here from the same pieces
rich would use (the box's characters, a space each side, the cell justified as rich justifies it,
its styles). The characters and styles are the same as rich's own table
(tests/controller/cli/test_table_body.py compares them); any table this does not cover (a cell
that wraps, row styles, a footer, lines between rows) is left to rich.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Column, Table
from rich.text import Text

JUSTIFIED = ("left", "right", "center")  # what rich's Lines.justify pads (not "default", "full")
_JOIN = Text("\n")  # rich renders a cell as its lines joined: a cell's own style becomes a span


def measure(console: Console, options: ConsoleOptions, cell: RenderableType) -> tuple[int, int]:
    """Measurement.get(...) of a cell as (minimum, maximum): a Text's measured here, as rich's own
    Text.__rich_measure__ does, without the walk through rich's protocol (the cost at 40,000 cells)."""
    if not isinstance(cell, Text):
        m = Measurement.get(console, options, cell)
        return m.minimum, m.maximum
    text = cell.plain
    lines = text.splitlines()
    high = max(cell_len(line) for line in lines) if lines else 0
    words = text.split()
    low = max(cell_len(word) for word in words) if words else high
    high, low = min(high, options.max_width), min(low, options.max_width)
    if high < 1:
        return 0, 0
    return min(max(0, low), high), high


def _plain_layout(table: Table) -> bool:
    """The table is rich's default shape: a box, a header, no footer, one space each side of a
    cell, no row styles, no lines between rows, plain columns."""
    return (
        table.box is not None
        and table.show_header
        and table.show_edge
        and not table.show_footer
        and not table.show_lines
        and not table.leading
        and not table.row_styles
        and not table.caption
        and table.padding == (0, 1, 0, 1)
        and not table.collapse_padding
        and all(row.style is None and not row.end_section for row in table.rows)
        and all(_plain_column(c) for c in table.columns)
    )


def _plain_column(column: Column) -> bool:
    return not column.style and column.justify in JUSTIFIED and column.vertical == "top"


def whole_rows(table: Table, widths: Sequence[int]) -> bool:
    """Every body cell is a Text of one line that fits its column (`widths`, padding excluded)."""
    if not _plain_layout(table) or len(widths) != len(table.columns):
        return False
    for column, width in zip(table.columns, widths, strict=True):
        for cell in column._cells:
            if not isinstance(cell, Text) or (cell.justify or column.justify) not in JUSTIFIED:
                return False
            text = cell.plain
            if "\n" in text or "\t" in text or cell_len(text) > width:
                return False
    return True


class WholeRows:
    """`table` at the column `widths` (whole_rows(table, widths) must hold): rich's own rendering
    of its title, header and borders, and each body line built here."""

    def __init__(self, table: Table, widths: Sequence[int]) -> None:
        self.table = table
        self.widths = list(widths)

    def _skeleton(self) -> Table:
        """The table without its rows, its columns fixed at `widths`."""
        skeleton = copy.copy(self.table)
        skeleton.rows = []
        fixed = zip(self.table.columns, self.widths, strict=True)
        skeleton.columns = [dataclasses.replace(c, _cells=[], width=w) for c, w in fixed]
        return skeleton

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        head = list(Segment.split_lines(console.render(self._skeleton(), options)))
        *top, bottom = head  # title, top border, header, the rule under it; then the bottom border
        for line in top:
            yield from line
            yield Segment.line()
        yield from self._body(console, options)
        yield from bottom
        yield Segment.line()

    def _body(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        table = self.table
        assert table.box is not None  # whole_rows checked it
        safe = table.safe_box if table.safe_box is not None else console.safe_box
        box = table.box.substitute(options, safe=safe)
        border = console.get_style(table.style or "") + console.get_style(table.border_style or "")
        pad = Segment(" ", Style.null())
        new_line = Segment.line()
        columns = [c._cells for c in table.columns]
        justify = [c.justify for c in table.columns]
        rows = len(table.rows)
        for index in range(rows):
            if index == rows - 1:
                left, right, divider = box.foot_left, box.foot_right, box.foot_vertical
            else:
                left, right, divider = box.mid_left, box.mid_right, box.mid_vertical
            yield Segment(left, border)
            for i, width in enumerate(self.widths):
                if i:
                    yield Segment(divider, border)
                cell = columns[i][index]
                assert isinstance(cell, Text)  # whole_rows checked it
                yield pad
                yield from _justified(cell, width, cell.justify or justify[i]).render(console)
                yield pad
            yield Segment(right, border)
            yield new_line


def _justified(cell: Text, width: int, justify: str) -> Text:
    """The one line of `cell` padded to `width` as rich's Lines.justify pads it, then joined as
    rich joins a cell's lines: its own style becomes a span (Text.render draws a Text without spans
    in no style at all), so a cell without a style of its own is as it is."""
    line = cell.copy()
    if justify == "left":
        line.truncate(width, pad=True)
    else:
        line.rstrip()
        if justify == "center":
            line.pad_left((width - cell_len(line.plain)) // 2)
            line.pad_right(width - cell_len(line.plain))
        else:
            line.pad_left(width - cell_len(line.plain))
    return _JOIN.join([line]) if line.style else line
