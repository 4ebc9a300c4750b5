"""A probe kind the controller has never heard of, end to end in one process: real agent daemons over
simulated nodes that offer the test-only `latency` probe (lower is better, per GPU), a real
controller on loopback with a SQLite file, `gpufleet node NAME -o json` and the node's table.

No controller code names `latency`: it is scheduled, stored, shown and compared from the ProbeInfo
in the agents' Hellos.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest

from agent.config import load
from agent.daemon import Agent
from agent.sources.sim import SimNode
from agent.sources.sim.host import SimHost
from controller.app import ControllerApp
from controller.cli import operator
from controller.config import ProbeConfig
from controller.detect.runner import PassReport
from controller.store.store import Store
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from tests.controller.harness import ControllerThread, config
from tests.controller.test_probe_node import TIMEOUT, agents_running, until
from tests.probe_kind import NAME, UNIT, VARIANT, LatencyProbes, latency_registered

NODES = ("lat-a", "lat-b", "lat-c", "lat-d")
SLOW = ("lat-c", 1)  # this GPU's latency is 1.6 times its peers'


def agent(address: str, node: str) -> Agent:
    cfg = load(
        None,
        {
            "node": node,
            "source": "sim",
            "interval_seconds": 0.1,
            "sim": {"gpus": 2},
            "stream": {"controller": address, "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.2},
            "metrics": {"address": None},
        },
    )
    source = SimNode(node, gpus=2, load=0.0)
    slow = [SLOW[1]] if node == SLOW[0] else []
    return Agent(cfg, source, SimHost(source), LatencyProbes(source, slow=slow))


async def probe_every_node(c: ControllerThread) -> None:
    agents = [agent(c.address, n) for n in NODES]
    async with agents_running(*agents), grpc.aio.insecure_channel(c.address) as channel:
        fleet = c.app.fleet
        await until(lambda: all(n in fleet.nodes and fleet.nodes[n].connected for n in NODES), "the agents")
        stub = operator_pb2_grpc.OperatorStub(channel)
        for node in NODES:
            request = operator_pb2.ProbeNodeRequest(node=node, probes=[NAME], wait=True)
            resp = await stub.ProbeNode(request, timeout=TIMEOUT)
            assert resp.done and resp.ok, resp.error
            assert [(r.probe, r.variant, r.unit) for r in resp.results] == [(NAME, VARIANT, UNIT)] * 2
        await until(lambda: sum(1 for k in fleet.probes if k[2] == NAME) == 2 * len(NODES), "stored results")


def test_a_new_probe_kind_is_stored_shown_and_compared_without_a_controller_edit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "controller.db"
    cfg = config(db=str(db), probes=ProbeConfig(on_connect=False, periodic=False))
    with latency_registered(), ControllerThread(cfg, clock=time.time) as c:
        asyncio.run(probe_every_node(c))

        async def detect(app: ControllerApp) -> PassReport:
            return await app.detection_pass()

        c.call(detect)  # raised, pending: it opens the second pass (detect.open_after_passes)
        report = c.call(detect)
        assert not report.failed
        assert [(f.node, f.gpu, f.cause) for f in report.findings] == [(*SLOW, "slow_unknown")]
        (finding,) = report.findings
        assert finding.evidence.metric == f"probe.{NAME}.{VARIANT}"
        assert finding.evidence.deviation is not None and finding.evidence.deviation > 0.5

        assert operator.node(c.address, SLOW[0], "json") == 0
        doc = json.loads(capsys.readouterr().out)
        latency = next(i for i in doc["hello"]["probe_infos"] if i["name"] == NAME)
        assert (
            latency["unit"] == UNIT and not latency.get("higher_is_better") and not latency.get("node_level")
        )
        assert latency["variants"] == [VARIANT]
        assert sorted((p["probe"], p["gpu"], p["unit"]) for p in doc["probes"]) == [
            (NAME, 0, UNIT),
            (NAME, 1, UNIT),
        ]
        assert [(f["gpu"], f["cause"]) for f in doc["findings"]] == [(SLOW[1], "slow_unknown")]

        monkeypatch.setenv("COLUMNS", "250")
        assert operator.node(c.address, SLOW[0], "table") == 0
        out = capsys.readouterr().out
        assert f"{NAME} ({UNIT}, lower is better, per GPU)" in out
        assert "nccl (GB/s, higher is better, per node)" in out

    async def reload() -> None:
        store = Store(str(db))
        await store.open()
        try:
            fleet, findings = await store.load()
        finally:
            store.close()
        hello = fleet.nodes[SLOW[0]].hello
        assert [(i.name, i.unit, i.higher_is_better) for i in hello.probe_infos if i.name == NAME] == [
            (NAME, UNIT, False)
        ]
        assert {k for k in fleet.probes if k[2] == NAME} == {
            (n, g, NAME, VARIANT) for n in NODES for g in (0, 1)
        }
        assert [(f.finding.node, f.finding.gpu) for f in findings] == [SLOW]

    asyncio.run(reload())
