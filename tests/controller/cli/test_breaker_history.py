"""`gpufleet breaker`, `gpufleet breaker reset` and `gpufleet history` against a real controller on
loopback (a real SQLite file): a tripped breaker as the CLI shows it, an audited reset, the audit
log of a probe-node request and its filters, and `--since` parsing."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from controller.app import ControllerApp
from controller.cli.since import parse_since
from controller.main import main
from tests.controller.harness import H100, ControllerThread, config, hello

Capture = pytest.CaptureFixture[str]
GROUP = f"{H100} x2"


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def ten_nodes_one_trip(app: ControllerApp) -> None:
    """Ten connected nodes (limit 1): a retune on n00 is allowed, one on n01 refused and trips it."""
    for i in range(10):
        h = hello(f"n{i:02d}", gpus=2, capabilities=["run_probes"], probes=["gemm"])
        await app.ingest.hello(h)
        app.connected(h.node)
        app.commands.open_stream(h, asyncio.Queue(), "ipv4:127.0.0.1:1")
    assert (await app.breaker.request("retune", "n00", "policy", "power_cap", findings=["f-1"])).allowed
    assert not (await app.breaker.request("retune", "n01", "policy", "clocks_locked_low")).allowed


def test_breaker_shows_a_trip_and_reset_rearms_it_audited(tmp_path: Path, capsys: Capture) -> None:
    db = tmp_path / "c.db"
    with ControllerThread(config(db=str(db)), clock=time.time) as c:
        c.call(ten_nodes_one_trip)
        code, out, err = run(capsys, "breaker", "--controller", c.address, "-o", "json")
        assert (code, err) == (0, "")
        doc: dict[str, Any] = json.loads(out)
        assert doc["state"] == "tripped" and "n01" in doc["why"] and doc["tripped_at"].endswith("Z")
        assert (doc["window_seconds"], doc["share"]) == (3600.0, 0.05)
        assert doc["usage"] == [
            {"scope": "fleet", "size": 10, "limit": 1, "used": 1, "nodes": ["n00"]},
            {"scope": GROUP, "size": 10, "limit": 1, "used": 1, "nodes": ["n00"]},
        ]
        assert [(a["node"], a["kind"], a["outcome"]) for a in doc["actions"]] == [
            ("n00", "retune", "in_progress")
        ]

        code, out, err = run(capsys, "breaker", "--controller", c.address)
        assert code == 0 and "TRIPPED" in out and GROUP in out and "n00" in out

        # no reason, no confirmation off a terminal, --reason without reset: refused before any call
        assert run(capsys, "breaker", "reset", "--controller", c.address, "--yes")[0] == 2
        assert run(capsys, "breaker", "reset", "--reason", "x", "--controller", c.address)[0] == 2
        assert run(capsys, "breaker", "--reason", "x", "--controller", c.address)[0] == 2
        assert c.app.breaker.state.tripped

        code, out, err = run(
            capsys,
            "breaker",
            "reset",
            "--reason",
            "n00 cable fixed",
            "--yes",
            "--controller",
            c.address,
            "-o",
            "json",
        )
        assert (code, err) == (0, "")
        assert json.loads(out)["state"] == "armed" and json.loads(out)["tripped_at"] is None
        code, out, _ = run(capsys, "breaker", "--controller", c.address)
        assert code == 0 and "armed" in out

        code, out, err = run(capsys, "history", "--controller", c.address, "-o", "json")
        assert (code, err) == (0, "")
        entries = json.loads(out)["entries"]
        assert [(e["action"], e["node"], e["outcome"]) for e in entries] == [  # newest first
            ("breaker_reset", "", "succeeded"),
            ("retune", "n01", "refused"),
            ("retune", "n00", "allowed"),
        ]
        reset = entries[0]
        assert reset["requester"].startswith("anonymous from ") and reset["reason"] == "n00 cable fixed"
        assert reset["parameters"]["was_tripped"] is True
        assert entries[2]["finding_ids"] == ["f-1"] and entries[2]["parameters"] == {"is_recovery": False}
        assert "1 of 1" in entries[1]["detail"] and entries[1]["outcome_time"].endswith("Z")

    with sqlite3.connect(db) as conn:  # on disk too
        assert conn.execute("SELECT count(*) FROM audit WHERE action = 'breaker_reset'").fetchone() == (1,)


def test_history_audits_probe_node_and_filters_by_node_and_since(tmp_path: Path, capsys: Capture) -> None:
    with ControllerThread(config(db=str(tmp_path / "c.db")), clock=time.time) as c:
        c.call(ten_nodes_one_trip)
        code, out, err = run(
            capsys, "probe-node", "n03", "--probe", "gemm", "--no-wait", "--controller", c.address
        )
        assert code == 0, err
        assert run(capsys, "probe-node", "nope", "--no-wait", "--controller", c.address)[0] == 2

        code, out, err = run(
            capsys, "history", "--node", "n03", "--since", "1h", "--controller", c.address, "-o", "json"
        )
        assert (code, err) == (0, "")
        [entry] = json.loads(out)["entries"]
        assert (entry["action"], entry["node"], entry["outcome"]) == ("probe_node", "n03", "allowed")
        assert entry["requester"].startswith("anonymous from ipv4:127.0.0.1:")
        assert entry["parameters"] == {"probes": ["gemm"], "gpus": [], "force": False}
        assert entry["detail"].startswith("command ")

        code, out, _ = run(capsys, "history", "--node", "nope", "--controller", c.address, "-o", "json")
        [unknown] = json.loads(out)["entries"]
        assert unknown["outcome"] == "refused" and "not known" in unknown["detail"]

        code, out, _ = run(capsys, "history", "--since", "0s", "--controller", c.address, "-o", "json")
        assert (code, json.loads(out)) == (0, {"entries": []})  # nothing since now
        future = "2999-01-01T00:00:00Z"
        code, out, _ = run(capsys, "history", "--since", future, "--controller", c.address, "-o", "json")
        assert (code, json.loads(out)) == (0, {"entries": []})
        code, out, _ = run(capsys, "history", "--controller", c.address, "-o", "json")
        every = json.loads(out)["entries"]
        code, out, _ = run(capsys, "history", "--since", "9999999d", "--controller", c.address, "-o", "json")
        assert (code, json.loads(out)["entries"]) == (0, every)  # before: a Timestamp out of range
        code, out, _ = run(capsys, "history", "--controller", c.address, "-o", "yaml")
        assert code == 0 and "action: probe_node" in out

        code, out, err = run(capsys, "history", "--since", "yesterday", "--controller", c.address)
        assert code == 2 and "--since" in err


def test_since_is_a_duration_or_an_iso_time() -> None:
    now = 1_800_000_000.0
    assert parse_since("2h", now) == now - 7200
    assert parse_since("3d", now) == now - 3 * 86400
    assert parse_since("30m", now) == now - 1800
    assert parse_since("2026-11-25T10:00:00Z") == parse_since("2026-11-25T10:00:00")  # UTC unless it says
    assert parse_since("2026-11-25T12:00:00+02:00") == parse_since("2026-11-25T10:00:00")
    assert parse_since("2026-11-25") == parse_since("2026-11-25T00:00:00+00:00")
    with pytest.raises(ValueError, match="duration"):
        parse_since("2 fortnights")
    # before: a Timestamp out of range, in protobuf's words
    assert parse_since("9999999d", now) == 0.0  # back past 1970 is 1970: nothing is older


def test_reset_asks_on_a_terminal_and_the_api_wants_a_reason(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import grpc

    from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc

    with ControllerThread(config(db=str(tmp_path / "c.db")), clock=time.time) as c:
        c.call(ten_nodes_one_trip)
        monkeypatch.setattr("sys.stdin.isatty", lambda: True)
        monkeypatch.setattr("builtins.input", lambda prompt: "n")
        code, _, err = run(capsys, "breaker", "reset", "--reason", "x", "--controller", c.address)
        assert code == 1 and "not reset" in err and c.app.breaker.state.tripped
        monkeypatch.setattr("builtins.input", lambda prompt: "yes")
        assert run(capsys, "breaker", "reset", "--reason", "x", "--controller", c.address)[0] == 0
        assert not c.app.breaker.state.tripped

        with grpc.insecure_channel(c.address) as channel:
            stub = operator_pb2_grpc.OperatorStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                stub.ResetBreaker(operator_pb2.ResetBreakerRequest(reason="  "), timeout=5)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
