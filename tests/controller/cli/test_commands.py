"""`gpufleet commands` against a real controller on loopback, whose node is a scripted agent: the
JSON document, the table (ids and node names whole), the node filter and an unreachable controller."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from controller.app import ControllerApp
from controller.main import main
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import ControllerThread, config, hello
from tests.support import free_port

Capture = pytest.CaptureFixture[str]
LONG = "rack-17-node-with-a-name-far-longer-than-any-terminal-column-0042"


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def fleet(app: ControllerApp) -> list[str]:
    """Two connected nodes; on n1 an operator's probe run that succeeded, then one still in flight
    (the agent said it started); on LONG a run that timed out. Returns the ids, oldest first."""
    for node in ("n1", LONG):
        h = hello(node, gpus=2, capabilities=["run_probes"], probes=["gemm"])
        await app.ingest.hello(h)
        app.connected(node)
        app.commands.open_stream(h, asyncio.Queue(), "ipv4:127.0.0.1:1")
    done = await app.probing.send("n1", pb.RunProbes(probes=["gemm"]), "operator", requester="operator:alice")
    payload = pb.RunProbesResult(results=2, failed=0, duration_seconds=1.5)
    app.commands.answered("n1", pb.CommandResult(command_id=done.id, ok=True, run_probes=payload))
    await asyncio.sleep(0.01)  # distinct creation times: the order is the test's
    late = await app.probing.send(LONG, pb.RunProbes(), "periodic")
    record = app.commands.get(late.id)
    assert record is not None
    record.deadline = record.created  # as if its timeout had passed
    app.commands.expire()
    await asyncio.sleep(0.01)
    busy = await app.probing.send("n1", pb.RunProbes(gpus=[1]), "periodic")
    app.commands.started("n1", busy.id)
    return [done.id, late.id, busy.id]


def test_commands_json_lists_every_command_with_state_requester_times_and_result(
    tmp_path: Path, capsys: Capture
) -> None:
    with ControllerThread(config(db=str(tmp_path / "c.db")), clock=time.time) as c:
        done, late, busy = c.call(fleet)
        code, out, err = run(capsys, "commands", "--controller", c.address, "-o", "json")
        assert (code, err) == (0, "")
        doc: dict[str, Any] = json.loads(out)
        assert list(doc) == ["commands"]
        by_id = {entry["id"]: entry for entry in doc["commands"]}
        assert [e["id"] for e in doc["commands"]] == [busy, late, done]  # newest first
        first = by_id[done]
        assert (first["node"], first["kind"], first["state"], first["requester"]) == (
            "n1",
            "run_probes",
            "succeeded",
            "operator:alice",
        )
        assert (
            first["created"].endswith("Z") and first["sent"].endswith("Z") and first["finished"].endswith("Z")
        )
        assert first["result"]["ok"] is True
        assert first["result"]["run_probes"] == {"results": 2, "failed": 0, "duration_seconds": 1.5}
        assert first["command"]["run_probes"]["probes"] == ["gemm"] and first["mutating"] is False
        assert (by_id[late]["state"], by_id[late]["requester"], by_id[late]["result"]) == (
            "timed_out",
            "scheduler",
            None,
        )
        assert by_id[late]["error"].startswith("no answer within ")
        assert (by_id[busy]["state"], by_id[busy]["finished"]) == ("running", None)

        code, out, _ = run(capsys, "commands", "--node", LONG, "--controller", c.address, "-o", "json")
        assert code == 0 and [e["id"] for e in json.loads(out)["commands"]] == [late]


def test_the_table_never_cuts_the_id_or_the_node(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ControllerThread(config(db=str(tmp_path / "c.db")), clock=time.time) as c:
        done, late, busy = c.call(fleet)
        monkeypatch.setenv("COLUMNS", "60")  # far narrower than id + node
        code, out, err = run(capsys, "commands", "--controller", c.address)
        assert (code, err) == (0, "")
        for command_id in (done, late, busy):
            assert command_id in out
        assert LONG in out
        monkeypatch.setenv("COLUMNS", "250")
        code, out, _ = run(capsys, "commands", "--controller", c.address)
        row = next(line for line in out.splitlines() if done in line)
        assert "succeeded" in row and "operator:alice" in row and "2 results, 0 failed, 1.5s" in row


def test_an_unreachable_controller_is_one_line_and_exit_1(capsys: Capture) -> None:
    code, out, err = run(capsys, "commands", "--controller", f"127.0.0.1:{free_port()}", "-o", "json")
    assert (code, out) == (1, "")
    assert err.startswith("gpufleet: cannot reach controller at 127.0.0.1:") and err.count("\n") == 1


@pytest.mark.parametrize("command", ["commands", "history", "recommendations"])
@pytest.mark.parametrize("limit", ["-3", "0", "ten"])
def test_a_limit_below_one_or_not_a_number_is_a_usage_error_not_a_traceback(
    capsys: Capture, command: str, limit: str
) -> None:
    """Before, a negative --limit raised ValueError from the request's uint32 field (a traceback),
    and 0 silently meant the controller's default of 100."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--limit", limit, "--controller", f"127.0.0.1:{free_port()}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"gpufleet {command}: error: argument --limit: must be" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["findings", "commands", "history", "recommendations", "silences"])
def test_a_node_filter_naming_no_node_the_controller_knows_is_an_error_not_an_empty_list(
    tmp_path: Path, capsys: Capture, command: str
) -> None:
    """Before, `--node nowhere` (a typo) printed an empty list and exit 0: read as a node with
    nothing to show. A known node with nothing to list stays an empty list."""
    with ControllerThread(config(db=str(tmp_path / "c.db")), clock=time.time) as c:

        async def one_node(app: ControllerApp) -> None:
            await app.ingest.hello(hello("n1", gpus=2))

        c.call(one_node)
        code, out, err = run(capsys, command, "--node", "nowhere", "--controller", c.address, "-o", "json")
        assert (code, out) == (1, "")
        assert "answered NOT_FOUND: node 'nowhere' is not known to this controller" in err
        assert err.count("\n") == 1
        code, out, err = run(capsys, command, "--node", "n1", "--controller", c.address, "-o", "json")
        assert code == 0, err
        assert list(json.loads(out).values()) == [[]]
