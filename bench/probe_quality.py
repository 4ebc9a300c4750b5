"""How far the GEMM probe's figure can be trusted: it against an independent timing, spread, wall time.

For each GEMM dtype the probe supports on the device, runs the probe (agent.probes.kernel.REGISTRY
["gemm"], as the agent does) once to warm up and then N times, and times the same operation at the
same shape independently: `torch.matmul` (fp8: `torch._scaled_mm`) under triton.testing.do_bench
(median) when triton imports, else torch.utils.benchmark.Timer (median of blocked_autorange).
Prints per dtype: the probe's median TFLOP/s, the independent TFLOP/s, their ratio, the coefficient
of variation over the N runs, and the probe's wall time per run (the warm-up run separately: it pays
the process's one-time CUDA and cuBLAS start-up), with a verdict against each target:

    ratio >= 0.97, CV <= 1%, wall <= 2 s per dtype per GPU (each of the N runs)

    .venv/bin/python bench/probe_quality.py [--device cuda:0|cpu] [--dtypes bf16,fp16]
        [--runs 10] [--budget S] [--json] [--save [DIR]]

Each probe run gets the budget the agent's short suite plans for that dtype (agent.probes.suite:
10 s per GPU shared by every probe) unless --budget says otherwise.

`--device cpu` runs the same path with the probe's small CPU shape: a check of the code, not a
measurement against the targets (verdicts read "n/a (cpu)"). Asserts nothing.

On a GPU, NVML (read-only) samples the SM clock, the board power and the software power-cap
reason while the probe runs and while the independent timing runs, and the report prints them per
phase: a GEMM at the board's power limit runs at the clock the limit allows, and two timings taken
at different clocks differ by that much whatever their method.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from agent.probes.gemm import FP8_FAST_ACCUM
from agent.probes.kernel import ProbeError, ProbeParams
from agent.probes.kernels import REGISTRY, names
from agent.probes.suite import SUITE_BUDGET_SECONDS, plan

TARGET_RATIO = 0.97
TARGET_CV = 0.01
TARGET_WALL_S = 2.0
RESULTS = Path(__file__).resolve().parent / "results"
TORCH_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "tf32": torch.float32,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,
}


@dataclass
class DtypeQuality:
    dtype: str
    shape: tuple[int, int, int]  # m, n, k as the probe reported them
    budget_seconds: float  # handed to each probe run
    probe_tflops: list[float] = field(default_factory=list)  # each measured run
    probe_wall_s: list[float] = field(default_factory=list)
    warmup_wall_s: float = 0.0
    independent_tflops: float = 0.0
    independent_method: str = ""
    ratio: float = 0.0  # median probe figure / independent figure
    cv: float = 0.0  # sample standard deviation / mean of the probe's figures
    verdicts: dict[str, str] = field(default_factory=dict)
    # NVML while each phase ran (empty off a GPU or without NVML): see PhaseClocks
    probe_clocks: dict[str, float] = field(default_factory=dict)
    independent_clocks: dict[str, float] = field(default_factory=dict)


SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
CLOCK_PERIOD_S = 0.02


class PhaseClocks:
    """Samples `read()` -> (SM MHz, board watts, power-capped) every `period` s in a thread while
    open; `summary()` gives the means and the share of samples the power cap was holding the clock.
    """

    def __init__(self, read: Callable[[], tuple[float, float, bool]], period: float = CLOCK_PERIOD_S) -> None:
        self._read, self._period = read, period
        self._samples: list[tuple[float, float, bool]] = []
        self.error = ""  # the read that ended the sampling early, if one did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-quality-clocks", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._samples.append(self._read())
            except Exception as exc:  # noqa: BLE001 - the samples so far stand; the error is said
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self._stop.wait(self._period)

    def __enter__(self) -> PhaseClocks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        if not self._samples:
            return {}
        n = len(self._samples)
        return {
            "sm_mhz": statistics.fmean(s[0] for s in self._samples),
            "watts": statistics.fmean(s[1] for s in self._samples),
            "power_capped_share": sum(1 for s in self._samples if s[2]) / n,
            "samples": float(n),
        }


def nvml_reader(device: str) -> Callable[[], tuple[float, float, bool]] | None:
    """NVML's read of the GPU behind `device` (matched by PCI address), or None: off a GPU, no
    pynvml, or NVML not answering. Reads only; nvmlShutdown is left to the process's end."""
    if not device.startswith("cuda"):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        props = torch.cuda.get_device_properties(torch.device(device))
        pci: list[int] = [getattr(props, f"pci_{part}_id", -1) for part in ("domain", "bus", "device")]
        if -1 in pci:  # a torch without the PCI address: CUDA's order, as CUDA_DEVICE_ORDER leaves it
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.device(device).index or 0)
        else:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId("{:08x}:{:02x}:{:02x}.0".format(*pci))
    except Exception as exc:  # noqa: BLE001 - the clocks are an explanation, not the measurement
        print(f"probe_quality: no NVML clocks ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None

    reasons_of = (
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )

    def read() -> tuple[float, float, bool]:
        mhz = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        watts = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        reasons = reasons_of(handle)
        return mhz, watts, bool(reasons & SW_POWER_CAP)

    return read


@contextlib.contextmanager
def phase_clocks(
    read: Callable[[], tuple[float, float, bool]] | None, into: dict[str, float]
) -> Iterator[None]:
    """Fill `into` with the phase's clock summary (nothing without a reader)."""
    if read is None:
        yield
        return
    with PhaseClocks(read) as clocks:
        yield
    into.update(clocks.summary())
    if clocks.error:
        print(f"probe_quality: NVML clock sampling stopped early ({clocks.error})", file=sys.stderr)


def coefficient_of_variation(values: list[float]) -> float:
    if len(values) < 2:
        raise ValueError("the coefficient of variation needs at least two runs")
    mean = statistics.fmean(values)
    if mean <= 0:
        raise ValueError(f"figures must be positive, got mean {mean}")
    return statistics.stdev(values) / mean


def verdicts(q: DtypeQuality, on_gpu: bool) -> dict[str, str]:
    """within / over against each target; n/a (cpu) off a GPU, where the targets do not apply."""
    if not on_gpu:
        return {"ratio": "n/a (cpu)", "cv": "n/a (cpu)", "wall": "n/a (cpu)"}

    def ok(good: bool) -> str:
        return "within" if good else "over"

    return {
        "ratio": ok(q.ratio >= TARGET_RATIO),
        "cv": ok(q.cv <= TARGET_CV),
        "wall": ok(max(q.probe_wall_s) <= TARGET_WALL_S),
    }


def _probe_runs(
    device: str, dtype: str, runs: int, budget: float, read: Callable[[], tuple[float, float, bool]] | None
) -> DtypeQuality:
    probe = REGISTRY["gemm"]()
    gpus = (torch.device(device).index or 0,) if device.startswith("cuda") else ()
    params = ProbeParams(variant=dtype, device=device, gpus=gpus, suite="short", budget_seconds=budget)
    figures: list[tuple[float, float, dict[str, str]]] = []
    clocks: dict[str, float] = {}

    def one() -> None:
        t0 = time.perf_counter()
        out = probe.run(params)
        figures.append((out.value, time.perf_counter() - t0, out.params))
        if out.error:
            raise ProbeError(f"gemm {dtype} on {device}: {out.error}")
        if out.unit != "TFLOP/s":
            raise ProbeError(f"gemm {dtype} reported {out.unit!r}, expected TFLOP/s")

    one()  # the warm-up run
    with phase_clocks(read, clocks):
        for _ in range(runs):
            one()
    p = figures[0][2]
    q = DtypeQuality(dtype=dtype, shape=(int(p["m"]), int(p["n"]), int(p["k"])), budget_seconds=budget)
    q.probe_clocks = clocks
    q.warmup_wall_s = figures[0][1]
    q.probe_tflops = [v for v, _, _ in figures[1:]]
    q.probe_wall_s = [w for _, w, _ in figures[1:]]
    return q


def _operation(device: str, dtype: str, m: int, n: int, k: int) -> Callable[[], torch.Tensor]:
    """The probe's operation at its shape, built here from torch alone (random data)."""
    dev = torch.device(device)
    if dtype == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.ones((), device=dev)
        return lambda: torch._scaled_mm(
            a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=FP8_FAST_ACCUM
        )
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"no independent measurement for dtype {dtype!r}; known: {', '.join(TORCH_DTYPES)}")
    a = torch.randn(m, k, device=dev, dtype=TORCH_DTYPES[dtype])
    b = torch.randn(k, n, device=dev, dtype=TORCH_DTYPES[dtype])
    return lambda: torch.matmul(a, b)


def _independent(
    device: str,
    dtype: str,
    shape: tuple[int, int, int],
    read: Callable[[], tuple[float, float, bool]] | None = None,
    clocks: dict[str, float] | None = None,
) -> tuple[float, str]:
    m, n, k = shape
    matmul = torch.backends.cuda.matmul
    saved = bool(matmul.allow_tf32)  # the switch the probe uses (PyTorch refuses mixing it with the new one)
    matmul.allow_tf32 = dtype == "tf32"
    try:
        fn = _operation(device, dtype, m, n, k)
        with phase_clocks(read, {} if clocks is None else clocks):
            seconds, method = _time(fn, on_gpu=device.startswith("cuda"))
    finally:
        matmul.allow_tf32 = saved
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return 2.0 * m * n * k / seconds / 1e12, method


def _time(fn: Callable[[], torch.Tensor], on_gpu: bool) -> tuple[float, str]:
    if on_gpu:
        try:
            from triton.testing import do_bench  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            pass
        else:
            ms = float(do_bench(fn, warmup=100, rep=500, return_mode="median"))
            return ms / 1e3, "triton.testing.do_bench"
    from torch.utils.benchmark import Timer

    # Timer defaults to one thread; the probe runs with torch's own thread count.
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    measurement = timer.blocked_autorange(min_run_time=1.0 if on_gpu else 0.3)
    return float(measurement.median), "torch.utils.benchmark.Timer"


def suite_budgets(device: str) -> dict[str, float]:
    """budget_seconds per gemm dtype as the agent's short suite plans it on this device."""
    kernels = {name: REGISTRY[name]() for name in names()}
    steps = plan(
        list(kernels),
        [device],
        lambda probe, dev: kernels[probe].variants(dev),
        {name: k.node_level for name, k in kernels.items()},
        SUITE_BUDGET_SECONDS["short"],
    )
    return {s.variant: s.budget_seconds for s in steps if s.probe == "gemm"}


def measure(device: str, dtypes: list[str] | None, runs: int, budget: float | None) -> dict[str, Any]:
    on_gpu = device.startswith("cuda")
    budgets = suite_budgets(device)
    supported = REGISTRY["gemm"]().variants(device)
    chosen = dtypes or supported
    unknown = [d for d in chosen if d not in supported]
    if unknown:
        raise ValueError(f"gemm on {device} has no {', '.join(unknown)}; it has: {', '.join(supported)}")
    read = nvml_reader(device)
    if on_gpu:  # imported now, not inside the first dtype's clock window (seconds of an idle GPU)
        with contextlib.suppress(ImportError):
            import triton.testing  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    results = []
    for dtype in chosen:
        q = _probe_runs(device, dtype, runs, budget or budgets[dtype], read)
        q.independent_tflops, q.independent_method = _independent(
            device, dtype, q.shape, read, q.independent_clocks
        )
        q.ratio = statistics.median(q.probe_tflops) / q.independent_tflops
        q.cv = coefficient_of_variation(q.probe_tflops)
        q.verdicts = verdicts(q, on_gpu)
        results.append(asdict(q))
    return {
        "device": device,
        "gpu_name": torch.cuda.get_device_name(torch.device(device)) if on_gpu else "",
        "target_measurement": on_gpu,
        "dtypes": results,
    }


def report(run: dict[str, Any]) -> str:
    where = run["gpu_name"] or "cpu: the code path only, not a target measurement"
    lines = [f"{run['device']} ({where})"]
    lines.append(
        f"  {'dtype':<6}{'shape m,n,k':>20}{'probe TF/s':>12}{'indep TF/s':>12}{'ratio':>8}"
        f"{'CV':>8}{'budget s':>10}{'wall s':>8}{'warm-up s':>11}  verdicts (ratio, CV, wall)"
    )
    for q in run["dtypes"]:
        v = q["verdicts"]
        lines.append(
            f"  {q['dtype']:<6}{','.join(map(str, q['shape'])):>20}"
            f"{statistics.median(q['probe_tflops']):>12.2f}{q['independent_tflops']:>12.2f}"
            f"{q['ratio']:>8.3f}{q['cv'] * 100:>7.2f}%{q['budget_seconds']:>10.2f}"
            f"{max(q['probe_wall_s']):>8.2f}"
            f"{q['warmup_wall_s']:>11.2f}  {v['ratio']}, {v['cv']}, {v['wall']}"
        )
    methods = sorted({q["independent_method"] for q in run["dtypes"]})
    lines.append(f"  independent timing: {', '.join(methods)}; wall s: the slowest of the measured runs")
    clocked = [q for q in run["dtypes"] if q.get("probe_clocks") and q.get("independent_clocks")]
    if clocked:
        lines.append(
            "  NVML while each phase ran (mean SM clock, mean board power, share of samples power-capped):"
        )
        lines.append(f"  {'dtype':<6}{'probe':>28}{'independent':>28}{'clock ratio':>13}")
        for q in clocked:
            p, i = q["probe_clocks"], q["independent_clocks"]
            lines.append(
                f"  {q['dtype']:<6}{_clocks_cell(p):>28}{_clocks_cell(i):>28}"
                f"{p['sm_mhz'] / i['sm_mhz']:>13.3f}"
            )
        lines.append("  clock ratio: probe's mean SM clock / the independent timing's (compare with ratio)")
    return "\n".join(lines)


def _clocks_cell(c: dict[str, float]) -> str:
    return f"{c['sm_mhz']:.0f} MHz {c['watts']:.0f} W {c['power_capped_share'] * 100:.0f}%"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="cuda:N (default cuda:0) or cpu")
    parser.add_argument("--dtypes", help="comma-separated, e.g. bf16,fp16 (default: all the probe has)")
    parser.add_argument("--runs", type=int, default=10, help="measured runs per dtype, after one warm-up")
    parser.add_argument(
        "--budget",
        type=float,
        help="budget_seconds per probe run (default: what the short suite gives each gemm dtype)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument(
        "--save",
        nargs="?",
        const=str(RESULTS),
        metavar="DIR",
        help=f"also write the JSON to DIR/<date>_<gpu>_probe_quality.json (default DIR: {RESULTS})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.runs < 2 or (args.budget is not None and args.budget <= 0):
        print("probe_quality: need --runs >= 2 and --budget > 0", file=sys.stderr)
        return 2
    if args.device != "cpu" and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        print(f"probe_quality: no device {args.device!r} here (try --device cpu)", file=sys.stderr)
        return 2
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else None
    try:
        run = measure(args.device, dtypes, args.runs, args.budget)
    except (ProbeError, ValueError) as exc:
        print(f"probe_quality: {exc}", file=sys.stderr)
        return 1
    date = datetime.now(UTC).isoformat(timespec="seconds")
    document: dict[str, Any] = {
        "bench": "probe_quality",
        "date": date,
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "targets": {"ratio_min": TARGET_RATIO, "cv_max": TARGET_CV, "wall_max_s": TARGET_WALL_S},
        "runs": args.runs,
        "budget_seconds": args.budget,  # None: the short suite's budget per dtype (in each dtype's figures)
        "run": run,
    }
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False)
    if args.json:
        print(text)
    else:
        print(f"probe_quality on {document['host']}, torch {document['torch']}, {date}")
        print(report(run))
    if args.save:
        slug = re.sub(r"[^a-z0-9]+", "-", run["gpu_name"].lower()).strip("-") or "cpu"
        path = Path(args.save) / f"{date[:10]}_{slug}_probe_quality.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        print(f"saved {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
