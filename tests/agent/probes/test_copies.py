"""The memory-bandwidth and PCIe kernels on the CPU (PCIe's CPU variant is a labelled host copy)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from agent.probes.kernel import ProbeError, ProbeParams  # noqa: E402
from agent.probes.membw import MembwProbe, random_bytes, same_bytes  # noqa: E402
from agent.probes.pcie import PcieProbe  # noqa: E402

MIB = 1024**2


def test_membw_counts_read_plus_write() -> None:
    outcome = MembwProbe().run(ProbeParams(variant="d2d", device="cpu", budget_seconds=0.3, size=8 * MIB))
    assert outcome.error == ""
    assert 0.1 <= outcome.value <= 2000.0  # GB/s
    assert outcome.unit == "GB/s" and outcome.check_passed is True
    p = outcome.params
    assert (p["size_bytes"], p["counted"]) == (str(8 * MIB), "read+write")
    assert outcome.value == pytest.approx(2 * 8 * MIB / float(p["median_seconds"]) / 1e9, rel=1e-3)
    # The budget sizes the repeats; the margin covers one slow chunk on a loaded 2-core CI machine.
    assert outcome.duration_seconds <= 0.3 + 2.0


def test_pcie_on_the_cpu_is_a_labelled_host_copy() -> None:
    probe = PcieProbe()
    assert probe.variants("cpu") == ["h2h"]
    assert probe.variants("cuda:0") == ["h2d", "d2h"]
    outcome = probe.run(ProbeParams(variant="h2h", device="cpu", budget_seconds=0.3, size=8 * MIB))
    assert outcome.error == ""
    assert 0.1 <= outcome.value <= 1000.0
    assert outcome.check_passed is True
    p = outcome.params
    assert (p["link"], p["pinned"]) == ("none", "false")
    assert "no PCIe link" in p["note"]
    assert outcome.value == pytest.approx(8 * MIB / float(p["median_seconds"]) / 1e9, rel=1e-3)


def test_copies_are_checked_with_random_bytes() -> None:
    a = random_bytes(4 * MIB, "cpu", seed=1)
    assert int((a == 0).sum()) == 0  # never zeros: a copy of zeros proves nothing
    b = a.clone()
    assert same_bytes(a, b)
    for where in (0, 2 * MIB, 4 * MIB - 1):
        c = a.clone()
        c[where] = c[where] % 255 + 1 if c[where] != 255 else 1  # a different non-zero byte
        assert not same_bytes(a, c), where
    assert not same_bytes(a, a[:-1])


@pytest.mark.parametrize(
    ("probe", "variant", "size", "message"),
    [
        (MembwProbe(), "h2d", None, "one variant"),
        (MembwProbe(), "d2d", 1000, "at least 1 MiB"),
        (PcieProbe(), "h2d", None, "not available on cpu"),
    ],
)
def test_bad_requests_say_why(
    probe: MembwProbe | PcieProbe, variant: str, size: int | None, message: str
) -> None:
    with pytest.raises(ProbeError, match=message):
        probe.run(ProbeParams(variant=variant, device="cpu", budget_seconds=0.2, size=size))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["h2d", "d2h"])
def test_cuda_pcie(variant: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    outcome = PcieProbe().run(ProbeParams(variant=variant, device="cuda:0", budget_seconds=1.0))
    assert outcome.error == "" and outcome.check_passed is True
    assert 1.0 < outcome.value < 300.0  # GB/s: gen3 x4 .. gen6 x16
    assert outcome.params["pinned"] == "true"


@pytest.mark.gpu
def test_cuda_membw() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    outcome = MembwProbe().run(ProbeParams(variant="d2d", device="cuda:0", budget_seconds=1.0))
    assert outcome.error == "" and outcome.check_passed is True
    assert 100.0 < outcome.value < 20_000.0
    assert torch.cuda.memory_allocated(0) == 0
