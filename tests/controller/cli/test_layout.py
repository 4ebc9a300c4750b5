"""Cells, titles and lines are data, not rich markup: brackets in them are printed as they are."""

from __future__ import annotations

import pytest

from controller.cli.layout import Col, make_table, show


def test_brackets_in_cells_and_titles_are_printed_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    table = make_table(
        "Profile [bold]x[/bold]",
        [Col("NAME", key=True), Col("SOURCE")],
        [["node[1]", "tuned.conf ([cpu] governor)"]],
    )
    show(table, "a line with [red]brackets[/red]", width=120)
    out = capsys.readouterr().out
    assert "Profile [bold]x[/bold]" in out
    assert "node[1]" in out and "tuned.conf ([cpu] governor)" in out
    assert "a line with [red]brackets[/red]" in out
