"""GPU datasheet peaks (datasheet.yaml) as typed data, and the peak a probe result is compared with."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec
import yaml

DATASHEET = Path(__file__).with_name("datasheet.yaml")


class DatasheetError(Exception):
    """datasheet.yaml is malformed; the message says where."""


class _Spec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class PcieLink(_Spec):
    gen: int
    width: int


class LaneRates(_Spec):
    source: str
    values: dict[int, float]


class GpuModel(_Spec):
    match: list[str]
    gemm_tflops: dict[str, float]
    memory_gbps: float
    pcie: PcieLink
    source: str
    exclude: list[str] = msgspec.field(default_factory=list)
    # Any other probe kind's datasheet figure: probe -> variant -> the best figure in the probe's unit
    # (a latency probe's is its lowest). A new probe kind adds its entries here, no code.
    probes: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)


class Datasheet(_Spec):
    pcie_lane_gbps: LaneRates
    models: dict[str, GpuModel]

    def __post_init__(self) -> None:
        for key, model in self.models.items():
            if not model.match:
                raise ValueError(f"model {key}: match lists no name")
            if "http" not in model.source:
                raise ValueError(f"model {key}: source must name the datasheet and its URL")
            if model.memory_gbps <= 0 or any(v <= 0 for v in model.gemm_tflops.values()):
                raise ValueError(f"model {key}: peaks must be > 0")
            if any(v <= 0 for variants in model.probes.values() for v in variants.values()):
                raise ValueError(f"model {key}: probe figures must be > 0")
            if model.pcie.gen not in self.pcie_lane_gbps.values:
                raise ValueError(f"model {key}: no lane rate for PCIe gen {model.pcie.gen}")

    def lookup(self, name: str) -> tuple[str, GpuModel] | None:
        """(key, model) whose longest `match` substring is in `name` (case-insensitive); None: unknown."""
        text = name.lower()
        best: tuple[int, str] | None = None
        for key, model in self.models.items():
            if any(x.lower() in text for x in model.exclude):
                continue
            for match in model.match:
                if match.lower() in text and (best is None or len(match) > best[0]):
                    best = (len(match), key)
        return None if best is None else (best[1], self.models[best[1]])

    def link_gbps(self, gen: int | None, width: int | None) -> float | None:
        """What a PCIe link of `gen` x `width` carries per direction, GB/s; None when not known."""
        if gen is None or width is None or gen not in self.pcie_lane_gbps.values or width <= 0:
            return None
        return self.pcie_lane_gbps.values[gen] * width

    def peak(self, gpu_name: str, probe: str, variant: str) -> float | None:
        """The datasheet peak a `probe`/`variant` result on `gpu_name` is compared with, in its unit.

        gemm: the dense TFLOP/s of the variant's dtype; membw: memory GB/s; pcie (h2d, d2h): the
        model's PCIe link per direction; any other probe: the model's `probes` entry. None for
        unknown models, variants and probes (nccl has no datasheet peak: it depends on the node's
        topology).
        """
        found = self.lookup(gpu_name)
        if found is None:
            return None
        model = found[1]
        if probe == "gemm":
            return model.gemm_tflops.get(variant)
        if probe == "membw" and variant == "d2d":
            return model.memory_gbps
        if probe == "pcie" and variant in ("h2d", "d2h"):
            return self.link_gbps(model.pcie.gen, model.pcie.width)
        return model.probes.get(probe, {}).get(variant)


@functools.cache
def load(path: Path = DATASHEET) -> Datasheet:
    try:
        data = yaml.safe_load(path.read_text())
        return msgspec.convert(data, Datasheet)
    except (OSError, yaml.YAMLError, msgspec.ValidationError) as exc:
        raise DatasheetError(f"{path}: {exc}") from exc
