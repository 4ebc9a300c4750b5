"""A listing with nothing to list prints one line saying so (`Silences: none active (--all shows
ended ones too)`), not a box of headers over nothing; the same commands with rows print their
tables, and -o json an empty list. Against a real controller on loopback."""

from __future__ import annotations

import json
import time

import pytest

from controller.cli.layout import Col, make_table, show
from controller.config import ProbeConfig
from controller.main import main
from tests.controller.harness import ControllerThread, config
from tests.controller.remediate.test_retune import fleet_of_five

Capture = pytest.CaptureFixture[str]


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def controller() -> ControllerThread:
    return ControllerThread(config(probes=ProbeConfig(on_connect=False, periodic=False)), clock=time.time)


def test_each_empty_listing_is_one_line_saying_so(capsys: Capture) -> None:
    with controller() as c:
        at = ("--controller", c.address)
        expected = {
            ("nodes",): "Nodes (0): none (no agent has connected to this controller yet)",
            ("findings",): "Findings: none active",
            ("findings", "--all"): "Findings: none",
            ("findings", "--since", "1h"): "Findings: none",
            ("silences",): "Silences: none active (--all shows ended ones too)",
            ("silences", "--all"): "Silences: none",
            ("history",): "History: none",
            ("commands",): "Commands: none",
            ("recommendations",): "Recommendations: none",
        }
        for args, line in expected.items():
            code, out, _ = run(capsys, *args, *at)  # stderr: the controller's plaintext warning
            assert (code, out) == (0, line + "\n"), args
        code, out, _ = run(capsys, "silences", *at, "-o", "json")
        assert code == 0 and json.loads(out) == {"silences": []}  # documents are unchanged

        c.call(fleet_of_five)
        code, out, _ = run(capsys, "nodes", *at)
        assert code == 0 and out.startswith("Nodes (5)") and "┃ NODE" in out  # rows: the table
        code, out, _ = run(capsys, "findings", "--node", "n0", *at)
        assert (code, out) == (0, "Findings: none active on n0\n")


def test_a_title_from_a_node_stays_data_in_the_line(capsys: Capture) -> None:
    show(make_table("History of [bold]n\x1b[31m0", [Col("WHEN", key=True)], [], empty="none"))
    assert capsys.readouterr().out == "History of [bold]n\\x1b[31m0: none\n"
