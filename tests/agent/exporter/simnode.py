"""A simulated node's agent in this process, with its exporter and a real /metrics server.

The agent is built as `gpufleet agent --sim` builds it (simulated GPUs, the simulated BMC, modelled
probes) with an injectable clock, so a test can pin time; `serve` starts the HTTP server on a free
loopback port and stops it after the test.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent.config import load
from agent.daemon import Agent
from agent.exporter import Exporter, MetricsServer
from agent.snapshot import Snapshot
from agent.sources.sim import SimNode
from agent.sources.sim.bmc import SimBmc
from agent.sources.sim.faults import FaultSpec
from agent.sources.sim.probes import ModelledProbes
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.support import require

SHARED_DCGM = Path(__file__).resolve().parents[3].parent / "shared" / "dcgm-exporter"


def shared_dcgm(name: str) -> Path:
    """A file of NVIDIA's dcgm-exporter reference data in ../shared (skipped locally when absent)."""
    path = SHARED_DCGM / name
    require(path.is_file(), f"{path} is absent: ../shared/dcgm-exporter holds dcgm-exporter's reference data")
    return path


def default_host(sim: SimNode, seed: int) -> Any:
    """The simulated host beside the simulated GPUs (seeded, on the node's clock)."""
    from agent.sources.sim.host import SimHost

    return SimHost(sim, seed=seed)


@dataclass
class SimAgent:
    agent: Agent
    exporter: Exporter
    gpu: SimNode
    rounds: int = 0

    def sample(self) -> Snapshot:
        return self.agent.sample()

    def run_probes(self, names: Sequence[str] = ()) -> None:
        """One probe round through the agent's command path; the results ride the next sample."""
        self.rounds += 1  # a new id each round: the agent answers a repeated id without running it
        command = pb.Command(id=f"probe-round-{self.rounds}", run_probes=pb.RunProbes(probes=list(names)))
        result = asyncio.run(self.agent.handle_command(command))
        assert result.ok, result.error

    def close(self) -> None:
        self.agent.close()


def build(
    *,
    node: str = "n1",
    gpus: int = 8,
    seed: int = 7,
    faults: Sequence[str] = (),
    dcgm_compat: bool = False,
    clock: Callable[[], float] | None = None,
    host: Any = None,
    gpu_class: type[SimNode] = SimNode,
) -> SimAgent:
    """The agent of a simulated node, its exporter attached, one BMC poll done (nothing sampled)."""
    config = load(None, {"node": node, "source": "sim", "sim": {"gpus": gpus, "seed": seed}})
    kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
    sim = gpu_class(node, gpus=gpus, seed=seed, faults=[FaultSpec.parse(f) for f in faults], **kwargs)
    agent = Agent(
        config,
        sim,
        host if host is not None else default_host(sim, seed),
        ModelledProbes(sim),
        bmc=SimBmc(sim, seed=seed),
        **kwargs,
    )
    exporter = Exporter(node, agent.inventory, agent.host_facts, dcgm_compat=dcgm_compat)
    agent.exporter = exporter
    assert agent.bmc is not None
    agent.bmc.poll_once()
    return SimAgent(agent, exporter, sim)


@contextmanager
def serve(exporter: Exporter) -> Iterator[MetricsServer]:
    server = MetricsServer("127.0.0.1:0", exporter.render)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of a GET; HTTP errors are answers too."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read().decode()


def scrape(server: MetricsServer, headers: dict[str, str] | None = None) -> str:
    status, _, body = fetch(server.url, headers)
    assert status == 200, body
    return body


@dataclass
class Page:
    """A parsed /metrics page: families by the name in their TYPE line."""

    text: str
    families: dict[str, Metric] = field(init=False)

    def __post_init__(self) -> None:
        self.families = {}
        for family in text_string_to_metric_families(self.text):
            # The parser drops _total from counter family names; the TYPE line keeps it.
            total = f"# TYPE {family.name}_total counter\n" in self.text
            name = family.name + "_total" if total else family.name
            self.families[name] = family

    def samples(self, name: str) -> list[Sample]:
        family = self.families.get(name)
        return list(family.samples) if family else []

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample of `name` carrying `labels` (None when there is none)."""
        found = [s.value for s in self.samples(name) if all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
        return float(found[0]) if found else None
