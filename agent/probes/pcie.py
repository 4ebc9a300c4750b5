"""PCIe probe: pinned host-to-device (h2d) and device-to-host (d2h) copies, GB/s in one direction.

Each variant copies a 256 MiB pinned host buffer (1 GiB for the full suite) to or from the GPU on
the current stream, timed with CUDA events. The runner adds the link's generation and width read
during the copy and the bandwidth they allow (the kernel cannot see the link).

The CPU device has no PCIe link. So that `--device cpu` still exercises this code, the CPU's one
variant is `h2h`: the same copy between two pageable host buffers, labelled as such (link "none",
pinned false), with no peak to compare with. Its figure is host memory speed, not a link's.
"""

from __future__ import annotations

from typing import Any

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import ProbeError, ProbeParams, register
from agent.probes.membw import random_bytes, same_bytes
from agent.probes.timing import is_cuda, measure, run_on_device

MIB = 1024**2


def default_size(device: str, suite: str) -> int:
    if not is_cuda(device):
        return 64 * MIB
    return 1024 * MIB if suite == "full" else 256 * MIB


@register
class PcieProbe:
    name = "pcie"
    node_level = False
    unit = "GB/s"
    higher_is_better = True
    gpu_variants = ("h2d", "d2h")  # the CPU device: h2h
    concurrent = False
    description = "host<->device copy bandwidth over PCIe, pinned memory, one direction"
    budget_share = 0.075  # of the suite's budget per GPU, per variant

    def variants(self, device: str) -> list[str]:
        return ["h2d", "d2h"] if is_cuda(device) else ["h2h"]

    def run(self, params: ProbeParams) -> ProbeOutcome:
        supported = self.variants(params.device)
        if params.variant not in supported:
            raise ProbeError(
                f"pcie {params.variant} is not available on {params.device} (it has {', '.join(supported)})"
            )
        size = params.size or default_size(params.device, params.suite)
        if size < MIB:
            raise ProbeError(f"pcie needs a buffer of at least 1 MiB, not {size} bytes")
        return run_on_device(params, size, self._measure)

    def _measure(self, params: ProbeParams, size: int, deadline: float) -> ProbeOutcome:
        device, variant = params.device, params.variant
        src, dst = _buffers(variant, size, device)
        timing = measure(lambda _: dst.copy_(src, non_blocking=True), device=device, deadline=deadline)
        passed = same_bytes(src, dst)
        if is_cuda(device):
            where = {
                "pinned": "true",
                "direction": "host to device" if variant == "h2d" else "device to host",
            }
        else:
            where = {
                "pinned": "false",
                "link": "none",
                "note": "the CPU device has no PCIe link: a host-to-host copy through this probe's code",
            }
        outcome = ProbeOutcome(
            probe=self.name,
            variant=variant,
            gpu=None,
            value=size / timing.median / 1e9,
            unit="GB/s",
            duration_seconds=0.0,
            time=0.0,
            params={
                "size_bytes": str(size),
                "counted": "bytes moved, one direction",
                **where,
                **timing.params(),
            },
            check_passed=passed,
            device=device,
        )
        if not passed:
            outcome.error = "correctness check failed: the copy differs from its source"
        return outcome


def _buffers(variant: str, size: int, device: str) -> tuple[Any, Any]:
    """(source, destination): random source bytes, the host side pinned on a GPU."""
    import torch

    if variant == "h2h":
        return random_bytes(size, "cpu", seed=11), torch.empty(size, dtype=torch.uint8)
    on_gpu = random_bytes(size, device, seed=11)
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    if variant == "h2d":
        pinned.copy_(on_gpu)  # random host bytes, made on the GPU (faster than on the CPU)
        return pinned, torch.empty_like(on_gpu)
    return on_gpu, pinned
