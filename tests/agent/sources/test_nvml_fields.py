"""NvmlSource's batched field values: one nvmlDeviceGetFieldValues per GPU, calls where they are missing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from agent.sources.nvml.query import ALL_LINKS
from agent.sources.nvml.source import NvmlSource
from tests.agent.sources.test_nvml_fake import UINT, FakeNvml, fast_xid_thread

FI = pynvml


@pytest.fixture(autouse=True)
def _fast_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_xid_thread(monkeypatch)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def source(fake: FakeNvml) -> Iterator[NvmlSource]:
    with NvmlSource(nvml=fake.module) as s:
        yield s


def requests_of(fake: FakeNvml, gpu: int) -> list[list[Any]]:
    return [ids for index, ids in fake.field_requests if index == gpu]


def test_one_field_value_batch_per_gpu_per_read(fake: FakeNvml, source: NvmlSource) -> None:
    source.read()  # a slow cycle: the per-link batches come too
    fake.field_requests.clear()
    source.read()
    (h100,) = requests_of(fake, 0)
    (l40s,) = requests_of(fake, 1)
    for field_id in (
        FI.NVML_FI_DEV_POWER_AVERAGE,
        FI.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        FI.NVML_FI_DEV_REMAPPED_PENDING,
    ):
        assert field_id in h100
    assert (FI.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS) in h100
    # What a GPU answered NOT_SUPPORTED for is no longer asked.
    assert FI.NVML_FI_DEV_RETIRED_SBE not in h100 and FI.NVML_FI_DEV_RETIRED_SBE in l40s
    assert FI.NVML_FI_DEV_MEMORY_TEMP in h100 and FI.NVML_FI_DEV_MEMORY_TEMP not in l40s
    # Answered by field values, the equivalent calls are never made.
    for function in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPcieThroughput"):
        assert fake.calls[(function, 0)] == 0


def test_per_link_values_come_in_two_batches_per_slow_cycle(fake: FakeNvml, source: NvmlSource) -> None:
    source.read()
    states, counters = requests_of(fake, 0)[1:]
    assert states == [(FI.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(18)]
    active = [link for link in range(18) if link != 5]
    assert (FI.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 4) in counters
    assert {scope for _, scope in counters} == set(active)  # the down link is not asked
    assert fake.calls[("nvmlDeviceGetNvLinkErrorCounter", 0)] == 0


def test_a_driver_without_field_values_reads_the_same_through_calls(fake: FakeNvml) -> None:
    old = FakeNvml()
    for gpu in (0, 1):
        old.errors[("nvmlDeviceGetFieldValues", gpu)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    with NvmlSource(nvml=fake.module) as new_source, NvmlSource(nvml=old.module) as old_source:
        for _ in range(3):
            new, by_calls = new_source.read(), old_source.read()
        assert old_source.last_errors() == []
        unsupported = old_source.inventory().gpus[0].unsupported_fields
    # Only what NVML has as field values alone differs (and the PCIe rates, read as KB/s instead).
    only_fields = {
        "memory_temperature_celsius",
        "retired_pages_sbe_total",
        "retired_pages_dbe_total",
        "retired_pages_pending",
        "nvlink_tx_bytes_total",
        "nvlink_rx_bytes_total",
        "pcie_tx_bytes_per_second",
        "pcie_rx_bytes_per_second",
    }
    for a, b in zip(new, by_calls, strict=True):
        x, y = dataclasses.asdict(a), dataclasses.asdict(b)
        differing = {k for k in x if x[k] != y[k]} - {"nvlinks"}
        assert differing <= only_fields, differing
        for link_a, link_b in zip(a.nvlinks, b.nvlinks, strict=True):
            assert dataclasses.replace(link_a, tx_bytes_total=None, rx_bytes_total=None) == link_b
    assert (by_calls[0].pcie_tx_bytes_per_second, by_calls[0].pcie_rx_bytes_per_second) == (1.5e6, 2.5e6)
    assert by_calls[0].power_watts == 512.345 and by_calls[0].row_remap_pending is True
    assert {"memory_temperature_celsius", "nvlink_tx_bytes_total", "nvlinks.tx_bytes_total"} <= set(
        unsupported
    )
    # Found missing once per batch (GPU, link states, link counters), never asked again.
    assert old.calls[("nvmlDeviceGetFieldValues", 0)] == 3
    assert old.calls[("nvmlDeviceGetFieldValues", 1)] == 1


@pytest.mark.parametrize("status", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT])
def test_a_field_the_driver_lacks_falls_back_to_its_call(
    fake: FakeNvml, source: NvmlSource, status: int
) -> None:
    fake.field_errors[(0, FI.NVML_FI_DEV_POWER_AVERAGE)] = status
    for _ in range(3):
        assert source.read()[0].power_watts == 512.345
        assert source.last_errors() == []
    assert fake.calls[("nvmlDeviceGetPowerUsage", 0)] == 3
    gpu_batches = [ids for ids in requests_of(fake, 0) if FI.NVML_FI_DEV_ECC_CURRENT in ids]
    assert [FI.NVML_FI_DEV_POWER_AVERAGE in ids for ids in gpu_batches] == [True, False, False]
    assert "power_watts" not in source.inventory().gpus[0].unsupported_fields


def test_a_field_pynvml_lacks_falls_back_to_its_call(fake: FakeNvml) -> None:
    del fake.module.NVML_FI_DEV_POWER_CURRENT_LIMIT  # an older nvidia-ml-py
    del fake.module.NVML_FI_DEV_MEMORY_TEMP
    with NvmlSource(nvml=fake.module) as source:
        unsupported = source.inventory().gpus[0].unsupported_fields
        r = source.read()[0]
        assert source.last_errors() == []
    assert r.enforced_power_limit_watts == 700.0 and fake.calls[("nvmlDeviceGetEnforcedPowerLimit", 0)] == 2
    assert r.memory_temperature_celsius is None and "memory_temperature_celsius" in unsupported


def test_a_field_with_no_call_is_listed_unsupported_and_dropped(fake: FakeNvml, source: NvmlSource) -> None:
    fake.field_errors[(0, FI.NVML_FI_DEV_MEMORY_TEMP)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source.read()
    source.read()
    assert source.last_errors() == []
    assert FI.NVML_FI_DEV_MEMORY_TEMP not in requests_of(fake, 0)[-1]
    assert "memory_temperature_celsius" in source.inventory().gpus[0].unsupported_fields


def test_a_failed_field_value_is_none_and_an_error_for_that_cycle(fake: FakeNvml, source: NvmlSource) -> None:
    fake.field_errors[(0, FI.NVML_FI_DEV_ECC_SBE_VOL_TOTAL)] = pynvml.NVML_ERROR_UNKNOWN
    r = source.read()[0]
    assert r.ecc_corrected_volatile_total is None and r.ecc_uncorrected_volatile_total == 0
    assert source.last_errors() == ["gpu 0 ecc_corrected_volatile_total: Unknown Error"]
    del fake.field_errors[(0, FI.NVML_FI_DEV_ECC_SBE_VOL_TOTAL)]
    assert source.read()[0].ecc_corrected_volatile_total == 3
    assert source.last_errors() == []


def test_a_failed_batch_is_one_error_and_the_calls_still_answer(fake: FakeNvml, source: NvmlSource) -> None:
    source.read()
    fake.errors[("nvmlDeviceGetFieldValues", 0)] = pynvml.NVML_ERROR_UNKNOWN
    r = source.read()[0]
    assert source.last_errors() == ["gpu 0 field values: Unknown Error"]
    assert r.power_watts is None and r.energy_joules_total is None
    assert r.temperature_celsius == 61 and r.sm_clock_hz == 1.98e9
    del fake.errors[("nvmlDeviceGetFieldValues", 0)]
    assert source.read()[0].power_watts == 512.345  # not mistaken for a driver without field values


def test_pcie_rate_across_a_32_bit_counter_wrap(fake: FakeNvml, source: NvmlSource) -> None:
    gpu = fake.gpus[0]
    gpu.pcie_counter_type = UINT
    gpu.pcie_tx = (1 << 32) - 1000
    source.read()
    gpu.pcie_tx = 3000  # wrapped: 4000 bytes later
    gpu.field_time_us += 2_000_000
    assert source.read()[0].pcie_tx_bytes_per_second == 2000.0


def test_a_64_bit_counter_going_back_is_a_reset_not_a_rate(fake: FakeNvml, source: NvmlSource) -> None:
    gpu = fake.gpus[0]
    source.read()
    gpu.pcie_tx -= 5000
    gpu.field_time_us += 1_000_000
    assert source.read()[0].pcie_tx_bytes_per_second is None
    gpu.pcie_tx += 8000
    gpu.field_time_us += 1_000_000
    assert source.read()[0].pcie_tx_bytes_per_second == 8000.0  # counting again from the reset
