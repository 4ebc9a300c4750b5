"""dcgm-exporter compatibility: its names, types, help and labels, the unit conversions, and every
metric NVIDIA's own dcgm-exporter dashboard queries, for every GPU of a simulated node."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from agent.exporter.catalogue import load
from agent.exporter.view import DCGM_LABELS
from agent.sources.gpu import GpuReading
from tests.agent.exporter.simnode import Page, SimAgent, build, scrape, serve, shared_dcgm

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def node() -> Iterator[SimAgent]:
    sim = build(node="gpu-node-3", dcgm_compat=True, faults=["ecc_row_remap_pending:2"])
    sim.sample()
    try:
        yield sim
    finally:
        sim.close()


@pytest.fixture(scope="module")
def text(node: SimAgent) -> str:
    with serve(node.exporter) as server:
        return scrape(server)


@pytest.fixture(scope="module")
def page(text: str) -> Page:
    return Page(text)


def _readings(node: SimAgent) -> dict[str, GpuReading]:
    snapshot = node.agent.latest
    assert snapshot is not None
    return {str(r.index): r for r in snapshot.gpus}


def test_names_types_help_and_labels(node: SimAgent, text: str, page: Page) -> None:
    inventory = {str(g.index): g for g in node.agent.inventory.gpus}
    for spec in load().dcgm:
        family = page.families.get(spec.name)
        assert family is not None, spec.name
        # dcgm-exporter writes counters under their bare names: no _total on HELP, TYPE or samples.
        assert f"# HELP {spec.name} {spec.help}\n" in text
        assert f"# TYPE {spec.name} {spec.type}\n" in text
        lines = [line for line in text.splitlines() if line.startswith(spec.name + "{")]
        assert len(lines) == 8, spec.name
        assert family.type == spec.type
        for sample in family.samples:
            labels = sample.labels
            assert tuple(sorted(labels)) == tuple(sorted(DCGM_LABELS)), spec.name
            info = inventory[labels["gpu"]]
            assert labels["UUID"] == info.uuid
            assert labels["device"] == f"nvidia{info.index}"
            assert labels["modelName"] == info.name
            assert labels["Hostname"] == "gpu-node-3"
            assert labels["pci_bus_id"] == info.pci_bus_id
            assert labels["DCGM_FI_DRIVER_VERSION"] == info.driver_version != ""
    assert "_total" not in "".join(
        line for line in text.splitlines() if line.startswith(("DCGM_", "# TYPE DCGM"))
    )


def test_unit_conversions_match_the_readings(node: SimAgent, page: Page) -> None:
    readings = _readings(node)
    assert len(readings) == 8
    for gpu, r in readings.items():
        assert r.sm_clock_hz and r.energy_joules_total and r.memory_used_bytes is not None

        def value(name: str, gpu: str = gpu) -> float | None:
            return page.value(name, gpu=gpu)

        assert value("DCGM_FI_DEV_SM_CLOCK") == pytest.approx(r.sm_clock_hz / 1e6)
        assert value("DCGM_FI_DEV_MEM_CLOCK") == pytest.approx((r.memory_clock_hz or 0) / 1e6)
        assert value("DCGM_FI_DEV_GPU_TEMP") == r.temperature_celsius
        assert value("DCGM_FI_DEV_MEMORY_TEMP") == r.memory_temperature_celsius
        assert value("DCGM_FI_DEV_POWER_USAGE") == r.power_watts
        assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == pytest.approx(r.energy_joules_total * 1000)
        assert value("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == r.pcie_replay_errors_total
        assert value("DCGM_FI_DEV_GPU_UTIL") == pytest.approx((r.gpu_utilization_ratio or 0) * 100)
        assert value("DCGM_FI_DEV_MEM_COPY_UTIL") == pytest.approx((r.memory_utilization_ratio or 0) * 100)
        assert value("DCGM_FI_DEV_ENC_UTIL") == pytest.approx((r.encoder_utilization_ratio or 0) * 100)
        assert value("DCGM_FI_DEV_DEC_UTIL") == pytest.approx((r.decoder_utilization_ratio or 0) * 100)
        assert value("DCGM_FI_DEV_FB_USED") == pytest.approx(r.memory_used_bytes / MIB)
        assert value("DCGM_FI_DEV_FB_FREE") == pytest.approx((r.memory_free_bytes or 0) / MIB)
        assert value("DCGM_FI_DEV_FB_RESERVED") == pytest.approx((r.memory_reserved_bytes or 0) / MIB)
        nvlink_bytes = (r.nvlink_tx_bytes_total or 0) + (r.nvlink_rx_bytes_total or 0)
        assert nvlink_bytes > 0 and value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == pytest.approx(nvlink_bytes)
        assert value("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == r.row_remap_correctable_total
        assert value("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == r.row_remap_uncorrectable_total
        assert value("DCGM_FI_DEV_ROW_REMAP_FAILURE") == float(bool(r.row_remap_failure))
        assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE") == r.gpm_graphics_activity_ratio
        assert value("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == r.gpm_tensor_activity_ratio
        assert value("DCGM_FI_PROF_DRAM_ACTIVE") == r.gpm_dram_activity_ratio
        assert value("DCGM_FI_PROF_PCIE_TX_BYTES") == r.pcie_tx_bytes_per_second
        assert value("DCGM_FI_PROF_PCIE_RX_BYTES") == r.pcie_rx_bytes_per_second
    xids = readings["2"].xid_events
    assert xids and page.value("DCGM_FI_DEV_XID_ERRORS", gpu="2") == xids[-1].code
    assert page.value("DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0.0


def _dashboard_metrics() -> set[str]:
    """Every DCGM_* metric NVIDIA's dashboard queries: panel targets and template variables."""
    dashboard = json.loads(shared_dcgm("dcgm-exporter-dashboard.json").read_text())
    queries: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query", "definition") and isinstance(value, str):
                    queries.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return {name for query in queries for name in re.findall(r"\bDCGM_[A-Z0-9_]+", query)}


def test_every_metric_of_nvidias_dashboard_is_there_for_every_gpu(page: Page) -> None:
    used = _dashboard_metrics()
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} <= used
    for name in sorted(used):
        gpus = {s.labels["gpu"] for s in page.samples(name)}
        assert gpus == {str(i) for i in range(8)}, name


def test_off_by_default() -> None:
    sim = build(gpus=2)
    try:
        sim.sample()
        text = sim.exporter.render().decode()
        assert "DCGM_" not in text and "gpufleet_gpu_sm_clock_hertz{" in text
    finally:
        sim.close()


def test_nvlink_bandwidth_only_with_both_directions() -> None:
    """A direction that failed to read leaves no sample, rather than a counter that drops (a reset)."""
    sim = build(gpus=2, dcgm_compat=True)
    try:
        snapshot = sim.sample()
        both = {
            r.index: (r.nvlink_tx_bytes_total or 0) + (r.nvlink_rx_bytes_total or 0) for r in snapshot.gpus
        }
        snapshot.gpus[1].nvlink_rx_bytes_total = None
        sim.exporter.observe(snapshot)
        page = Page(sim.exporter.render().decode())
        assert page.value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0") == pytest.approx(both[0])
        assert page.value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="1") is None
    finally:
        sim.close()
