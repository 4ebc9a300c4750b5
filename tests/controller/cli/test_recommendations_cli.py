"""`gpufleet recommendations`, `gpufleet retune` and `gpufleet approve` against a real controller on
loopback, whose nodes are scripted agents answering ApplyProfile on the controller's own loop: the
table and the JSON documents, the confirmation rule, every exit status, and the audit log."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import pytest

from controller.app import ControllerApp
from controller.config import BreakerConfig, ProbeConfig
from controller.main import main
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.cli.test_waiting import Terminal
from tests.controller.harness import ControllerThread, add_findings, config, hello, stored_finding
from tests.controller.remediate.test_retune import Answer, committed, fleet_of_five, rolled_back

Capture = pytest.CaptureFixture[str]
TASKS: set[asyncio.Task[None]] = set()


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def scripted(app: ControllerApp, node: str, answer: Answer) -> None:
    """A connected node whose agent answers every ApplyProfile with `answer`."""
    h = hello(node, gpus=2, capabilities=["run_probes", "apply_profile"], probes=["gemm"])
    await app.ingest.hello(h)
    outbox: asyncio.Queue[pb.ControllerMessage] = asyncio.Queue()
    app.connected(node)
    app.commands.open_stream(h, outbox, "scripted")

    async def serve() -> None:
        while True:
            command = (await outbox.get()).command
            result = answer(command)
            if result is not None:
                ok = result.state in ("committed", "planned")
                reply = pb.CommandResult(
                    command_id=command.id, ok=ok, error="" if ok else result.state, apply_profile=result
                )
                app.commands.answered(node, reply)

    task = asyncio.get_running_loop().create_task(serve())
    TASKS.add(task)
    task.add_done_callback(TASKS.discard)


async def setup(app: ControllerApp) -> None:
    """n0 answers committed, n1 rolls back; both have a power cap finding, proposed."""
    await scripted(app, "n0", committed)
    await scripted(app, "n1", rolled_back)
    await fleet_of_five(app)
    await add_findings(
        app,
        [stored_finding("n0", 0, "power_cap", "warning"), stored_finding("n3", 1, "nvlink_down", "critical")],
    )
    await app.tuning.after_pass()


def controller(share: float = 0.05) -> ControllerThread:
    cfg = config(probes=ProbeConfig(on_connect=False, periodic=False), breaker=BreakerConfig(share=share))
    return ControllerThread(cfg, clock=time.time)


def test_recommendations_list_and_approve_applies_one(capsys: Capture) -> None:
    with controller() as c:
        c.call(setup)
        code, out, err = run(capsys, "recommendations", "--controller", c.address, "-o", "json")
        assert (code, err) == (0, "")
        recs: list[dict[str, Any]] = json.loads(out)["recommendations"]
        by_node = {r["node"]: r for r in recs}
        cap, drain = by_node["n0"], by_node["n3"]
        assert (cap["cause"], cap["action"], cap["profile"], cap["state"], cap["risk"]) == (
            "power_cap",
            "tune",
            "gpu-defaults",
            "proposed",
            "online",
        )
        assert cap["changes"] == [
            {
                "setting": "gpu[0].power_limit",
                "current": "300 W",
                "target": "default (700 W)",
                "pending_reboot": False,
            }
        ]
        assert len(cap["finding_ids"]) == 1 and cap["gpus"] == [0] and cap["result"] is None
        assert cap["created"].endswith("Z") and cap["policy"] == "recommend"
        assert (drain["action"], drain["profile"], drain["risk"], drain["changes"]) == ("drain", "", "", [])
        assert "No setting fixes nvlink_down: drain the node" in drain["expected_effect"]

        code, out, _ = run(capsys, "recommendations", "--node", "n0", "--controller", c.address)
        assert code == 0 and cap["id"] in out and "gpu[0].power_limit: 300 W -> default (700 W)" in out
        assert "n3" not in out

        code, out, err = run(capsys, "approve", drain["id"], "--controller", c.address)
        assert code == 2
        assert f"is to drain node {drain['node']}, but no Kubernetes cluster is configured" in err

        code, out, err = run(
            capsys,
            "approve",
            cap["id"],
            "--reason",
            "capped by a script",
            "--controller",
            c.address,
            "-o",
            "json",
        )
        assert (code, err) == (0, "")
        doc = json.loads(out)
        assert doc["done"] and doc["recommendation_id"] == cap["id"] and doc["result"]["state"] == "committed"
        code, out, _ = run(capsys, "recommendations", "--node", "n0", "--controller", c.address, "-o", "json")
        [after] = json.loads(out)["recommendations"]
        assert after["state"] == "verified" and after["command_id"] == doc["command_id"]

        code, out, _ = run(capsys, "history", "--node", "n0", "--controller", c.address, "-o", "json")
        [entry] = json.loads(out)["entries"]
        assert (entry["action"], entry["outcome"], entry["reason"]) == (
            "retune",
            "succeeded",
            "capped by a script",
        )


def test_retune_confirms_dry_runs_applies_and_says_how_it_went(capsys: Capture) -> None:
    with controller(share=0.4) as c:  # 5 nodes: 2 may be in action within the window
        c.call(setup)
        code, out, err = run(capsys, "retune", "n0", "--profile", "gpu-defaults", "--controller", c.address)
        assert code == 2 and "not a terminal: pass --yes to apply gpu-defaults to n0" in err
        assert c.app.commands.mutating_holder("n0") is None  # nothing was sent

        code, out, err = run(
            capsys, "retune", "n0", "--profile", "gpu-defaults", "--dry-run", "--controller", c.address
        )
        assert (
            (code, err) == (0, "")
            and "n0: gpu-defaults (dry run): planned" in out
            and "gpu[0].power_limit" in out
        )

        code, out, err = run(
            capsys,
            "retune",
            "n0",
            "--profile",
            "gpu-defaults",
            "--gpu",
            "0",
            "--yes",
            "--controller",
            c.address,
            "-o",
            "json",
        )
        assert (code, err) == (0, "")
        doc = json.loads(out)
        assert doc["done"] and doc["result"]["state"] == "committed" and doc["recommendation_id"]

        code, out, err = run(
            capsys, "retune", "n1", "--profile", "gpu-defaults", "--yes", "--controller", c.address
        )
        assert (
            code == 1
            and "rolled_back" in out
            and "Re-probe" in out
            and "n1: gpu-defaults: rolled_back" in err
        )

        code, _, err = run(
            capsys, "retune", "ghost", "--profile", "gpu-defaults", "--yes", "--controller", c.address
        )
        assert code == 2 and "node 'ghost' is not known" in err
        code, _, err = run(capsys, "retune", "n0", "--profile", "gpu-defaults", "--gpu", "-1", "--yes")
        assert code == 2 and "--gpu must be a GPU index" in err
        code, _, err = run(capsys, "retune", "n0", "--yes")
        assert code == 2 and "--profile P is required" in err

        # n0 and n1 are in action within the window (the rolled-back one too): a third is refused
        c.call(lambda app: scripted(app, "n2", committed))
        code, _, err = run(
            capsys, "retune", "n2", "--profile", "gpu-defaults", "--yes", "--controller", c.address
        )
        assert code == 1 and "RESOURCE_EXHAUSTED" in err and "refused" in err

        code, out, err = run(
            capsys,
            "retune",
            "n0",
            "--profile",
            "gpu-defaults",
            "--yes",
            "--no-wait",
            "--controller",
            c.address,
        )
        assert code == 1 and "breaker tripped" in err


@pytest.mark.parametrize("timeout", ["0", "nan", "inf"])
@pytest.mark.parametrize(
    "command", [["retune", "n1", "--profile", "p", "--yes"], ["approve", "abc"]], ids=["retune", "approve"]
)
def test_a_wait_that_is_not_a_finite_number_of_seconds_is_refused_before_asking(
    capsys: Capture, command: list[str], timeout: str
) -> None:
    code = main([*command, "--timeout", timeout, "--controller", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert (code, err) == (2, f"gpufleet {command[0]}: --timeout must be a finite number of seconds > 0\n")


def test_a_retune_waited_for_on_a_terminal_says_what_it_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, retune and approve were silent on a terminal for up to --timeout (600 s)."""
    with ControllerThread(config()) as c:
        screen = Terminal()
        monkeypatch.setattr(sys, "stderr", screen)
        code = main(["retune", "ghost", "--profile", "gpu-defaults", "--yes", "--controller", c.address])
        shown = screen.getvalue()
    assert code == 2 and "NOT_FOUND: node 'ghost' is not known" in shown
    assert "retune ghost: gpu-defaults" in shown
