"""`gpufleet ack`, `silence`, `silences`, `unsilence` and `maintenance` against a real controller on
loopback: argument parsing (durations), the tables and JSON documents, and one-line errors."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from controller.app import ControllerApp
from controller.cli.silences import parse_duration, until
from controller.config import ProbeConfig
from controller.main import build_parser, main
from tests.controller.harness import ControllerThread, add_findings, config, stored_finding
from tests.controller.remediate.test_retune import fleet_of_five

Capture = pytest.CaptureFixture[str]


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def setup(app: ControllerApp) -> None:
    """n0..n4; n0 has a power cap finding on GPU 0 and a thermal one on GPU 1."""
    await fleet_of_five(app)
    await add_findings(
        app,
        [
            stored_finding("n0", 0, "power_cap", "warning", first_seen=time.time()),
            stored_finding("n0", 1, "thermal_throttle", "warning", first_seen=time.time()),
        ],
    )


def controller() -> ControllerThread:
    return ControllerThread(config(probes=ProbeConfig(on_connect=False, periodic=False)), clock=time.time)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0), ("1.5h", 5400.0), ("45", 45.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "h", "-1h", "0s", "1h30m", "soon"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="--for must be a duration"):
        parse_duration(text)


def test_until_reads_ahead_and_back() -> None:
    assert (until(1000 + 7200, now=1000), until(1000 + 59, now=1000), until(1000 - 180, now=1000)) == (
        "in 2h",
        "in 59s",
        "3m ago",
    )


def test_the_commands_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["silence", "--node", "n0", "--cause", "power_cap", "--for", "2h", "--comment", "x"]
    )
    assert (args.node, args.cause, args.duration, args.comment) == ("n0", "power_cap", "2h", "x")
    args = parser.parse_args(["maintenance", "n0", "off"])
    assert (args.node, args.state, args.comment) == ("n0", "off", "")
    args = parser.parse_args(["silences", "--all", "--node", "n1", "-o", "json"])
    assert (args.all, args.node, args.output) == (True, "n1", "json")
    with pytest.raises(SystemExit):
        parser.parse_args(["maintenance", "n0"])  # on or off is required


def test_silence_list_and_unsilence(capsys: Capture) -> None:
    with controller() as c:
        c.call(setup)
        at = ("--controller", c.address)
        code, out, err = run(
            capsys, "silence", "--node", "n0", "--cause", "power_cap", "--for", "2h", *at, "-o", "json"
        )
        assert (code, err) == (0, "")
        silence: dict[str, Any] = json.loads(out)["silence"]
        assert (silence["node"], silence["cause"], silence["active"]) == ("n0", "power_cap", True)
        assert silence["by"].startswith("anonymous from ")

        code, out, _ = run(capsys, "findings", *at, "-o", "json")
        assert code == 0 and [f["cause"] for f in json.loads(out)["findings"]] == ["thermal_throttle"]

        code, out, err = run(capsys, "silences", *at)
        assert (code, err) == (0, "")
        assert silence["id"] in out and "power_cap" in out and "active" in out and "in 1h" in out

        code, out, err = run(capsys, "unsilence", silence["id"], "--comment", "fixed", *at, "-o", "yaml")
        assert (code, err) == (0, "") and "active: false" in out
        code, out, _ = run(capsys, "silences", *at, "-o", "json")
        assert json.loads(out) == {"silences": []}
        code, out, _ = run(capsys, "silences", "--all", *at, "-o", "json")
        assert [s["id"] for s in json.loads(out)["silences"]] == [silence["id"]]

        code, out, err = run(capsys, "silence", "--node", "n0", "--for", "1d", *at)  # every cause: a table
        assert code == 0 and "(all)" in out and "n0" in out


def test_ack_and_maintenance(capsys: Capture) -> None:
    with controller() as c:
        c.call(setup)
        at = ("--controller", c.address)
        fid = next(s.id for s in c.app.active.values() if s.finding.cause == "power_cap")
        code, out, err = run(capsys, "ack", fid, "--comment", "on it", *at)
        assert (code, err) == (0, "") and f"finding {fid} (n0 GPU 0, power_cap) acked by anonymous" in out
        code, out, _ = run(capsys, "ack", fid, *at, "-o", "json")
        assert code == 0 and json.loads(out)["ack"]["comment"] == ""  # the newest ack stands

        code, out, err = run(capsys, "maintenance", "n0", "on", "--comment", "PSU swap", *at)
        assert (code, err) == (0, "") and "n0 is under maintenance" in out
        code, out, _ = run(capsys, "maintenance", "n0", "on", *at, "-o", "json")
        doc = json.loads(out)
        assert (doc["node"], doc["changed"]) == ("n0", False) and doc["audit_id"]
        code, out, _ = run(capsys, "nodes", *at, "-o", "json")
        n0 = next(n for n in json.loads(out)["nodes"] if n["name"] == "n0")
        assert (n0["maintenance"], n0["maintenance_comment"], n0["active_findings"]) == (True, "PSU swap", 0)
        code, out, _ = run(capsys, "maintenance", "n0", "off", *at)
        assert code == 0 and "n0 is out of maintenance" in out

        code, out, _ = run(capsys, "history", *at, "-o", "json")
        actions = [e["action"] for e in json.loads(out)["entries"]]
        assert sorted(set(actions)) == ["ack", "maintenance"] and len(actions) == 5


def test_errors_are_one_line(capsys: Capture) -> None:
    with controller() as c:
        c.call(setup)
        at = ("--controller", c.address)
        for args, status, text in [
            (("silence", "--node", "n0", "--for", "soon"), 2, "gpufleet silence: --for must be a duration"),
            (("silence", "--for", "2h"), 2, "gpufleet silence: give --node NODE and --for D"),
            (("silence", "--node", "n0"), 2, "gpufleet silence: give --node NODE and --for D"),
            (("maintenance", "n0", "maybe"), 2, "gpufleet maintenance: say on or off, not 'maybe'"),
            (("silence", "--node", "ghost", "--for", "1h"), 1, "NOT_FOUND: node 'ghost' is not known"),
            (
                ("silence", "--node", "n0", "--cause", "hot", "--for", "1h"),
                1,
                "INVALID_ARGUMENT: unknown cause 'hot'",
            ),
            (
                ("silence", "--node", "n0", "--for", "31d"),
                1,
                "INVALID_ARGUMENT: duration_seconds must be at most",
            ),
            (("ack", "nope"), 1, "gpufleet ack: controller at"),
            (("unsilence", "nope"), 1, "NOT_FOUND: no silence 'nope'"),
            (("maintenance", "ghost", "on"), 1, "NOT_FOUND: node 'ghost'"),
        ]:
            code, out, err = run(capsys, *args, *at)
            assert (code, out) == (status, ""), args
            assert text in err and err.count("\n") == 1, (args, err)
