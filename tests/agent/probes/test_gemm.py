"""The GEMM kernel on the CPU: plausible figures, the correctness check, the budget; CUDA under `gpu`."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from agent.probes.gemm import BANDS, GemmProbe, check, relative_error  # noqa: E402
from agent.probes.kernel import ProbeError, ProbeParams  # noqa: E402

SIZE = 256  # small: each CPU call takes a millisecond or so


def params(variant: str, *, device: str = "cpu", budget: float = 0.3, size: int = SIZE) -> ProbeParams:
    return ProbeParams(variant=variant, device=device, budget_seconds=budget, size=size)


def product(variant: str, rows: int = 64, k: int = 512) -> tuple[Any, Any]:
    """A (result, float64 reference) pair computed as the kernel does, in `variant`'s dtype."""
    dtype = torch.bfloat16 if variant == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(rows, k, dtype=dtype, generator=generator)
    b = torch.randn(k, rows, dtype=dtype, generator=generator)
    return a @ b, a.double() @ b.double()


def test_cpu_variants_are_honest() -> None:
    assert GemmProbe().variants("cpu") == ["fp32", "bf16"]  # no TF32, no FP8, no slow fp16 on a CPU


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
def test_cpu_gemm_gives_a_plausible_checked_figure(variant: str) -> None:
    outcome = GemmProbe().run(params(variant))
    assert outcome.error == ""
    assert 1e-3 <= outcome.value <= 10.0  # 1 GFLOP/s .. 10 TFLOP/s
    assert outcome.unit == "TFLOP/s"
    assert outcome.check_passed is True
    assert outcome.check_relative_error is not None
    assert 0 <= outcome.check_relative_error <= BANDS[variant]
    assert outcome.device == "cpu"
    p = outcome.params
    assert (p["m"], p["n"], p["k"]) == (str(SIZE),) * 3
    assert int(p["repeats"]) >= 5 and int(p["warmup_calls"]) >= 3
    assert p["timer"] == "perf_counter" and int(p["input_sets"]) >= 3
    # the figure is the median call's: 2 m n k flops over its time
    assert outcome.value == pytest.approx(2 * SIZE**3 / float(p["median_seconds"]) / 1e12, rel=1e-3)
    assert outcome.time > 0 and outcome.duration_seconds > 0


def test_the_check_passes_a_correct_product_and_catches_a_corrupted_one() -> None:
    for variant in ("fp32", "bf16"):
        result, reference = product(variant)
        passed, error = check(result, reference, variant)
        assert passed and error is not None and error < BANDS[variant]
        bad = result.clone()
        bad[3, 5] += 1000.0  # one wrong element
        passed, error = check(bad, reference, variant)
        assert not passed and error is not None and error > BANDS[variant]


def test_the_check_fails_nan_and_inf() -> None:
    result, reference = product("fp32")
    for poison in (math.nan, math.inf):
        bad = result.clone()
        bad[0, 0] = poison
        assert math.isnan(relative_error(bad, reference))
        assert check(bad, reference, "fp32") == (False, None)


def test_the_fp32_band_catches_what_bf16_rounding_would_do() -> None:
    result, reference = product("fp32")
    rounded = result.to(torch.bfloat16).to(torch.float32)  # a kernel that silently ran in bf16
    assert check(rounded, reference, "bf16")[0]
    assert not check(rounded, reference, "fp32")[0]


def test_a_corrupted_result_fails_the_run_with_the_figure_kept() -> None:
    def corrupt(result: Any) -> None:
        result[0, 0] = float("nan")

    outcome = GemmProbe(corrupt=corrupt).run(params("fp32"))
    assert outcome.check_passed is False
    assert outcome.check_relative_error is None
    assert outcome.error.startswith("correctness check failed: NaN or Inf")
    assert outcome.value > 0

    def off(result: Any) -> None:
        result.mul_(1.05)  # 5% wrong everywhere

    outcome = GemmProbe(corrupt=off).run(params("bf16"))
    assert outcome.check_passed is False
    assert outcome.check_relative_error == pytest.approx(0.05, rel=0.1)
    assert "relative error" in outcome.error and "bf16 band" in outcome.error


def test_the_run_keeps_to_its_budget() -> None:
    # Generous bounds: a shared CI machine stalls now and then; the deadline logic itself is
    # tested with predictable calls in test_timing.py.
    outcome = GemmProbe().run(params("fp32", budget=0.5))
    assert outcome.duration_seconds <= 0.5 + 2.0
    assert int(outcome.params["repeats"]) >= 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variant": "fp8"}, "not available on cpu"),
        ({"variant": "fp32", "size": 100}, "multiple of 16"),
        ({"variant": "fp32", "device": "gpu0"}, "device must be"),
    ],
)
def test_bad_requests_say_why(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ProbeError, match=message):
        GemmProbe().run(params(**kwargs))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["bf16", "fp16", "tf32", "fp8"])
def test_cuda_gemm(variant: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    probe = GemmProbe()
    if variant not in probe.variants("cuda:0"):
        pytest.skip(f"{variant} is not supported by {torch.cuda.get_device_name(0)}")
    outcome = probe.run(ProbeParams(variant=variant, device="cuda:0", budget_seconds=1.5))
    assert outcome.error == "", outcome.error
    assert outcome.check_passed is True
    assert outcome.params["timer"] == "cuda_events"
    assert 1.0 < outcome.value < 10_000.0  # TFLOP/s
    assert outcome.duration_seconds < 1.5 * 1.5
    assert not torch.backends.cuda.matmul.allow_tf32  # restored after the tf32 run
    assert torch.cuda.memory_allocated(0) == 0  # everything freed
