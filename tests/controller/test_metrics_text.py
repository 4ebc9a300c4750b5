"""The controller's /metrics page written with TextGauges (controller/metrics_text.py) against
prometheus_client's own exposition of the same families: byte for byte, including label values
that need escaping, label names out of order and values that need Go's float formatting."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from controller.app import ControllerApp
from controller.metrics import PREFIX, controller_registry
from controller.metrics_text import OneHotGauge, TextGauge, page
from tests.controller.harness import STALE_AFTER, Clock, add_findings, config, hello, populate, stored_finding

HELP = 'help with a \\ and a\nnewline "quoted"'
AWKWARD = 'rack "7"\\slot\nb'  # every character the text format escapes in a label value
LABELS = ["node", "gpu", "cause"]  # not in name order: the page sorts them (cause, gpu, node)
SERIES: list[tuple[list[str], float]] = [
    (["n1", "0", "power_cap"], 1),
    ([AWKWARD, "", "nvlink_down"], 0),
    (["n2", "7", 'say "hi"'], 1795930198.1741557),
    (["n3", "1", "x"], -0.5),
    (["n4", "2", "y"], math.inf),
    (["n5", "3", "z"], 1e-9),
    (["n6", "4", "w"], 12345678.0),
]


class _Registry(Collector):
    def __init__(self, *metrics: Metric) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return iter(self.metrics)


def _both(labels: list[str], series: list[tuple[list[str], float]]) -> tuple[TextGauge, GaugeMetricFamily]:
    text = TextGauge("gpufleet_controller_thing", HELP, labels)
    plain = GaugeMetricFamily("gpufleet_controller_thing", HELP, labels=labels)
    for values, value in series:
        text.add_metric(values, value)
        plain.add_metric(values, value)
    return text, plain


@pytest.mark.parametrize(
    ("labels", "series"),
    [
        (LABELS, SERIES),
        (["node", "state"], [([AWKWARD, s], 1 if s == "failed" else 0) for s in ("healthy", "failed")] * 3),
        ([], [([], 3.0)]),
        (["node"], []),  # no series: HELP and TYPE only, as generate_latest writes it
    ],
)
def test_a_text_gauge_writes_what_generate_latest_writes(
    labels: list[str], series: list[tuple[list[str], float]]
) -> None:
    text, plain = _both(labels, series)
    expected = generate_latest(_Registry(plain))
    assert text.text().encode() == expected
    assert generate_latest(_Registry(text)) == expected
    assert text.samples == plain.samples


def test_a_text_gauge_refuses_a_series_with_the_wrong_number_of_labels() -> None:
    gauge = TextGauge("gpufleet_controller_thing", "h", ["node", "state"])
    with pytest.raises(ValueError, match="2 label values expected, got 1"):
        gauge.add_metric(["n1"], 1)
    with pytest.raises(TypeError, match="add_metric"):
        gauge.samples = plain_samples()


STATES = ("healthy", "degraded", "failed")


def one_hot(kept: dict[tuple[str, str], str], current: list[tuple[str, str]]) -> OneHotGauge:
    gauge = OneHotGauge("gpufleet_controller_node_health", HELP, ("node", "state"), STATES, kept)
    for node, state in current:
        gauge.add_current(node, state)
    return gauge


def plain_one_hot(current: list[tuple[str, str]]) -> GaugeMetricFamily:
    plain = GaugeMetricFamily("gpufleet_controller_node_health", HELP, labels=["node", "state"])
    for node, state in current:
        for s in STATES:
            plain.add_metric([node, s], 1 if s == state else 0)
    return plain


def test_a_one_hot_gauge_writes_what_generate_latest_writes_and_keeps_each_nodes_lines() -> None:
    kept: dict[tuple[str, str], str] = {}
    first = [("n1", "healthy"), (AWKWARD, "failed"), ("n3", "")]  # "": no state is 1
    gauge = one_hot(kept, first)
    expected = generate_latest(_Registry(plain_one_hot(first)))
    assert gauge.text().encode() == expected
    assert generate_latest(_Registry(gauge)) == expected
    assert gauge.samples == plain_one_hot(first).samples
    assert set(kept) == set(first)

    # The next page: n1's lines are the kept ones (marked here, so reuse shows); n1 changed state:
    # written afresh, both kept.
    kept[("n1", "healthy")] = kept[("n1", "healthy")].replace("} 1.0", "} 7.0")
    assert '{node="n1",state="healthy"} 7.0' in one_hot(kept, first).text()
    second = [("n1", "degraded"), (AWKWARD, "failed"), ("n3", "")]
    assert one_hot(kept, second).text().encode() == generate_latest(_Registry(plain_one_hot(second)))
    assert set(kept) == {*first, ("n1", "degraded")}


def test_a_one_hot_gauge_forgets_nodes_gone_once_it_holds_twice_the_nodes() -> None:
    kept: dict[tuple[str, str], str] = {}
    one_hot(kept, [(f"n{i}", "healthy") for i in range(4)]).text()
    one_hot(kept, [(f"n{i}", "healthy") for i in range(2)]).text()  # 4 kept for 2 nodes: all stay
    assert len(kept) == 4
    one_hot(kept, [("n0", "healthy")]).text()
    assert set(kept) == {("n0", "healthy")}
    with pytest.raises(TypeError, match="add_current"):
        one_hot(kept, []).samples = plain_samples()


def plain_samples() -> list[Sample]:
    family = GaugeMetricFamily("gpufleet_controller_thing", "h", labels=["node"])
    family.add_metric(["n1"], 1)
    return family.samples


def test_the_controller_page_is_what_generate_latest_writes_of_its_registry() -> None:
    """A fleet with every health, findings on awkwardly named nodes: the page served equals
    prometheus_client's exposition of the same registry, and the per-node families hold what
    `gpufleet nodes` shows."""

    async def body() -> None:
        clock = Clock()
        app = ControllerApp(config(stale_after_seconds=STALE_AFTER), clock=clock)
        await app.start()
        try:
            await populate(app, clock)
            await app.ingest.hello(hello(AWKWARD, gpus=1))
            await add_findings(app, [stored_finding(AWKWARD, None, "nvlink_down", "critical")])
            registry = controller_registry(app)
            served = page(registry)
            assert served == generate_latest(registry)
            families = {f.name: f for f in text_string_to_metric_families(served.decode())}
            health = {
                s.labels["node"]: s.labels["state"]
                for s in families[PREFIX + "node_health"].samples
                if s.value == 1
            }
            assert health == {
                "a-healthy": "healthy",
                "b-degraded": "degraded",
                "c-critical": "critical",
                "d-stale": "stale",
                "e-returned": "healthy",
                AWKWARD: "critical",
            }
            active = families[PREFIX + "finding_active"].samples
            assert {(s.labels["node"], s.labels["cause"]) for s in active} >= {
                (AWKWARD, "nvlink_down"),
                ("c-critical", "nvlink_down"),
            }
        finally:
            app.close()

    asyncio.run(body())
