"""bench/tuning_dry_run.py: a dry-run ApplyProfile against NVML that can write nothing, run here on
the project's fake NVML (on a lent GPU it runs on the real one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.agent.sources.test_nvml_fake import FakeNvml
from tests.bench.scripts import bench_script

READS = ("nvmlInit", "nvmlShutdown", "nvmlErrorString", "nvmlDeviceGet", "nvmlSystemGet")


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    with bench_script("tuning_dry_run") as module:
        yield module


def test_the_dry_run_plans_every_profile_and_writes_nothing(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeNvml(root=True)
    monkeypatch.setattr(bench, "pynvml", fake.module)
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "non-dry apply on a disabled tuner: state=refused" in out
    assert "blocked write attempts: none" in out
    results = json.loads(out.rsplit("JSON ", 1)[1])
    assert results["gpu-defaults"]["state"] == "planned"
    assert results["gpu-defaults"]["changes"]  # the locks are always written: a plan, not an empty one
    written = [name for name, _ in fake.calls if not name.startswith(READS)]
    assert written == []


def test_the_guard_stops_a_write_that_would_reach_nvml(bench: ModuleType) -> None:
    fake = FakeNvml(root=True)
    guarded = bench.ReadOnlyNvml(fake.module)
    with pytest.raises(bench.BlockedWrite):
        guarded.nvmlDeviceSetPowerManagementLimit(None, 1)
    assert not [name for name, _ in fake.calls if name.startswith("nvmlDeviceSet")]
