"""What every operator command shares: -o table|wide|json|yaml, whole node names at any width and
when piped, nodes worst first, and the controller's address from flag, $GPUFLEET_CONTROLLER or
the default."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.app import ControllerApp
from controller.cli import operator
from controller.cli.output import CONTROLLER_ENV, DEFAULT_CONTROLLER, OUTPUT_FORMATS
from controller.main import build_parser, main
from controller.security.warning import security_warning
from protos.gpufleet.v1 import operator_pb2
from tests.controller.harness import (
    H100,
    Clock,
    ControllerThread,
    add_findings,
    config,
    frame,
    hello,
    stored_finding,
)
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[3]
Capture = pytest.CaptureFixture[str]
# longer than any column rich would give a name at 60 or 80 columns, and with a shared prefix
NAMES = [f"demo-rack07-node-{i:04d}.gpu-cluster.example" for i in range(3)]


@pytest.fixture(scope="module")
def controller() -> Iterator[ControllerThread]:
    clock = Clock()
    with ControllerThread(config(), clock) as c:

        async def setup(app: ControllerApp) -> None:
            for name in NAMES:
                await app.ingest.hello(hello(name, gpus=2))
                assert await app.ingest.frame(name, frame(1, name)) == 1
                app.connected(name)
            await add_findings(
                app,
                [
                    stored_finding(NAMES[2], 0, "thermal_throttle", "critical"),
                    stored_finding(NAMES[1], None, "nvlink_down", "warning"),
                ],
            )

        c.call(setup)
        yield c


def run(capsys: Capture, *argv: str) -> str:
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert err in ("", f"WARNING: {security_warning(config())}\n")  # (plaintext, no tokens): stderr only
    return out


def rows(out: str) -> list[list[str]]:
    """Each table body line's cells (a wrapped cell continues on the next line, empty elsewhere)."""
    lines = [line for line in out.splitlines() if line.startswith("│")]
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in lines]


@pytest.mark.parametrize("columns", [60, 80])
@pytest.mark.parametrize(
    "case",
    [
        (["nodes"], NAMES),
        (["findings"], NAMES[1:]),
        (["findings", "-o", "wide"], NAMES[1:]),
        (["node", NAMES[2]], NAMES[2:]),
    ],
    ids=["nodes", "findings", "findings-wide", "node"],
)
def test_narrow_tables_keep_every_name_whole(
    controller: ControllerThread,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[list[str], list[str]],
    columns: int,
) -> None:
    command, expected = case
    monkeypatch.setenv("COLUMNS", str(columns))
    out = run(capsys, *command, "--controller", controller.address)
    assert "…" not in out
    cells = {cell for row in rows(out) for cell in row}
    assert cells & set(NAMES) == set(expected)
    if "wide" in command:  # finding ids whole too
        doc = json.loads(run(capsys, "findings", "--controller", controller.address, "-o", "json"))
        assert {f["id"] for f in doc["findings"]} <= cells
    if command == ["nodes"]:  # the other columns wrapped or dropped to fit, never the name
        assert all(len(line) <= columns for line in out.splitlines())


def test_piped_tables_keep_each_row_whole_on_one_line(controller: ControllerThread) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")}
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "nodes", "--controller", controller.address],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "…" not in proc.stdout
    body = rows(proc.stdout)
    assert sorted(r[0] for r in body) == NAMES  # one line per node: nothing wrapped
    assert all(H100 in r and "connected" in r for r in body)


def test_wide_shows_more_columns(
    controller: ControllerThread, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    normal = run(capsys, "nodes", "--controller", controller.address)
    wide = run(capsys, "nodes", "--controller", controller.address, "-o", "wide")
    header = next(line for line in wide.splitlines() if "NODE" in line)
    assert "BOOT ID" in header and "ACKED SEQ" in header and "BOOT ID" not in normal
    findings = run(capsys, "findings", "--controller", controller.address, "-o", "wide")
    ids = [
        f["id"]
        for f in json.loads(run(capsys, "findings", "--controller", controller.address, "-o", "json"))[
            "findings"
        ]
    ]
    assert ids and all(i in findings for i in ids)


@pytest.mark.parametrize("command", [["nodes"], ["node", NAMES[1]], ["findings", "--all"]])
def test_yaml_is_the_json_document(controller: ControllerThread, capsys: Capture, command: list[str]) -> None:
    as_json = json.loads(run(capsys, *command, "--controller", controller.address, "-o", "json"))
    as_yaml = yaml.safe_load(run(capsys, *command, "--controller", controller.address, "-o", "yaml"))
    assert as_yaml == as_json and as_json


def test_nodes_worst_first_then_by_name() -> None:
    health = operator_pb2
    nodes = [
        operator_pb2.NodeSummary(name=name, health=h)
        for name, h in (
            ("a", health.NODE_HEALTH_HEALTHY),
            ("b", health.NODE_HEALTH_CRITICAL),
            ("c", health.NODE_HEALTH_DEGRADED),
            ("d", health.NODE_HEALTH_STALE),
            ("e", health.NODE_HEALTH_UNSPECIFIED),
            ("f", health.NODE_HEALTH_CRITICAL),
            ("g", health.NODE_HEALTH_DEGRADED),
        )
    ]
    assert [n.name for n in operator.worst_first(nodes)] == ["b", "f", "c", "g", "d", "a", "e"]


def test_nodes_table_is_worst_first(controller: ControllerThread, capsys: Capture) -> None:
    body = rows(run(capsys, "nodes", "--controller", controller.address))
    assert [(r[0], r[1]) for r in body] == [
        (NAMES[2], "critical"),
        (NAMES[1], "degraded"),
        (NAMES[0], "healthy"),
    ]


def operator_commands() -> dict[str, list[str]]:
    """Every subcommand that takes --controller (a new one is covered the day it lands), with its
    required arguments."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    found = {}
    for name, parser in sub.choices.items():
        if any("--controller" in a.option_strings for a in parser._actions):
            required = [a for a in parser._actions if not a.option_strings and a.required]
            found[name] = [name, *("x" for _ in required)]
    return found


def test_every_operator_command_has_the_shared_flags() -> None:
    commands = operator_commands()
    assert {"nodes", "node", "findings", "probe-node"} <= set(commands)
    for argv in commands.values():
        args = build_parser().parse_args([*argv, "-o", "yaml"])
        assert args.output == "yaml"
        for fmt in OUTPUT_FORMATS:
            assert build_parser().parse_args([*argv, "-o", fmt]).output == fmt


def test_controller_address_flag_beats_env_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in operator_commands().values():
        monkeypatch.delenv(CONTROLLER_ENV, raising=False)
        assert build_parser().parse_args(argv).controller == DEFAULT_CONTROLLER == "127.0.0.1:50051"
        monkeypatch.setenv(CONTROLLER_ENV, "")  # set but empty: the default
        assert build_parser().parse_args(argv).controller == DEFAULT_CONTROLLER
        monkeypatch.setenv(CONTROLLER_ENV, "env-host:1234")
        assert build_parser().parse_args(argv).controller == "env-host:1234", argv
        assert build_parser().parse_args([*argv, "--controller", "flag:1"]).controller == "flag:1"


def test_the_env_reaches_the_controller(
    controller: ControllerThread, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTROLLER_ENV, controller.address)
    doc: dict[str, Any] = json.loads(run(capsys, "nodes", "-o", "json"))
    assert sorted(n["name"] for n in doc["nodes"]) == NAMES
    dead = f"127.0.0.1:{free_port()}"
    assert main(["nodes", "--controller", dead]) == 1  # the flag wins over the env
    assert f"cannot reach controller at {dead}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "command", "extra"),
    [
        (["silence", "n1", "--for", "1h"], "silence", "n1"),
        (["nodes", "extra"], "nodes", "extra"),
        (["breaker", "reset", "-x"], "breaker", "-x"),
    ],
)
def test_an_argument_a_command_does_not_take_is_refused_under_that_command(
    capsys: Capture, argv: list[str], command: str, extra: str
) -> None:
    """Before, gpufleet's own parser refused it: `gpufleet: error: unrecognized arguments` under
    the list of every command, not the usage of the one the operator typed."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gpufleet {command} ")
    assert f"gpufleet {command}: error: unrecognized arguments: {extra}" in err
