"""NvmlSource's cadence: slow queries every `slow_every` reads, repeated in between; calls counted."""

from __future__ import annotations

import pynvml
import pytest

from agent.sources.gpu import ComputeProcess
from agent.sources.nvml.source import NvmlSource
from tests.agent.sources.test_nvml_fake import H100_LINKS, FakeNvml, fast_xid_thread


@pytest.fixture(autouse=True)
def _fast_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_xid_thread(monkeypatch)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


def test_slow_values_are_read_every_slow_every_cycles_and_repeated_between(fake: FakeNvml) -> None:
    with NvmlSource(nvml=fake.module, slow_every=3) as source:
        links_at_start = fake.calls[("nvmlDeviceGetNvLinkState", 0)]
        assert links_at_start == pynvml.NVML_NVLINK_MAX_LINKS  # counted once, at start
        gpu = fake.gpus[0]
        seen = []
        for cycle in range(7):
            gpu.crc = 100 * cycle
            gpu.processes = [(cycle, None)]
            gpu.limit_mw = 600_000 + cycle  # read as a field value: every cycle
            gpu.compute_mode = cycle % 4  # a setting, asked by call: slow
            r = source.read()[0]
            seen.append((r.nvlinks[0].crc_errors_total, r.processes[0].pid, r.compute_mode))
            assert len(r.nvlinks) == H100_LINKS
            assert r.enforced_power_limit_watts == (600_000 + cycle) / 1000
        # Read at cycles 0, 3 and 6; the values in between are the last ones read.
        assert seen == [(0, 0, 1), (0, 0, 1), (0, 0, 1), (300, 3, 4), (300, 3, 4), (300, 3, 4), (600, 6, 3)]
        assert fake.calls[("nvmlDeviceGetComputeRunningProcesses_v3", 0)] == 3
        assert fake.calls[("nvmlDeviceGetGpuFabricInfoV", 0)] == 3
        assert fake.calls[("nvmlDeviceGetTemperatureThreshold", 0)] == 3 * 4
        assert fake.calls[("nvmlDeviceGetNvLinkRemotePciInfo", 0)] == 3 * (
            H100_LINKS - 1
        )  # active links only
        assert fake.calls[("nvmlDeviceGetNvLinkState", 0)] == links_at_start  # states come as field values
        assert fake.calls[("nvmlDeviceGetNvLinkState", 1)] == pynvml.NVML_NVLINK_MAX_LINKS


def test_repeated_values_are_copies(fake: FakeNvml) -> None:
    with NvmlSource(nvml=fake.module, slow_every=6) as source:
        a, b = source.read()[0], source.read()[0]
        a.nvlinks[0].crc_errors_total = -1
        a.processes[0].pid = -1
        a.processes.append(ComputeProcess(1))
        c = source.read()[0]
    assert b.nvlinks[0].crc_errors_total == c.nvlinks[0].crc_errors_total == 7
    assert b.processes == c.processes == [ComputeProcess(4242, 8 << 30), ComputeProcess(4343, None)]


def test_a_failed_slow_call_waits_for_the_next_slow_cycle(fake: FakeNvml) -> None:
    fake.errors[("nvmlDeviceGetComputeRunningProcesses_v3", 0)] = pynvml.NVML_ERROR_UNKNOWN
    with NvmlSource(nvml=fake.module, slow_every=2) as source:
        assert source.read()[0].processes == []
        assert source.last_errors() == ["gpu 0 processes: Unknown Error"]
        del fake.errors[("nvmlDeviceGetComputeRunningProcesses_v3", 0)]
        assert source.read()[0].processes == []  # not asked again before its cycle
        assert source.last_errors() == []
        assert [p.pid for p in source.read()[0].processes] == [4242, 4343]


def test_calls_counts_every_call_into_pynvml(fake: FakeNvml) -> None:
    with NvmlSource(nvml=fake.module, slow_every=3, xid_events=False, gpm_min_window_s=0.0) as source:
        assert source.calls == fake.calls.total()
        source.inventory()
        assert source.calls == fake.calls.total()
        per_read = []
        for _ in range(4):
            before = source.calls
            source.read()
            per_read.append(source.calls - before)
        assert source.calls == fake.calls.total()
    assert source.calls == fake.calls.total()  # close: nvmlShutdown
    # Steady state, both GPUs: 29 calls a fast cycle (2 of them field-value batches), 77 a slow one
    # (per-link NVLink batches, one remote PCI call per active link, processes, fabric, settings).
    assert per_read == [77, 29, 29, 77]
