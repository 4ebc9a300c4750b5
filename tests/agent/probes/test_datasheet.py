"""The datasheet table: every entry sourced, names matched, peaks as the probes compare them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.probes.datasheet import DATASHEET, DatasheetError, load

REQUIRED = (
    "H100 80GB HBM3",
    "H100 PCIe",
    "H100 NVL",
    "H200",
    "A100-SXM4-80GB",
    "A100-PCIE-40GB",
    "B200",
    "L40S",
)


def test_every_model_and_the_lane_rates_cite_a_source() -> None:
    sheet = load()
    assert "pcisig.com" in sheet.pcie_lane_gbps.source
    for key, model in sheet.models.items():
        assert "NVIDIA" in model.source and "https://" in model.source, key
        assert {"bf16", "fp16", "tf32"} <= set(model.gemm_tflops), key
    text = DATASHEET.read_text()
    for line in text.splitlines():  # each peak has its datasheet figure beside it
        stripped = line.strip()
        if stripped.startswith(("bf16:", "fp16:", "tf32:", "fp8:", "memory_gbps:")):
            assert "#" in stripped, stripped


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("NVIDIA H100 PCIe", "h100_pcie"),
        ("NVIDIA H100 NVL", "h100_nvl"),
        ("NVIDIA H200", "h200_sxm"),
        ("NVIDIA H200 NVL", "h200_nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100_sxm4_80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100_sxm4_40gb"),
        ("NVIDIA A100 80GB PCIe", "a100_pcie_80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100_pcie_40gb"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
    ],
)
def test_nvml_names_find_their_model(name: str, key: str) -> None:
    found = load().lookup(name)
    assert found is not None and found[0] == key


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA GB200", "Tesla T4", "cpu", ""])
def test_other_devices_have_no_peak(name: str) -> None:
    sheet = load()
    assert sheet.lookup(name) is None
    assert sheet.peak(name, "gemm", "bf16") is None


def test_peaks_by_probe_and_variant() -> None:
    sheet = load()
    h100 = "NVIDIA H100 80GB HBM3"
    assert sheet.peak(h100, "gemm", "bf16") == pytest.approx(989.4)  # 1,979 sparse / 2
    assert sheet.peak(h100, "gemm", "fp8") == pytest.approx(1978.9)
    assert sheet.peak(h100, "membw", "d2d") == 3350
    assert sheet.peak(h100, "pcie", "h2d") == pytest.approx(3.938 * 16)  # gen 5 x16, one direction
    assert sheet.peak(h100, "nccl", "all_reduce") is None  # topology, not a datasheet figure
    assert sheet.peak("NVIDIA A100-SXM4-80GB", "gemm", "fp8") is None  # Ampere has no FP8
    assert sheet.peak(h100, "gemm", "fp32") is None  # the CPU's variant
    assert sheet.link_gbps(4, 8) == pytest.approx(1.969 * 8)
    assert sheet.link_gbps(None, 16) is None and sheet.link_gbps(9, 16) is None


def test_every_required_model_is_there() -> None:
    sheet = load()
    for name in REQUIRED:
        assert sheet.lookup(f"NVIDIA {name}") is not None, name


def test_a_malformed_table_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(DATASHEET.read_text())
    data["models"]["h100_sxm"]["source"] = "trust me"
    bad = tmp_path / "datasheet.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(DatasheetError, match="source"):
        load(bad)
