"""The GEMM kernel on the CPU: plausible figures, the correctness check, the budget; CUDA under `gpu`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from agent.probes import gemm  # noqa: E402
from agent.probes.gemm import (  # noqa: E402
    BANDS,
    EMULATED_MAX_SIZE,
    GemmProbe,
    check,
    cpu_flags,
    fit_cpu_size,
    native_on_cpu,
    relative_error,
)
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


def plausible_low(variant: str) -> float:
    """TFLOP/s: 1 GFLOP/s, or 10 MFLOP/s for a dtype this CPU emulates (a 2-core AVX2 machine does
    bf16 at ~1 GFLOP/s idle, less when loaded)."""
    return 1e-5 if native_on_cpu(variant, cpu_flags()) is False else 1e-3


def test_cpu_variants_are_honest() -> None:
    assert GemmProbe().variants("cpu") == ["fp32", "bf16"]  # no TF32, no FP8, no slow fp16 on a CPU


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
def test_cpu_gemm_gives_a_plausible_checked_figure(variant: str) -> None:
    outcome = GemmProbe().run(params(variant))
    assert outcome.error == ""
    assert plausible_low(variant) <= outcome.value <= 10.0
    assert outcome.unit == "TFLOP/s"
    assert outcome.check_passed is True
    assert outcome.check_relative_error is not None
    assert 0 <= outcome.check_relative_error <= BANDS[variant]
    assert outcome.device == "cpu"
    p = outcome.params
    assert (p["m"], p["n"], p["k"]) == (str(SIZE),) * 3
    assert int(p["repeats"]) >= 5 and int(p["warmup_calls"]) >= 3
    assert p["timer"] == "perf_counter" and int(p["input_sets"]) >= 3
    assert p["cpu_capability"] and "sized_by" not in p  # the size was given
    assert ("emulated" in p) == (native_on_cpu(variant, cpu_flags()) is False)
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


X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16

processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes fphp asimdhp bf16 sve
CPU implementer\t: 0x41
"""


def test_cpu_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text(X86_CPUINFO)
    arm.write_text(ARM_CPUINFO)
    x86_flags = {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
    assert cpu_flags(x86) == frozenset(x86_flags)
    assert {"bf16", "fphp", "sve"} <= (cpu_flags(arm) or set())
    assert cpu_flags(tmp_path / "missing") is None
    (tmp_path / "empty").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "empty") is None  # no flags line: unknown, not "has none"


def test_native_dtypes_follow_the_flags() -> None:
    avx2 = frozenset({"sse2", "avx", "avx2", "fma"})  # e.g. an AMD EPYC or a Skylake client
    assert native_on_cpu("fp32", avx2) is True
    assert native_on_cpu("bf16", avx2) is False
    assert native_on_cpu("fp16", avx2) is False
    assert native_on_cpu("bf16", avx2 | {"avx512_bf16"}) is True  # Cooper Lake, Zen 4
    assert native_on_cpu("bf16", avx2 | {"amx_bf16"}) is True  # Sapphire Rapids
    assert native_on_cpu("fp16", avx2 | {"avx512_fp16"}) is True
    assert native_on_cpu("bf16", frozenset({"asimd", "bf16"})) is True  # arm64 FEAT_BF16
    assert native_on_cpu("bf16", None) is None
    assert native_on_cpu("fp32", None) is True


def cubic(seconds_at_1024: float, calls: list[int]) -> Any:
    """A fake warm-up call whose time grows with the shape's work (n^3); records the sizes tried."""

    def time_call(size: int) -> float:
        calls.append(size)
        return seconds_at_1024 * (size / 1024) ** 3

    return time_call


def test_the_cpu_shape_is_the_largest_that_fits_the_target() -> None:
    tried: list[int] = []
    # fp32 on a small x86 (16 ms at 1024^3): the whole 1024^3 fits a 50 ms call target.
    size, seconds = fit_cpu_size(cubic(0.016, tried), 0.05, 1024)
    assert size == 1024 and seconds == pytest.approx(0.016)
    assert tried == [128, 256, 512, 1024]
    # The same CPU under the full suite's cap, but a target that 2048^3 (8 x 16 ms) would overrun.
    assert fit_cpu_size(cubic(0.016, []), 0.05, 2048)[0] == 1024
    # Emulated bf16 (2.4 s at 1024^3): 256^3 (38 ms) fits a 50 ms target, 512^3 would not be tried.
    tried = []
    assert fit_cpu_size(cubic(2.4, tried), 0.05, 1024)[0] == 256
    assert tried == [128, 256]
    # A CPU too slow for the first shape halves it, down to the smallest.
    tried = []
    assert fit_cpu_size(cubic(2000.0, tried), 0.05, 1024)[0] == 32
    assert tried == [128, 64, 32]
    # The cap wins over a fast CPU.
    assert fit_cpu_size(cubic(1e-6, []), 10.0, 256)[0] == 256


def test_a_step_up_that_overruns_the_target_is_undone() -> None:
    times = {128: 0.001, 256: 0.2}  # a cache cliff: 256^3 is 200x slower, not 8x

    assert fit_cpu_size(lambda size: times[size], 0.05, 1024) == (128, 0.001)


def test_a_cpu_without_native_bf16_runs_a_tiny_shape_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm, "cpu_flags", lambda: frozenset({"sse2", "avx2"}))
    outcome = GemmProbe().run(ProbeParams(variant="bf16", device="cpu", budget_seconds=1.0))
    assert outcome.error == "" and outcome.check_passed is True
    p = outcome.params
    assert p["emulated"].startswith("no native bf16 on this CPU")
    assert int(p["m"]) <= EMULATED_MAX_SIZE and int(p["m"]) % 16 == 0
    assert "warm-up" in p["sized_by"] and p["cpu_capability"]
    assert int(p["repeats"]) >= 5
    # Generous bound for a loaded machine: before sizing, this took ~20 s on a 2-core AVX2 box.
    assert outcome.duration_seconds <= 1.0 + 2.0


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
def test_the_default_cpu_shape_is_sized_to_the_budget(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The flags claim native bf16 whatever this CPU has: the warm-up's timing, not the flags, keeps
    # the run within its budget (no "emulated" note, a shape up to the suite's 1024^3).
    monkeypatch.setattr(gemm, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16", "amx_bf16"}))
    outcome = GemmProbe().run(ProbeParams(variant=variant, device="cpu", budget_seconds=0.6))
    assert outcome.error == "" and outcome.check_passed is True
    p = outcome.params
    assert "emulated" not in p and "sized_by" in p
    assert 32 <= int(p["m"]) <= 1024 and int(p["m"]) % 16 == 0
    assert p["m"] == p["n"] == p["k"]
    assert int(p["repeats"]) >= 5
    assert outcome.duration_seconds <= 0.6 + 2.0  # slack for a loaded machine


def test_unknown_cpu_flags_are_said_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm, "cpu_flags", lambda: None)
    outcome = GemmProbe().run(ProbeParams(variant="bf16", device="cpu", budget_seconds=0.3))
    assert outcome.error == ""
    assert outcome.params["native"].startswith("unknown") and "emulated" not in outcome.params


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
