"""GEMM probe: dense matrix-multiply throughput in TFLOP/s, checked against a float64 reference.

Variants: bf16, fp16 and tf32 through `torch.matmul`, fp8 (e4m3 inputs, bf16 output) through
`torch._scaled_mm` where the GPU has FP8 tensor cores (compute capability 8.9 and later). The CPU
has no TF32 and its fp16 matmul is a slow fallback, so on the CPU the variants are fp32 and bf16.

A run fills the chip (8192^3 on a datacenter GPU, 4096^3 under 16 GiB), rotates three sets of
random inputs so that no call finds its operands in cache, warms up, times each call (CUDA events on
a GPU) and reports the median. Then one more product is checked on a slice against float64: a
relative error outside the dtype's band, or a NaN, fails the run (`check_passed` false, `error` says
why) while the figure is still reported.

CPUs differ by orders of magnitude (a bf16 matmul without AVX512-BF16 or AMX runs ~100x slower than
fp32), so on the CPU the shape is sized to the CPU it runs on: a warm-up times calls at 128^3 and
doubles the shape while the next one's call (8x the work) still fits about TARGET_CALLS times into
the run's budget, up to 1024^3 (2048^3 for the full suite). A half-precision dtype the CPU has no
instructions for (per /proc/cpuinfo: avx512_bf16/amx_bf16, avx512_fp16/amx_fp16, arm64's bf16/fphp)
is emulated in software: it runs at most a 256^3 shape, and the result says so (`params["emulated"]`).
`params["sized_by"]` records the warm-up that chose the shape.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import ProbeError, ProbeParams, register
from agent.probes.timing import is_cuda, measure, run_on_device, total_memory_bytes

GIB = 1024**3
INPUT_SETS = 3
CHECK_SLICE = 128  # rows and columns of the result checked against float64
FP8_FAST_ACCUM = True  # cuBLAS's full-rate FP8 path (what inference uses); its error fits the fp8 band
CHECK_RESERVE_SHARE = 0.05  # of the budget, kept for the check

# CPU sizing (see the module's docstring).
CPU_FIRST_SIZE = 128  # the warm-up's first shape, m = n = k
CPU_MIN_SIZE = 32  # a CPU too slow (or too loaded) for even this runs it anyway
SIZING_CALLS = 2  # timed calls per warm-up shape (after an untimed one); the fastest counts
TARGET_CALLS = 30  # the shape's call must fit this many times into the budget (warm-up, repeats, check)
EMULATED_MAX_SIZE = 256  # a dtype without native instructions: a tiny shape, not tens of seconds
CPUINFO = Path("/proc/cpuinfo")
# Feature flags that give the CPU native arithmetic in a dtype: x86 (`flags`) and arm64 (`Features`).
NATIVE_FLAGS = {
    "bf16": ("avx512_bf16", "amx_bf16", "bf16"),
    "fp16": ("avx512_fp16", "amx_fp16", "fphp"),
}

# Relative Frobenius error of the checked slice against float64 from the same (rounded) inputs:
# about the output's rounding (bf16: 2^-8 / sqrt(3) ~ 0.0023; fp16: ~0.0003), TF32's input rounding
# (~0.0005), fp32 accumulation; fp8 adds the tensor cores' reduced-precision accumulation. Each band
# leaves several times the expected error, so a wrong result (a bad element, a NaN) stands out.
BANDS = {"bf16": 1e-2, "fp16": 2e-3, "tf32": 5e-3, "fp32": 1e-4, "fp8": 3e-2}

_PRECISION_LOCK = threading.Lock()
_tf32_users = 0
_tf32_saved = False


def default_size(device: str, suite: str) -> int:
    """m = n = k: big enough to fill the chip, small enough for its memory (on the CPU: the most a
    run may size itself to, see `fit_cpu_size`)."""
    if not is_cuda(device):
        return 2048 if suite == "full" else 1024
    memory = total_memory_bytes(device) or 0
    return 8192 if memory >= 16 * GIB else 4096


def cpu_flags(path: Path = CPUINFO) -> frozenset[str] | None:
    """The CPU's feature flags (x86 `flags`, arm64 `Features` lines); None where unreadable."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return frozenset(flags) if flags else None


def native_on_cpu(variant: str, flags: frozenset[str] | None) -> bool | None:
    """Whether the CPU has instructions for `variant`'s arithmetic: fp32 always; bf16 and fp16 as
    its flags say (None: the flags are unknown)."""
    wanted = NATIVE_FLAGS.get(variant)
    if wanted is None:
        return True
    if flags is None:
        return None
    return any(flag in flags for flag in wanted)


def cpu_dtype_notes(variant: str) -> dict[str, str]:
    """What a CPU result says about the CPU: torch's vector capability, and for a half-precision
    dtype whether the CPU has instructions for it (`emulated` when it has none)."""
    import torch

    notes = {"cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
    native = native_on_cpu(variant, cpu_flags())
    if native is False:
        flags = ", ".join(NATIVE_FLAGS[variant])
        notes["emulated"] = (
            f"no native {variant} on this CPU (none of the flags {flags}): emulated in software, "
            f"far slower than on a CPU with them; the shape is {EMULATED_MAX_SIZE}^3 at most unless set"
        )
    elif native is None:
        notes["native"] = f"unknown: no CPU flags to read ({CPUINFO})"
    return notes


def fit_cpu_size(time_call: Callable[[int], float], target_seconds: float, cap: int) -> tuple[int, float]:
    """(m = n = k, seconds of one call there): the largest shape from CPU_FIRST_SIZE doubling up to
    `cap` whose call takes at most `target_seconds`, estimated from the warm-up's calls.

    `time_call(size)` runs one call at `size` and returns its seconds. A step up is taken when the
    current call times 8 (the work of the doubled shape) still fits the target; a step that then
    takes longer than the target is undone. A CPU too slow for the first shape halves it down to
    CPU_MIN_SIZE (and runs that, whatever it takes).
    """
    size = max(CPU_MIN_SIZE, min(CPU_FIRST_SIZE, cap))
    seconds = time_call(size)
    while seconds > target_seconds and size // 2 >= CPU_MIN_SIZE:
        size //= 2
        seconds = time_call(size)
    while size * 2 <= cap and seconds * 8 <= target_seconds:
        smaller, before = size, seconds
        size *= 2
        seconds = time_call(size)
        if seconds > target_seconds:
            return smaller, before
    return size, seconds


def relative_error(result: Any, reference: Any) -> float:
    """||result - reference|| / ||reference|| in float64 (Frobenius); NaN when either holds NaN or Inf."""
    import torch

    got = result.to(torch.float64)
    want = reference.to(torch.float64)
    if not bool(torch.isfinite(got).all()) or not bool(torch.isfinite(want).all()):
        return math.nan
    scale = float(torch.linalg.vector_norm(want))
    if scale == 0.0:
        raise ProbeError("the reference is all zeros: the inputs were not random")
    return float(torch.linalg.vector_norm(got - want)) / scale


def check(result: Any, reference: Any, variant: str) -> tuple[bool, float | None]:
    """(passed, relative error) of `result` against the float64 `reference`; NaN fails, error None."""
    if variant not in BANDS:
        raise ProbeError(f"no error band for gemm variant {variant!r}")
    error = relative_error(result, reference)
    if not math.isfinite(error):
        return False, None
    return error <= BANDS[variant], error


@register
class GemmProbe:
    """`corrupt`, if given, is called on the checked slice of the result before the check (tests)."""

    name = "gemm"
    node_level = False
    unit = "TFLOP/s"
    higher_is_better = True
    gpu_variants = ("bf16", "fp16", "tf32", "fp8")  # fp8 from compute capability 8.9; the CPU: fp32, bf16
    concurrent = True  # every selected GPU at once, as production load: shared power and thermal limits show
    description = "dense matrix-multiply throughput (tensor cores), checked against float64"
    budget_share = 0.15  # of the suite's budget per GPU, per variant

    def __init__(self, corrupt: Callable[[Any], None] | None = None) -> None:
        self.corrupt = corrupt

    def variants(self, device: str) -> list[str]:
        import torch

        if not is_cuda(device):
            return ["fp32", "bf16"]
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        out = ["bf16", "fp16", "tf32"] if major >= 8 else ["fp16"]
        if (major, minor) >= (8, 9) and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
            out.append("fp8")
        return out

    def run(self, params: ProbeParams) -> ProbeOutcome:
        supported = self.variants(params.device)
        if params.variant not in supported:
            raise ProbeError(
                f"gemm {params.variant} is not available on {params.device} (it has {', '.join(supported)})"
            )
        if params.size is None and not is_cuda(params.device):
            return run_on_device(params, default_size(params.device, params.suite), self._measure_cpu)
        size = params.size or default_size(params.device, params.suite)
        if size < 16 or size % 16:
            raise ProbeError(f"gemm size must be a positive multiple of 16 (fp8 needs it), not {size}")
        return run_on_device(params, size, self._measure, _tf32(params.variant == "tf32"))

    def _measure_cpu(self, params: ProbeParams, cap: int, deadline: float) -> ProbeOutcome:
        """Size the shape to this CPU (and its dtype support) within the run's time, then measure."""
        variant = params.variant
        if native_on_cpu(variant, cpu_flags()) is False:
            cap = min(cap, EMULATED_MAX_SIZE)
        multiply = _multiplier(variant, params.device)

        def time_call(size: int) -> float:
            a, b = _inputs(variant, size, params.device, seed=0)
            multiply(a, b)  # the first call at a shape pays for its set-up
            seconds = []
            for _ in range(SIZING_CALLS):
                t0 = time.perf_counter()
                multiply(a, b)
                seconds.append(time.perf_counter() - t0)
            return min(seconds)  # the CPU's pace, not a moment another process took it

        left = max(0.0, deadline - time.perf_counter())
        target = left * (1.0 - CHECK_RESERVE_SHARE) / TARGET_CALLS
        size, seconds = fit_cpu_size(time_call, target, cap)
        outcome = self._measure(params, size, deadline)
        outcome.params["sized_by"] = (
            f"warm-up: a {size}^3 call took {seconds:.3g} s, about {TARGET_CALLS} of which fit the "
            f"{params.budget_seconds:.3g} s budget (largest shape allowed {cap}^3)"
        )
        return outcome

    def _measure(self, params: ProbeParams, size: int, deadline: float) -> ProbeOutcome:
        import torch

        device, variant = params.device, params.variant
        sets = [_inputs(variant, size, device, seed) for seed in range(INPUT_SETS)]
        multiply = _multiplier(variant, device)

        def call(i: int) -> Any:
            a, b = sets[i % INPUT_SETS]
            return multiply(a, b)

        timing = measure(
            call,
            device=device,
            deadline=deadline,
            reserve_seconds=CHECK_RESERVE_SHARE * params.budget_seconds,
        )
        a, b = sets[0]
        rows = min(CHECK_SLICE, size)
        result = call(0)[:rows, :rows]
        if self.corrupt is not None:
            self.corrupt(result)
        wide = torch.float64
        reference = a[:rows].to(torch.float32).to(wide) @ b[:, :rows].to(torch.float32).to(wide)
        passed, error = check(result, reference, variant)
        tflops = 2.0 * size**3 / timing.median / 1e12
        outcome = ProbeOutcome(
            probe=self.name,
            variant=variant,
            gpu=None,
            value=tflops,
            unit="TFLOP/s",
            duration_seconds=0.0,
            time=0.0,
            params={
                "m": str(size),
                "n": str(size),
                "k": str(size),
                "dtype": _DTYPE_NAMES[variant],
                "input_sets": str(INPUT_SETS),
                "check_slice": f"{rows}x{rows}",
                "check_band": f"{BANDS[variant]:g}",
                **_variant_notes(variant, device),
                **({} if is_cuda(device) else cpu_dtype_notes(variant)),
                **timing.params(),
            },
            check_passed=passed,
            check_relative_error=error,
            device=device,
        )
        if not passed:
            found = "NaN or Inf in the result" if error is None else f"relative error {error:.3g}"
            outcome.error = (
                f"correctness check failed: {found} on a {rows}x{rows} slice against float64 "
                f"(the {variant} band is {BANDS[variant]:g})"
            )
        return outcome


_DTYPE_NAMES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "tf32": "float32 (TF32 tensor cores)",
    "fp32": "float32",
    "fp8": "float8_e4m3fn inputs, bfloat16 output",
}


def _variant_notes(variant: str, device: str) -> dict[str, str]:
    if variant == "fp8":
        return {"op": "torch._scaled_mm", "fast_accum": str(FP8_FAST_ACCUM).lower()}
    if variant == "fp32" and not is_cuda(device):
        return {"op": "torch.matmul", "note": "the CPU has no TF32: fp32 in its place"}
    return {"op": "torch.matmul"}


def _inputs(variant: str, size: int, device: str, seed: int) -> tuple[Any, Any]:
    """One random (a, b) pair: normal values (never zeros); fp8's b is column-major, as cuBLAS wants."""
    import torch

    generator = torch.Generator(device=device).manual_seed(1000 + seed)

    def normal(rows: int, cols: int, dtype: Any) -> Any:
        return torch.randn(rows, cols, device=device, dtype=dtype, generator=generator)

    if variant == "fp8":
        a = normal(size, size, torch.float32).to(torch.float8_e4m3fn)
        b = normal(size, size, torch.float32).to(torch.float8_e4m3fn).t()
        return a, b
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(variant, torch.float32)
    return normal(size, size, dtype), normal(size, size, dtype)


def _multiplier(variant: str, device: str) -> Callable[[Any, Any], Any]:
    import torch

    if variant != "fp8":
        return torch.matmul
    one = torch.ones((), device=device, dtype=torch.float32)

    def scaled(a: Any, b: Any) -> Any:
        out = torch._scaled_mm(
            a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=FP8_FAST_ACCUM
        )
        return out[0] if isinstance(out, tuple) else out  # older releases also returned amax

    return scaled


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """Allow TF32 in cuBLAS matmuls while any tf32 run is in progress, then restore the setting.

    A setting of this process only (no GPU setting changes); concurrent runs on several GPUs share it.
    """
    global _tf32_users, _tf32_saved  # noqa: PLW0603 - one process-wide setting, counted under a lock
    if not enabled:
        yield
        return
    import torch

    matmul = torch.backends.cuda.matmul
    with _PRECISION_LOCK:
        try:
            if _tf32_users == 0:
                _tf32_saved = bool(matmul.allow_tf32)
                matmul.allow_tf32 = True
        except RuntimeError as exc:  # PyTorch refuses to mix its legacy and new precision settings
            raise ProbeError(f"cannot enable TF32 in this process: {exc}") from exc
        _tf32_users += 1
    try:
        yield
    finally:
        with _PRECISION_LOCK:
            _tf32_users -= 1
            if _tf32_users == 0:
                matmul.allow_tf32 = _tf32_saved
