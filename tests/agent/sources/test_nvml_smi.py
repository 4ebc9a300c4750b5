"""The real NVML inventory against nvidia-smi, an independent reader of the same driver (gpu only).

The identity fields feed the controller's GPU classes (model, default power limit, driver branch):
a field read wrong here puts every GPU of a node in the wrong peer group.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.agent.sources.test_nvml import real_nvml

FIELDS = "uuid,name,pci.bus_id,vbios_version,driver_version,power.default_limit,memory.total"


def smi_rows(nvidia_smi: str) -> dict[str, list[str]]:
    out = subprocess.run(
        [nvidia_smi, f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
    return {row[0]: row for row in rows}


def parse_optional_number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


@pytest.mark.gpu
def test_real_nvml_inventory_matches_nvidia_smi() -> None:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        pytest.skip("nvidia-smi is not on PATH: nothing independent to compare NVML's inventory with")
    with real_nvml() as source:
        inv = source.inventory()
    smi = smi_rows(nvidia_smi)
    assert sorted(smi) == sorted(g.uuid for g in inv.gpus)
    for gpu in inv.gpus:
        _, name, bus_id, vbios, driver, default_limit, memory_mib = smi[gpu.uuid]
        assert gpu.name == name
        assert gpu.pci_bus_id.lower() == bus_id.lower()
        assert gpu.vbios_version == vbios
        assert inv.driver_version == driver
        smi_watts = parse_optional_number(default_limit)
        if smi_watts is None:
            assert gpu.default_power_limit_watts is None
        else:
            assert gpu.default_power_limit_watts == pytest.approx(smi_watts, abs=0.5)
        assert gpu.memory_total_bytes is not None
        assert abs(gpu.memory_total_bytes / 2**20 - float(memory_mib)) <= 1
