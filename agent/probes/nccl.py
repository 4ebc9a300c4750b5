"""The all-reduce probe: bus bandwidth across the node's GPUs (NCCL), or two CPU ranks (gloo).

One process per rank (`python -m agent.probes.nccl_worker`, see there), because that is how
training jobs use NCCL and because a process is the one thing that can be killed cleanly: each rank
runs in its own session, and a rank that fails or hangs takes every rank down with it, within the
run's time limit, leaving no process and no GPU memory behind.

Figures follow nccl-tests (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
algbw = bytes / time, busbw = algbw x 2(n-1)/n for all-reduce; float32 sum, in place; the time of
a size is the mean over ranks of each rank's mean per op (nccl-tests' default `-a 1`). The
outcome's value is the bus bandwidth at the largest size, GB/s (1e9 bytes/s). After the timed runs
every rank all-reduces known random data and compares the sum with float64; a sum outside the band
(or a NaN) leaves the figure in the outcome with `check_passed` false and `error` saying why, as gemm
does. `duration_seconds` is the whole run's wall time, rank start-up included; `params`'
`measure_seconds` is the time the ranks spent measuring.

A one-rank all-reduce moves no data over any link (busbw = 0 by definition), so the probe refuses
fewer than two ranks (`min_ranks`) rather than report a figure that reads as a dead fabric.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import ProbeError, ProbeParams, register

MIB = 1 << 20
GIB = 1 << 30
# nccl-tests-style sweeps. GPU: 8 MiB..1 GiB; the short suite keeps three points of it.
CUDA_SIZES = {"short": (8 * MIB, 128 * MIB, GIB), "full": tuple(8 * MIB << i for i in range(8))}
# CPU (gloo over loopback on a small CI machine): the same code path at sizes that take seconds.
CPU_SIZES = {"short": (MIB, 4 * MIB, 8 * MIB), "full": tuple(MIB << i for i in range(7))}
MAX_ITERS = {"short": 20, "full": 50}  # nccl-tests runs 20 by default
CPU_RANKS = 2
WORKER_MODULE = "agent.probes.nccl_worker"
_ROOT = Path(__file__).resolve().parents[2]  # so the ranks import this same tree

ELEMENT_BYTES = 4  # float32, nccl-tests' default data type
CHECK_SEED = 0x6A17  # rank r's check data is torch.rand seeded CHECK_SEED + r
CHECK_BAND = 1e-5  # float32 sums of a few values in [0, 1): ~1e-7 relative error; 1e-5 leaves room
ESTIMATE_OPS = 2  # timed warm-up ops whose time sizes the timed loop
MIN_ITERS = 2
POLL_SECONDS = 0.02
SETTLE_SECONDS = 2.0  # after a rank fails, how long its peers get to exit (and say why) before the kill
TAIL_LIMIT = 600
SECONDARY_LIMIT = 160  # characters of each further failed rank's error in the message
# A rank's error that says only that a peer went away: gloo's and NCCL's words for it.
PEER_GONE = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "ncclremoteerror",
)


def failure_record_path(out: str | Path) -> Path:
    """Where a rank writes its failure record, beside its result (`--out`)."""
    return Path(f"{out}.error")


def failure_record(rank: int, exc: BaseException, at: float) -> dict[str, Any]:
    """What a failed rank says about itself: its error, whether that error only says a peer went
    away, and `at`, time.monotonic() when it caught it (one clock for every process of the host)."""
    error = f"{type(exc).__name__}: {exc}"
    peer = any(words in error.lower() for words in PEER_GONE)
    return {"rank": rank, "error": error, "peer": peer, "at": at}


def _read_record(out: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(failure_record_path(out).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def max_safe_iterations(world_size: int) -> int:
    """In-place sums grow the buffer n-fold per op: stay well inside float32's 2^128 range."""
    return max(MIN_ITERS, int(100 / math.log2(max(2, world_size))))


def plan_iterations(estimate_s: float, allowance_s: float, max_iters: int) -> int:
    """Timed iterations that fit `allowance_s` at `estimate_s` per op, within [0, max_iters]."""
    if estimate_s <= 0:
        return max_iters
    return max(0, min(max_iters, int(allowance_s / estimate_s)))


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth: bytes of the message per second, in GB/s (1e9)."""
    if seconds <= 0 or size_bytes <= 0:
        raise ValueError(f"need a positive size and time, got {size_bytes} B in {seconds} s")
    return size_bytes / seconds / 1e9


def busbw_gbps(algbw: float, ranks: int) -> float:
    """Bus bandwidth of an all-reduce: algbw x 2(n-1)/n (nccl-tests, doc/PERFORMANCE.md).

    Each rank sends and receives 2(n-1)/n of the message in a ring; the factor makes the figure
    comparable with the hardware's link bandwidth whatever the rank count.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    return algbw * 2 * (ranks - 1) / ranks


@dataclass(frozen=True, slots=True)
class SizeFigures:
    size_bytes: int
    seconds: float  # mean over ranks of each rank's mean time per op
    iterations: int
    algbw_gbps: float
    busbw_gbps: float


def summarise(ranks: Sequence[dict[str, Any]]) -> list[SizeFigures]:
    """Per-size figures from every rank's worker result, in ascending size order."""
    n = len(ranks)
    first = ranks[0]
    sizes, iters = first["sizes_bytes"], first["iterations"]
    for r in ranks[1:]:
        if r["sizes_bytes"] != sizes or r["iterations"] != iters:
            raise ProbeError(f"nccl: ranks disagree on what they ran ({r['rank']} vs {first['rank']})")
    figures = []
    for i, size in enumerate(sizes):
        seconds = sum(float(r["seconds_per_op"][i]) for r in ranks) / n
        alg = algbw_gbps(size, seconds)
        figures.append(SizeFigures(size, seconds, iters[i], alg, busbw_gbps(alg, n)))
    return sorted(figures, key=lambda f: f.size_bytes)


@register
class NcclProbe:
    """All-reduce bus bandwidth; node-level (one result per node), concurrent across the GPUs."""

    name = "nccl"
    node_level = True
    unit = "GB/s"
    higher_is_better = True
    gpu_variants = ("all_reduce",)
    concurrent = True
    description = "NCCL all-reduce bus bandwidth across the node's GPUs"
    budget_share = 0.15  # of the suite's budget per GPU, per variant

    def __init__(
        self,
        *,
        min_ranks: int = 2,
        startup_seconds: float | None = None,
        check_bytes: int = 4 * MIB,
        sizes: Sequence[int] | None = None,
        inject_fault: str = "",
    ) -> None:
        """`startup_seconds`: time allowed for process start, torch import and communicator set-up
        on top of the measurement budget (default 60 s with CUDA, 30 s on CPU). `sizes` overrides
        the suite's message sizes (a run's `params.size` overrides both with one size).
        `inject_fault` ("fail:R", "linger:R", "hang:R", "corrupt:R") is a test hook; "linger" fails
        like "fail" but exits seconds after closing its connections, after the peers it took down."""
        if min_ranks < 1:
            raise ValueError(f"min_ranks must be at least 1, got {min_ranks}")
        if sizes is not None and (not sizes or any(s < ELEMENT_BYTES or s % ELEMENT_BYTES for s in sizes)):
            raise ValueError(f"sizes must be positive multiples of {ELEMENT_BYTES} bytes, got {list(sizes)}")
        self.min_ranks = min_ranks
        self.startup_seconds = startup_seconds
        self.check_bytes = check_bytes
        self.sizes = tuple(sizes) if sizes is not None else None
        self.inject_fault = inject_fault

    def variants(self, device: str) -> list[str]:
        """all_reduce, on CPU and on CUDA where at least `min_ranks` GPUs are visible."""
        if device.startswith("cuda") and self.min_ranks > 1:
            if importlib.util.find_spec("torch") is None:
                return []
            import torch

            if torch.cuda.device_count() < self.min_ranks:
                return []
        return ["all_reduce"]

    def run(self, params: ProbeParams) -> ProbeOutcome:
        if params.variant != "all_reduce":
            raise ProbeError(f"nccl has no variant {params.variant!r}; it has: all_reduce")
        if params.budget_seconds <= 0:
            raise ProbeError(f"nccl: budget_seconds must be positive, got {params.budget_seconds}")
        if importlib.util.find_spec("torch") is None:
            raise ProbeError("nccl: torch is not installed (the agent's `probes` extra)")
        if params.device == "cpu":
            backend, gpus, default = "gloo", [-1] * CPU_RANKS, CPU_SIZES[params.suite]
        elif params.device.startswith("cuda"):
            backend, gpus, default = "nccl", self._gpus(params), CUDA_SIZES[params.suite]
        else:
            raise ProbeError(f"nccl: device must be 'cuda' or 'cpu', got {params.device!r}")
        if params.size is not None and (params.size < ELEMENT_BYTES or params.size % ELEMENT_BYTES):
            raise ProbeError(
                f"nccl: size must be a positive multiple of {ELEMENT_BYTES} bytes, not {params.size}"
            )
        sizes = (params.size,) if params.size is not None else self.sizes or default
        if len(gpus) < self.min_ranks:
            raise ProbeError(
                f"nccl all_reduce needs at least {self.min_ranks} GPUs, got {len(gpus)}: "
                "a one-rank all-reduce moves no data over any link (bus bandwidth 0)"
            )
        startup = self.startup_seconds
        if startup is None:
            startup = 60.0 if backend == "nccl" else 30.0
        started = time.time()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="gpufleet-nccl-") as tmp:
            results = _Launch(
                tmp=Path(tmp),
                backend=backend,
                gpus=gpus,
                sizes=list(sizes),
                budget=params.budget_seconds,
                max_iters=MAX_ITERS[params.suite],
                check_bytes=self.check_bytes,
                limit=startup + params.budget_seconds * 1.5,
                inject_fault=self.inject_fault,
            ).run()
        return self._outcome(
            params=params,
            backend=backend,
            gpus=gpus,
            results=results,
            started=started,
            wall=time.perf_counter() - t0,
        )

    def _gpus(self, params: ProbeParams) -> list[int]:
        gpus = list(params.gpus)
        if not gpus:
            import torch

            gpus = list(range(torch.cuda.device_count()))
        if len(set(gpus)) != len(gpus) or min(gpus, default=0) < 0:
            raise ProbeError(f"nccl: GPU indices must be distinct and non-negative, got {gpus}")
        return gpus

    def _outcome(
        self,
        *,
        params: ProbeParams,
        backend: str,
        gpus: list[int],
        results: list[dict[str, Any]],
        started: float,
        wall: float,
    ) -> ProbeOutcome:
        figures = summarise(results)
        worst = max(float(r["check_relative_error"]) for r in results)
        finite = all(bool(r["check_finite"]) for r in results) and math.isfinite(worst)
        passed = finite and worst <= CHECK_BAND
        head = figures[-1]
        rank0 = results[0]
        params_out = {
            "ranks": str(len(results)),
            "backend": backend,
            "dtype": "float32",
            "op": "sum",
            "size_bytes": str(head.size_bytes),
            "algbw_gbps": f"{head.algbw_gbps:.2f}",
            "measure": "busbw",
            "sizes_bytes": ",".join(str(f.size_bytes) for f in figures),
            "algbw_gbps_by_size": ",".join(f"{f.algbw_gbps:.2f}" for f in figures),
            "busbw_gbps_by_size": ",".join(f"{f.busbw_gbps:.2f}" for f in figures),
            "time_us_by_size": ",".join(f"{f.seconds * 1e6:.1f}" for f in figures),
            "iterations_by_size": ",".join(str(f.iterations) for f in figures),
            "timing": str(rank0["timing"]),
            "measure_seconds": f"{max(float(r['measure_seconds']) for r in results):.3f}",
            "suite": params.suite,
        }
        if rank0["skipped_bytes"]:
            params_out["skipped_sizes_bytes"] = ",".join(str(s) for s in sorted(rank0["skipped_bytes"]))
        if backend == "nccl":
            params_out["gpus"] = ",".join(str(g) for g in gpus)
            params_out["nccl_version"] = str(rank0["nccl_version"])
            params_out["gpu_name"] = str(rank0["device_name"])
        outcome = ProbeOutcome(
            probe=self.name,
            variant="all_reduce",
            gpu=None,
            value=round(head.busbw_gbps, 3),
            unit="GB/s",
            duration_seconds=round(wall, 3),
            time=started,
            params=params_out,
            check_passed=passed,
            check_relative_error=worst if finite else None,
            device="cuda" if backend == "nccl" else "cpu",
        )
        if not passed:  # like gemm: the figure stays, marked untrustworthy
            found = "NaN or Inf in the sum" if not finite else f"sum off by a relative {worst:.3g}"
            outcome.error = f"correctness check failed: {found} (band {CHECK_BAND:g})"
        return outcome


@dataclass
class _Launch:
    """Start the ranks, wait for all of them or the first failure or the time limit, clean up."""

    tmp: Path
    backend: str
    gpus: list[int]
    sizes: list[int]
    budget: float
    max_iters: int
    check_bytes: int
    limit: float  # seconds from launch until every rank is killed
    inject_fault: str

    def run(self) -> list[dict[str, Any]]:
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[Path] = []
        try:
            for rank in range(len(self.gpus)):
                log = self.tmp / f"rank{rank}.log"
                logs.append(log)
                with log.open("wb") as out:
                    try:
                        proc = subprocess.Popen(
                            self._argv(rank),
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            env=self._env(),
                            start_new_session=True,  # its own process group: killed as one
                        )
                    except OSError as exc:
                        raise ProbeError(f"nccl: cannot start rank {rank}: {exc}") from exc
                    procs.append(proc)
            self._wait(procs, logs)
        finally:
            _kill(procs)
        results = []
        for rank in range(len(procs)):
            try:
                results.append(json.loads((self.tmp / f"rank{rank}.json").read_text()))
            except (OSError, ValueError) as exc:
                raise ProbeError(
                    f"nccl rank {rank} exited cleanly but left no readable result: {exc}"
                ) from exc
        return results

    def _argv(self, rank: int) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            WORKER_MODULE,
            f"--rank={rank}",
            f"--world-size={len(self.gpus)}",
            f"--backend={self.backend}",
            f"--gpu={self.gpus[rank]}",
            f"--store={self.tmp / 'store'}",
            f"--sizes={','.join(str(s) for s in self.sizes)}",
            f"--budget={self.budget}",
            f"--max-iters={self.max_iters}",
            f"--check-bytes={self.check_bytes}",
            f"--exit-after={self.limit + 15}",  # the rank's own watchdog, should the parent hang
            f"--parent-pid={os.getpid()}",  # and should it die (a kill of its group misses the ranks)
            f"--out={self.tmp / f'rank{rank}.json'}",
        ]
        if self.inject_fault:
            argv.append(f"--inject-fault={self.inject_fault}")
        return argv

    @staticmethod
    def _env() -> dict[str, str]:
        # Inherited as they are, CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER give rank i's GPU index
        # the meaning it has in the calling process.
        env = dict(os.environ)
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = f"{_ROOT}{os.pathsep}{path}" if path else str(_ROOT)
        # One node: bootstrap and gloo sockets stay on loopback, never on a routable interface.
        env["NCCL_SOCKET_IFNAME"] = "lo"
        env["GLOO_SOCKET_IFNAME"] = "lo"
        env["OMP_NUM_THREADS"] = "1"
        return env

    def _wait(self, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
        deadline = time.monotonic() + self.limit
        exited: dict[int, float] = {}  # rank -> when this process first saw it exited
        while True:
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            for r, c in enumerate(codes):
                if c is not None:
                    exited.setdefault(r, now)
            if any(c not in (None, 0) for c in codes):
                raise ProbeError(self._blame(procs, logs, exited))
            if all(c == 0 for c in codes):
                return
            if now > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                last = "; ".join(f"rank {r}: {_tail(logs[r], lines=1) or '(none)'}" for r in running)
                raise ProbeError(
                    f"nccl all_reduce timed out after {self.limit:.0f} s (ranks still running: "
                    f"{', '.join(map(str, running))}); killed every rank. Last output: {last}"
                )
            time.sleep(POLL_SECONDS)

    def _blame(self, procs: list[subprocess.Popen[bytes]], logs: list[Path], exited: dict[int, float]) -> str:
        """The error of the rank that failed first, whichever rank this process saw exit first.

        When one rank fails, its peers fail too (a closed connection, a collective that cannot
        complete), and which of them exits or is polled first is a race. So the ranks still running
        get SETTLE_SECONDS to exit, and each failed rank is ranked by its own failure record
        (`failure_record`, written before its connections close): a rank's own error before a
        "peer gone" error, then the earliest. A rank that died without a record (a signal, an
        abort) counts as its own error, at the time it was seen exiting (on or after its death).
        """
        settle = time.monotonic() + SETTLE_SECONDS
        while any(p.poll() is None for p in procs) and time.monotonic() < settle:
            time.sleep(POLL_SECONDS)
        now = time.monotonic()
        codes = [p.poll() for p in procs]
        for r, c in enumerate(codes):
            if c is not None:
                exited.setdefault(r, now)
        records = {r: _read_record(self.tmp / f"rank{r}.json") for r in range(len(procs))}
        failed = [r for r, c in enumerate(codes) if c not in (None, 0) or records[r] is not None]

        def order(r: int) -> tuple[bool, float, int]:
            record = records[r]
            if record is None:
                return (False, exited.get(r, now), r)
            return (bool(record.get("peer")), float(record.get("at", now)), r)

        failed.sort(key=order)
        first, rest = failed[0], failed[1:]
        status = "is still exiting" if codes[first] is None else f"exited with {_describe(codes[first])}"
        text = f"nccl rank {first}{self._where(first)} {status}: {self._error(first, records[first], logs)}"
        if rest:
            then = "; ".join(f"rank {r}: {self._error(r, records[r], logs)[:SECONDARY_LIMIT]}" for r in rest)
            text += f" (then also failed: {then})"
        return text

    @staticmethod
    def _error(rank: int, record: dict[str, Any] | None, logs: list[Path]) -> str:
        if record is not None and record.get("error"):
            return str(record["error"])[-TAIL_LIMIT:]
        return _tail(logs[rank])

    def _where(self, rank: int) -> str:
        return f" (GPU {self.gpus[rank]})" if self.backend == "nccl" else ""


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each rank's process group (the rank and anything it started), then reap it."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # exited between poll and kill
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


def _tail(log: Path, lines: int = 3, limit: int = TAIL_LIMIT) -> str:
    """A rank's error: its closing `nccl_worker rank R: Type: message` line when it wrote one, else
    the last few non-empty lines of its output (a crash, a signal, a library's own message)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(kept):
        if line.startswith("nccl_worker rank "):
            return line.partition(": ")[2][-limit:]
    return " | ".join(kept[-lines:])[-limit:]
