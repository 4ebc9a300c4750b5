"""Memory bandwidth probe: a device-to-device copy, counting the bytes read plus the bytes written.

`dst.copy_(src)` of a buffer far bigger than any cache (1 GiB on a GPU, 4 GiB for the full suite;
64 MiB of host memory on the CPU, where the "device" is the host) streams HBM both ways, as
nvbandwidth's and the datasheet's figures count it. GB/s are 1e9 bytes. The copy is then checked:
the destination must equal the source (random bytes, never zeros).
"""

from __future__ import annotations

from typing import Any

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import ProbeError, ProbeParams, register
from agent.probes.timing import is_cuda, measure, run_on_device, total_memory_bytes

MIB = 1024**2
GIB = 1024**3


def default_size(device: str, suite: str) -> int:
    """Bytes per buffer (two are allocated): big against caches, small against the device's memory."""
    if not is_cuda(device):
        return 64 * MIB
    size = 4 * GIB if suite == "full" else GIB
    memory = total_memory_bytes(device) or 0
    return min(size, max(64 * MIB, memory // 8))


def random_bytes(size: int, device: str, seed: int) -> Any:
    """`size` random bytes on `device` (1..255: a copy of zeros would prove nothing)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(1, 256, (size,), dtype=torch.uint8, device=device, generator=generator)


def same_bytes(a: Any, b: Any, window: int = MIB) -> bool:
    """Whether the first, middle and last `window` bytes of the two buffers (any devices) are equal."""
    import torch

    n = a.numel()
    if b.numel() != n:
        return False
    middle = max(0, n // 2 - window // 2)
    return all(
        bool(torch.equal(a[start : start + window].cpu(), b[start : start + window].cpu()))
        for start in (0, middle, max(0, n - window))
    )


@register
class MembwProbe:
    name = "membw"
    node_level = False
    unit = "GB/s"
    higher_is_better = True
    gpu_variants = ("d2d",)
    concurrent = False
    description = "device memory bandwidth: a device-to-device copy, read+write bytes"
    budget_share = 0.1  # of the suite's budget per GPU, per variant

    def variants(self, device: str) -> list[str]:
        return ["d2d"]

    def run(self, params: ProbeParams) -> ProbeOutcome:
        if params.variant != "d2d":
            raise ProbeError(f"membw has one variant, d2d, not {params.variant!r}")
        size = params.size or default_size(params.device, params.suite)
        if size < MIB:
            raise ProbeError(f"membw needs a buffer of at least 1 MiB, not {size} bytes")
        return run_on_device(params, size, self._measure)

    def _measure(self, params: ProbeParams, size: int, deadline: float) -> ProbeOutcome:
        import torch

        device = params.device
        src = random_bytes(size, device, seed=7)
        dst = torch.empty_like(src)
        timing = measure(lambda _: dst.copy_(src), device=device, deadline=deadline)
        passed = same_bytes(src, dst)
        outcome = ProbeOutcome(
            probe=self.name,
            variant=params.variant,
            gpu=None,
            value=2 * size / timing.median / 1e9,
            unit="GB/s",
            duration_seconds=0.0,
            time=0.0,
            params={
                "size_bytes": str(size),
                "counted": "read+write",
                "op": "dst.copy_(src)",
                "memory": "device" if is_cuda(device) else "host (the CPU device)",
                **timing.params(),
            },
            check_passed=passed,
            device=device,
        )
        if not passed:
            outcome.error = "correctness check failed: the copy differs from its source"
        return outcome
