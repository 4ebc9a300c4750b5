"""`gpufleet probe-node` against a real controller on loopback, whose nodes are scripted agents
answering on the controller's own loop: every exit status, the table, and the JSON document."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from controller.app import ControllerApp
from controller.cli.output import print_document
from controller.cli.probe_node import response_to_dict
from controller.main import main
from protos.gpufleet.v1 import operator_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import ControllerThread, config, hello
from tests.support import free_port

Capture = pytest.CaptureFixture[str]
OFFERED = ["gemm", "membw", "pcie", "nccl"]


def result(
    probe: str, variant: str, gpu: int | None, value: float, command_id: str, *, error: str = ""
) -> pb.ProbeResult:
    r = pb.ProbeResult(probe=probe, variant=variant, value=value, command_id=command_id, simulated=True)
    r.unit = "GB/s" if probe != "gemm" else "TFLOP/s"
    r.time.FromNanoseconds(time.time_ns())
    if gpu is not None:
        r.gpu = gpu
        # what the GPU ran at while measured: held by its power cap
        r.during.sm_clock_hz, r.during.power_watts, r.during.temperature_celsius = 1515e6, 685.4, 61.0
        r.during.clock_event_reasons = pb.CLOCK_EVENT_REASON_SW_POWER_CAP
    if error:
        r.error = error
    else:
        r.peak_ratio, r.mode = value / 1000.0, "isolated"
    return r


async def scripted(app: ControllerApp, node: str, behaviour: str) -> None:
    """A connected node whose agent answers each probe command as `behaviour` says:
    ok (results, then the answer), fail (a failed result and an error), silent (never answers)."""
    h = hello(node, gpus=2, capabilities=["run_probes"], probes=OFFERED)
    await app.ingest.hello(h)
    outbox: asyncio.Queue[pb.ControllerMessage] = asyncio.Queue()
    app.connected(node)
    app.commands.open_stream(h, outbox, "scripted")
    seq = 0
    while True:
        command = (await outbox.get()).command
        if behaviour == "silent":
            continue
        gpus = list(command.run_probes.gpus) or [0, 1]
        results = [result("gemm", "bf16", g, 700.0 + g, command.id) for g in gpus]
        if behaviour == "fail":
            results[0] = result("gemm", "bf16", gpus[0], 0.0, command.id, error="check failed: NaN")
        frame = pb.TelemetryFrame(node=node, boot_id="b1", seq=(seq := seq + 1), probes=results)
        frame.time.FromNanoseconds(time.time_ns())
        await app.ingest.frame(node, frame)
        app.probing.frame_results(node, frame)
        error = "gemm/bf16: check failed: NaN" if behaviour == "fail" else ""
        app.commands.answered(node, pb.CommandResult(command_id=command.id, ok=not error, error=error))


@pytest.fixture(scope="module")
def controller() -> Iterator[ControllerThread]:
    with ControllerThread(config(), clock=time.time) as c:
        tasks: list[asyncio.Task[None]] = []

        async def setup(app: ControllerApp) -> None:
            for node, behaviour in (("good", "ok"), ("bad", "fail"), ("mute", "silent")):
                tasks.append(asyncio.create_task(scripted(app, node, behaviour)))
            await app.ingest.hello(hello("away", gpus=2, capabilities=["run_probes"], probes=OFFERED))
            while not all(app.probing.reachable(n) for n in ("good", "bad", "mute")):
                await asyncio.sleep(0.01)

        c.call(setup)
        yield c

        async def teardown(app: ControllerApp) -> None:
            for task in tasks:
                task.cancel()

        c.call(teardown)


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_of_a_successful_run(controller: ControllerThread, capsys: Capture) -> None:
    code, out, err = run(
        capsys, "probe-node", "good", "--gpu", "1", "--controller", controller.address, "-o", "json"
    )
    assert (code, err) == (0, "")
    doc: dict[str, Any] = json.loads(out)
    assert list(doc) == ["node", "command_id", "done", "ok", "error", "results"]
    assert (doc["node"], doc["done"], doc["ok"], doc["error"]) == ("good", True, True, "")
    (only,) = doc["results"]
    assert (only["probe"], only["gpu"], only["value"], only["command_id"]) == (
        "gemm",
        1,
        701.0,
        doc["command_id"],
    )
    assert only["time"].endswith("Z") and only["simulated"] is True


def test_table_of_a_successful_run(
    controller: ControllerThread, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run(capsys, "probe-node", "good", "--probe", "gemm", "--controller", controller.address)
    assert (code, err) == (0, "")
    header = next(line for line in out.splitlines() if "PROBE" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "PROBE",
        "VARIANT",
        "GPU",
        "VALUE",
        "UNIT",
        "PEAK",
        "MODE",
        "CHECK",
    ]
    rows = [line.split("│")[1:-1] for line in out.splitlines() if "gemm" in line]
    assert [[c.strip() for c in row] for row in rows] == [
        ["gemm", "bf16", "0", "700.0", "TFLOP/s", "70%", "isolated (simulated)", "-"],
        ["gemm", "bf16", "1", "701.0", "TFLOP/s", "70%", "isolated (simulated)", "-"],
    ]


def test_a_failed_probe_exits_1_with_the_results_shown(controller: ControllerThread, capsys: Capture) -> None:
    code, out, err = run(capsys, "probe-node", "bad", "--controller", controller.address, "-o", "json")
    assert code == 1
    assert err.strip() == "gpufleet probe-node: bad: gemm/bf16: check failed: NaN"
    doc = json.loads(out)
    assert (doc["done"], doc["ok"]) == (True, False)
    assert [r.get("error", "") for r in doc["results"]] == ["check failed: NaN", ""]


def test_no_answer_in_time_exits_1(controller: ControllerThread, capsys: Capture) -> None:
    code, out, err = run(capsys, "probe-node", "mute", "--timeout", "0.2", "--controller", controller.address)
    assert (code, out) == (1, "")
    assert err.startswith("gpufleet probe-node: mute: no answer within 0s (command ")
    code, _, err = run(capsys, "probe-node", "mute", "--controller", controller.address)
    assert code == 2 and "FAILED_PRECONDITION: node mute is already probing" in err


def test_no_wait_prints_the_command_id(controller: ControllerThread, capsys: Capture) -> None:
    code, out, err = run(capsys, "probe-node", "good", "--no-wait", "--controller", controller.address)
    assert (code, err) == (0, "")
    assert out.startswith("probe command ") and out.rstrip().endswith(" sent to good")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ghost",), "gpufleet probe-node: node ghost not found"),
        (("away",), "FAILED_PRECONDITION: node away is not connected"),
        (("good", "--gpu", "2"), "INVALID_ARGUMENT: node good has no GPU 2 (it has: 0, 1)"),
        (("good", "--probe", "warp"), "INVALID_ARGUMENT: node good does not offer probe warp"),
        (("good", "--gpu", "-1"), "gpufleet probe-node: --gpu must be a GPU index (>= 0)"),
        (("good", "--timeout", "0"), "gpufleet probe-node: --timeout must be a finite number of seconds > 0"),
        # before: a deadline of NaN or infinity, and "cannot reach controller: Deadline Exceeded"
        (
            ("good", "--timeout", "inf"),
            "gpufleet probe-node: --timeout must be a finite number of seconds > 0",
        ),
        (
            ("good", "--timeout", "nan"),
            "gpufleet probe-node: --timeout must be a finite number of seconds > 0",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    controller: ControllerThread, capsys: Capture, args: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, "probe-node", *args, "--controller", controller.address)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and message in err


def test_an_unreachable_controller_exits_1(capsys: Capture) -> None:
    code, out, err = run(capsys, "probe-node", "good", "--controller", f"127.0.0.1:{free_port()}")
    assert (code, out) == (1, "")
    assert err.startswith("gpufleet probe-node: cannot reach controller at 127.0.0.1:")


def test_yaml_is_the_json_document(controller: ControllerThread, capsys: Capture) -> None:
    code, out, err = run(
        capsys, "probe-node", "good", "--gpu", "0", "--controller", controller.address, "-o", "yaml"
    )
    assert (code, err) == (0, "")
    doc = yaml.safe_load(out)
    assert list(doc) == ["node", "command_id", "done", "ok", "error", "results"]
    (only,) = doc["results"]
    assert (only["probe"], only["gpu"], only["value"], only["command_id"]) == (
        "gemm",
        0,
        700.0,
        doc["command_id"],
    )
    resp = operator_pb2.ProbeNodeResponse(
        command_id="c1", done=True, ok=True, results=[result("gemm", "bf16", 0, 1.0, "c1")]
    )
    for fmt in ("json", "yaml"):
        print_document(response_to_dict("good", resp), fmt)
    as_json, as_yaml = capsys.readouterr().out.split("\n}\n")
    assert yaml.safe_load(as_yaml) == json.loads(as_json + "}") == response_to_dict("good", resp)


def test_wide_table_has_more_columns(
    controller: ControllerThread, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run(capsys, "probe-node", "good", "--controller", controller.address, "-o", "wide")
    assert (code, err) == (0, "")
    header = next(line for line in out.splitlines() if "PROBE" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]][-6:] == [
        "SECONDS",
        "DEVICE",
        "SM MHz",
        "POWER W",
        "TEMP C",
        "REASONS",
    ]
    row = next(line for line in out.splitlines() if "bf16" in line and "│ 0 " in line)
    assert [c.strip() for c in row.split("│")[1:-1]][-4:] == ["1515", "685", "61", "sw_power_cap"]
