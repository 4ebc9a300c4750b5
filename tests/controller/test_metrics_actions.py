"""The breaker and the actions asked of it on the controller's /metrics page (controller/metrics_actions.py),
from a real app over a SQLite file: armed with every series at 0, then actions allowed and finished,
one refused (tripping it), per-group budgets while the window holds actions, and a reset."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.app import ControllerApp
from controller.metrics import controller_registry
from tests.controller.harness import H100, Clock, config, frame, hello

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(app: ControllerApp) -> Samples:
    """Every breaker and action sample: (name, labels) -> value."""
    page = generate_latest(controller_registry(app)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if "breaker_" in s.name or "_actions_" in s.name
    }


def actions(samples: Samples, kind: str, outcome: str) -> float:
    return samples["gpufleet_controller_actions_total", (("kind", kind), ("outcome", outcome))]


def scope(samples: Samples, name: str, where: str) -> float:
    return samples[f"gpufleet_controller_breaker_{name}", (("scope", where),)]


async def fleet_of(app: ControllerApp, nodes: int, gpus: int, prefix: str) -> None:
    for i in range(nodes):
        name = f"{prefix}{i:02d}"
        await app.ingest.hello(hello(name, gpus=gpus))
        await app.ingest.frame(name, frame(1, name, t=app.clock()))
        app.connected(name)


async def check_the_page_follows_the_breaker(tmp_path: Path) -> None:
    clock = Clock()
    app = ControllerApp(config(db=str(tmp_path / "c.db")), clock=clock)
    await app.start()
    try:
        await fleet_of(app, 30, 8, "big")  # budget at 5%: 2 of 30
        await fleet_of(app, 10, 4, "small")  # 1 of 10; fleet-wide 2 of 40
        armed = scrape(app)
        assert armed[("gpufleet_controller_breaker_tripped", ())] == 0
        assert scope(armed, "nodes_in_action", "fleet") == 0 and scope(armed, "node_limit", "fleet") == 2
        assert {v for (name, _), v in armed.items() if name == "gpufleet_controller_actions_total"} == {0}
        never = ("gpufleet_controller_actions_total", (("kind", "cordon"), ("outcome", "rolled_back")))
        assert never not in armed  # only a retune rolls back

        first = await app.breaker.request("retune", "big00", "policy", "power_cap")
        assert first.allowed
        await app.breaker.finished(first, "rolled_back", "re-probe still slow")
        busy = scrape(app)
        assert actions(busy, "retune", "rolled_back") == 1 and actions(busy, "retune", "succeeded") == 0
        assert scope(busy, "nodes_in_action", "fleet") == 1
        big, small = f"{H100} x8", f"{H100} x4"
        assert scope(busy, "nodes_in_action", big) == 1 and scope(busy, "node_limit", big) == 2
        assert scope(busy, "nodes_in_action", small) == 0 and scope(busy, "node_limit", small) == 1

        second = await app.breaker.request("drain", "small00", "scheduler", "xid 79")
        assert second.allowed
        refused = await app.breaker.request("retune", "big01", "operator:alice", "clocks low")
        assert not refused.allowed  # fleet-wide 2 of 2 already: trips the breaker
        tripped = scrape(app)
        assert tripped[("gpufleet_controller_breaker_tripped", ())] == 1
        assert actions(tripped, "retune", "refused") == 1
        assert scope(tripped, "nodes_in_action", "fleet") == 2  # the drain in progress counts
        await app.breaker.finished(second, "succeeded", "drained")
        assert actions(scrape(app), "drain", "succeeded") == 1

        clock.now += 2 * 3600  # past the window: still tripped until reset
        assert scrape(app)[("gpufleet_controller_breaker_tripped", ())] == 1
        await app.breaker.reset("operator:alice", "checked big01")
        after = scrape(app)
        assert after[("gpufleet_controller_breaker_tripped", ())] == 0
        assert scope(after, "nodes_in_action", "fleet") == 0
        assert (
            "gpufleet_controller_breaker_nodes_in_action",
            (("scope", f"{H100} x8"),),
        ) not in after  # an empty window: fleet-wide only
        assert actions(after, "retune", "rolled_back") == 1  # counters never go back
    finally:
        app.close()


def test_the_page_follows_the_breaker(tmp_path: Path) -> None:
    asyncio.run(check_the_page_follows_the_breaker(tmp_path))
