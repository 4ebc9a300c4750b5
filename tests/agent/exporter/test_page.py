"""The native /metrics page of a simulated node, through a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from agent.exporter import CONTENT_TYPE, MetricsServer, MetricsServerError
from agent.exporter.catalogue import MetricSpec, load
from agent.exporter.derive import CLOCK_EVENT_REASONS
from agent.sources.errors import SourceError
from agent.sources.gpu import GpuReading
from agent.sources.sim import SimNode
from protos.names import clock_event_reason_bit
from tests.agent.exporter.simnode import Page, SimAgent, build, fetch, scrape, serve
from tests.support import free_port, require

OPENMETRICS_FIRST = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"  # what Prometheus 2.42 sends
)


@pytest.fixture
def node() -> Iterator[SimAgent]:
    sim = build(faults=["thermal_throttle:1"])
    sim.sample()
    sim.run_probes()
    sim.sample()
    try:
        yield sim
    finally:
        sim.close()


@pytest.fixture
def server(node: SimAgent) -> Iterator[MetricsServer]:
    with serve(node.exporter) as running:
        yield running


def _resolve(path: str, roots: dict[str, Any]) -> list[Any]:
    """Every value at a catalogue source path ("gpus[].nvlinks[].active"), read straight off the data."""
    head, *rest = path.split(".")
    name = head.removesuffix("[]").removesuffix("{}")
    if name in roots:
        values = [roots[name]]
    else:
        values = [roots["snapshot"]]
        rest = [head, *rest]
    for part in rest:
        attr = part.removesuffix("[]").removesuffix("{}")
        next_values = []
        for value in values:
            if value is None:
                continue
            got = getattr(value, attr)
            if part.endswith("[]"):
                next_values.extend(got)
            elif part.endswith("{}"):
                next_values.extend(got.values())
            else:
                next_values.append(got)
        values = next_values
    return values


def _set(spec: MetricSpec, node: SimAgent) -> bool:
    """Whether the data holds a value for `spec`'s source (then its family must be on the page)."""
    roots = {
        "snapshot": node.agent.latest,
        "inventory": node.agent.inventory,
        "host_facts": node.agent.host_facts,
        "probes": None,
        "agent": node.agent,
    }
    if spec.scope == "probes[]":
        return True  # a probe round ran
    if spec.scope == "agent":
        return True
    source = spec.source.replace(",", " ").replace("+", " ").split()[0]
    values = [v for v in _resolve(source, roots) if v is not None and v != ""]
    if spec.derive == "xid_code_errors_total":
        values = [v for v in values if v]  # no XID yet: no code to count
    if spec.derive == "governor_cores":
        values = [c.governor for cpus in values for c in cpus if c.governor]
    return bool(values)


def test_every_catalogue_metric_whose_source_is_set_is_on_the_page(
    node: SimAgent, server: MetricsServer
) -> None:
    page = Page(scrape(server))
    specs = load().metrics
    expected = {spec.name for spec in specs if _set(spec, node)}
    assert len(expected) > 100  # GPUs, BMC, probes and the agent at least
    assert expected - set(page.families) == set()
    # And nothing on the page that the catalogue does not list.
    assert set(page.families) <= {spec.name for spec in specs}


def test_labels_and_types_are_the_catalogues(node: SimAgent, server: MetricsServer) -> None:
    text = scrape(server)
    page = Page(text)
    specs = {spec.name: spec for spec in load().metrics}
    inventory = {g.uuid: g for g in node.agent.inventory.gpus}
    for name, family in page.families.items():
        spec = specs[name]
        assert family.type == ("gauge" if spec.type == "info" else spec.type), name
        assert f"# TYPE {name} {family.type}\n" in text  # counters keep _total in the exposition
        for sample in family.samples:
            assert set(sample.labels) == set(spec.labels), (name, sample.labels)
            assert sample.labels["node"] == "n1"
            if "gpu_uuid" in spec.labels and "model_name" in spec.labels:
                info = inventory[sample.labels["gpu_uuid"]]
                assert sample.labels["gpu"] == str(info.index)
                assert sample.labels["model_name"] == info.name == "NVIDIA H100 80GB HBM3"
                assert sample.labels["pci_bus_id"] == info.pci_bus_id
            if spec.type == "info":
                assert sample.value == 1.0
    assert _non_finite(text) == []


def test_gpu_values_are_the_readings(node: SimAgent, server: MetricsServer) -> None:
    page = Page(scrape(server))
    snapshot = node.agent.latest
    assert snapshot is not None and len(snapshot.gpus) == 8
    for r in snapshot.gpus:
        gpu = str(r.index)
        assert page.value("gpufleet_gpu_sm_clock_hertz", gpu=gpu) == r.sm_clock_hz
        assert page.value("gpufleet_gpu_power_limit_watts", gpu=gpu) == r.enforced_power_limit_watts
        assert page.value("gpufleet_gpu_energy_joules_total", gpu=gpu) == r.energy_joules_total
        assert page.value("gpufleet_gpu_row_remap_pending", gpu=gpu) == float(bool(r.row_remap_pending))
        assert page.value("gpufleet_gpu_xid_errors_total", gpu=gpu) == 0.0
        assert page.value("gpufleet_gpu_xid_last_code", gpu=gpu) == 0.0
        for link in r.nvlinks:
            assert page.value("gpufleet_gpu_nvlink_active", gpu=gpu, link=str(link.link)) == float(
                link.active
            )
    assert page.value("gpufleet_snapshot_timestamp_seconds") == snapshot.time


def test_clock_event_reasons_one_series_per_name(node: SimAgent, server: MetricsServer) -> None:
    page = Page(scrape(server))
    reasons = {
        (s.labels["gpu"], s.labels["reason"]): s.value
        for s in page.samples("gpufleet_gpu_clock_event_reason")
    }
    assert len(reasons) == 8 * len(CLOCK_EVENT_REASONS)
    assert reasons[("1", "hw_thermal_slowdown")] == 1.0  # the injected thermal throttle
    assert reasons[("0", "hw_thermal_slowdown")] == 0.0
    snapshot = node.agent.latest
    assert snapshot is not None
    for r in snapshot.gpus:
        assert r.clock_event_reasons is not None
        for reason in CLOCK_EVENT_REASONS:
            bit_set = bool(r.clock_event_reasons & clock_event_reason_bit(reason))
            assert reasons[(str(r.index), reason)] == float(bit_set)


def _non_finite(text: str) -> list[str]:
    """Sample lines whose value is NaN or an infinity."""
    return [
        line
        for line in text.splitlines()
        if not line.startswith("#") and line.rsplit(" ", 1)[-1] in ("NaN", "+Inf", "-Inf")
    ]


def _probe_series(page: Page) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["probe"], s.labels["variant"], s.labels["gpu"]): s.value
        for s in page.samples("gpufleet_probe_value")
    }


def test_probe_results_are_kept_across_snapshots(node: SimAgent, server: MetricsServer) -> None:
    first = Page(scrape(server))
    results = _probe_series(first)
    assert results and ("nccl", next(iter(k[1] for k in results if k[0] == "nccl")), "") in results
    assert all(first.value("gpufleet_probe_success", probe=p, variant=v, gpu=g) == 1.0 for p, v, g in results)
    node.sample()  # carries no probe result
    assert node.agent.latest is not None and node.agent.latest.probes == []
    assert _probe_series(Page(scrape(server))) == results
    # A new result replaces only its own (probe, variant, gpu).
    node.run_probes(["gemm"])
    node.sample()
    after = _probe_series(Page(scrape(server)))
    assert after.keys() == results.keys()
    assert {k: v for k, v in after.items() if k[0] != "gemm"} == {
        k: v for k, v in results.items() if k[0] != "gemm"
    }
    assert any(after[k] != results[k] for k in results if k[0] == "gemm")


def test_a_failed_probe_reports_failure_without_a_value() -> None:
    sim = build(gpus=2)
    try:
        outcome = sim.gpu.probe("gemm", "bf16", 0)
        outcome.error = "CUDA error: out of memory"
        snapshot = sim.sample()
        snapshot.probes = [outcome]
        sim.exporter.observe(snapshot)
        page = Page(sim.exporter.render().decode())
        labels = {"probe": "gemm", "variant": "bf16", "gpu": "0"}
        assert page.value("gpufleet_probe_success", **labels) == 0.0
        assert page.value("gpufleet_probe_value", **labels) is None
        assert page.value("gpufleet_probe_timestamp_seconds", **labels) == outcome.time
    finally:
        sim.close()


def test_none_and_nan_readings_give_no_sample(node: SimAgent, server: MetricsServer) -> None:
    snapshot = node.sample()
    snapshot.gpus[0].power_watts = math.nan
    snapshot.gpus[1].temperature_celsius = None
    snapshot.gpus[2].sm_clock_hz = math.inf
    snapshot.gpus[3].clock_event_reasons = None
    node.exporter.observe(snapshot)
    text = scrape(server)
    page = Page(text)
    assert _non_finite(text) == []
    power = {s.labels["gpu"] for s in page.samples("gpufleet_gpu_power_watts")}
    temperature = {s.labels["gpu"] for s in page.samples("gpufleet_gpu_temperature_celsius")}
    clocks = {s.labels["gpu"] for s in page.samples("gpufleet_gpu_sm_clock_hertz")}
    reasons = {s.labels["gpu"] for s in page.samples("gpufleet_gpu_clock_event_reason")}
    everything = {str(i) for i in range(8)}
    assert (power, temperature, clocks, reasons) == (
        everything - {"0"},
        everything - {"1"},
        everything - {"2"},
        everything - {"3"},
    )


class _BrokenGpus(SimNode):
    def read(self) -> list[GpuReading]:
        raise SourceError("nvml", "NVML_ERROR_GPU_IS_LOST on every GPU")


def test_a_failed_collector_shows_success_0() -> None:
    sim = build(gpus=2, gpu_class=_BrokenGpus)
    try:
        sim.sample()
        page = Page(sim.exporter.render().decode())
        assert page.value("gpufleet_collector_success", collector="gpu") == 0.0
        assert page.value("gpufleet_collector_success", collector="bmc") == 1.0
        duration = page.value("gpufleet_collector_duration_seconds", collector="gpu")
        assert duration is not None and duration >= 0
        assert page.samples("gpufleet_gpu_power_watts") == []
        assert len(page.samples("gpufleet_gpu_info")) == 2  # the inventory still names the GPUs
    finally:
        sim.close()


def test_xid_last_code_outlives_the_reading_that_carried_it() -> None:
    sim = build(gpus=2, faults=["ecc_row_remap_pending:1"], dcgm_compat=True)
    try:
        first = sim.sample()
        events = first.gpus[1].xid_events
        assert events  # the fault raises XIDs at the first read
        page = Page(sim.exporter.render().decode())
        assert page.value("gpufleet_gpu_xid_last_code", gpu="1") == events[-1].code
        assert page.value("gpufleet_gpu_xid_errors_total", gpu="1") == len(events)
        assert page.value("gpufleet_gpu_xid_code_errors_total", gpu="1", xid=str(events[-1].code)) is not None
        assert page.value("gpufleet_gpu_xid_last_code", gpu="0") == 0.0
        assert sim.sample().gpus[1].xid_events == []
        page = Page(sim.exporter.render().decode())
        assert page.value("gpufleet_gpu_xid_last_code", gpu="1") == events[-1].code
        assert page.value("DCGM_FI_DEV_XID_ERRORS", gpu="1") == events[-1].code
    finally:
        sim.close()


def test_before_the_first_snapshot_only_the_agent_and_inventory_show() -> None:
    sim = build(gpus=2)
    try:
        page = Page(sim.exporter.render().decode())
        assert set(page.families) == {"gpufleet_agent_info", "gpufleet_gpu_info", "gpufleet_host_info"}
    finally:
        sim.close()


def test_text_format_0_0_4_even_when_openmetrics_is_asked_for(server: MetricsServer) -> None:
    for accept in (OPENMETRICS_FIRST, "application/openmetrics-text; version=1.0.0", ""):
        status, headers, body = fetch(server.url, {"Accept": accept} if accept else None)
        assert status == 200
        assert headers["Content-Type"] == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
        assert "# EOF" not in body and "gpufleet_gpu_power_watts{" in body


def test_gzip_when_asked(server: MetricsServer) -> None:
    import gzip
    import urllib.request

    request = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert b"gpufleet_agent_info" in gzip.decompress(response.read())


def test_index_and_404(server: MetricsServer) -> None:
    base = server.url.removesuffix("/metrics")
    status, headers, body = fetch(base + "/")
    assert status == 200 and "/metrics" in body and headers["Content-Type"].startswith("text/plain")
    for path in ("/metric", "/metrics/x", "/favicon.ico"):
        status, _, _ = fetch(base + path)
        assert status == 404, path
    status, _, body = fetch(base + "/metrics?foo=bar")
    assert status == 200 and "gpufleet_agent_info" in body


def test_port_in_use_is_a_clear_error(node: SimAgent) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(MetricsServerError, match=f"cannot serve metrics on 127.0.0.1:{port}: .*in use"):
            MetricsServer(f"127.0.0.1:{port}", node.exporter.render)


@pytest.mark.parametrize(
    "address", ["nonsense", "127.0.0.1:99999", "no-such-host.invalid:9400", "10.255.255.1:0"]
)
def test_bad_addresses_are_clear_errors(address: str) -> None:
    with pytest.raises(MetricsServerError, match=r"metrics address must be|cannot serve metrics on"):
        MetricsServer(address, lambda: b"")


def test_a_page_that_cannot_render_is_a_500_and_the_server_lives_on() -> None:
    calls = []

    def render() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return b"ok 1\n"

    server = MetricsServer("127.0.0.1:0", render)
    server.start()
    try:
        status, _, body = fetch(server.url)
        assert status == 500 and "boom" in body
        assert fetch(server.url)[:1] == (200,)
    finally:
        server.stop()


def test_the_page_is_rendered_once_per_snapshot(node: SimAgent) -> None:
    first = node.exporter.render()
    assert node.exporter.render() is first  # a second scraper costs nothing
    snapshot = node.sample()  # observed: the next scrape renders anew
    page = Page(node.exporter.render().decode())
    assert page.value("gpufleet_snapshot_timestamp_seconds") == snapshot.time
    assert Page(first.decode()).value("gpufleet_snapshot_timestamp_seconds") != snapshot.time


# Names the lead fixed for dashboards and alerts that promtool's naming lint questions: HugePages_Total
# is the kernel's own word for a gauge, and an InfiniBand rate is stated in bits per second.
LINT_ACCEPTED = {
    'gpufleet_host_hugepages_total non-counter metrics should not have "_total" suffix',
    'gpufleet_host_infiniband_port_rate_bits_per_second use base unit "bytes" instead of "bits"',
}


def test_promtool_lints_the_native_page_clean(server: MetricsServer) -> None:
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool is not installed (Debian package prometheus)")
    assert promtool is not None
    done = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape(server),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    problems = {line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()}
    assert problems <= LINT_ACCEPTED, problems - LINT_ACCEPTED
