"""One rank of the all-reduce probe: `python -m agent.probes.nccl_worker --rank R ...`.

agent/probes/nccl.py starts one of these per GPU (two on CPU), each in its own session so the
parent can kill it with everything it started. Ranks meet through a FileStore in the parent's
private temporary directory: no TCP port is opened for the rendezvous (torch's TCPStore would
listen on every interface), and the transports' own sockets are kept on loopback.

Every decision that changes which collectives run (iterations per size, skipping a size) is taken
from all-reduced figures, so the ranks never disagree and deadlock. Each rank writes its own timings
and check result as JSON to --out; the parent averages the ranks' times (nccl-tests' default) and
turns them into bandwidths. On any error the rank first writes a failure record beside --out (its
error and when it caught it, so the parent can blame the rank that failed first rather than a peer
that failed because of it), and its last stderr line is `nccl_worker rank R: Type: message`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from agent.probes.nccl import (
    CHECK_SEED,
    ELEMENT_BYTES,
    ESTIMATE_OPS,
    MIN_ITERS,
    failure_record,
    failure_record_path,
    max_safe_iterations,
    plan_iterations,
)


@dataclass
class RankResult:
    rank: int
    backend: str
    device: str
    sizes_bytes: list[int] = field(default_factory=list)  # measured sizes, in the order run
    seconds_per_op: list[float] = field(default_factory=list)  # this rank's mean time per all-reduce
    iterations: list[int] = field(default_factory=list)
    skipped_bytes: list[int] = field(default_factory=list)  # sizes left out: the budget ran out
    measure_seconds: float = 0.0
    check_relative_error: float = 0.0
    check_finite: bool = True
    timing: str = ""
    nccl_version: str = ""
    device_name: str = ""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agent.probes.nccl_worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    p.add_argument("--gpu", type=int, default=-1, help="CUDA device index of this rank (nccl)")
    p.add_argument("--store", required=True, help="FileStore path shared by the ranks")
    p.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    p.add_argument("--budget", type=float, required=True, help="seconds of measurement, after init")
    p.add_argument("--max-iters", type=int, default=20)
    p.add_argument("--check-bytes", type=int, default=4 << 20)
    p.add_argument("--exit-after", type=float, required=True, help="hard limit: exit after this many s")
    p.add_argument("--out", required=True)
    p.add_argument("--parent-pid", type=int, default=None, help="exit as soon as this process is gone")
    p.add_argument("--inject-fault", default="", help="tests only: fail:R, linger:R, hang:R or corrupt:R")
    return p.parse_args(argv)


PARENT_POLL_SECONDS = 0.2
LINGER_SECONDS = 3.0  # the `linger` test hook's delay: longer than the parent's SETTLE_SECONDS


def _exit_after(seconds: float, rank: int, parent: int | None = None) -> None:
    """Watchdog: a rank never outlives its parent's deadline for long, nor its parent (pid `parent`,
    None: not watched): a rank runs in its own session, so killing the probe worker's process group
    does not reach it."""

    def expire() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if parent is not None and os.getppid() != parent:  # reparented: our parent is gone
                print(f"nccl_worker rank {rank}: ParentGone: the probe process died", file=sys.stderr)
                sys.stderr.flush()
                os._exit(125)
            time.sleep(min(PARENT_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        print(f"nccl_worker rank {rank}: TimeoutError: hard limit of {seconds:.0f} s passed", file=sys.stderr)
        sys.stderr.flush()
        os._exit(124)

    threading.Thread(target=expire, name="nccl-worker-deadline", daemon=True).start()


class _Rank:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.world = args.rank, args.world_size
        self.fault_kind, _, fault_rank = args.inject_fault.partition(":")
        self.fault_here = bool(self.fault_kind) and fault_rank == str(self.rank)
        torch.set_num_threads(1)  # ranks share the node's cores with each other and the agent
        if args.backend == "nccl":
            torch.cuda.set_device(args.gpu)
            self.device = torch.device("cuda", args.gpu)
        else:
            self.device = torch.device("cpu")
        store = dist.FileStore(args.store, self.world)  # type: ignore[attr-defined]  # public, not re-exported
        timeout = timedelta(seconds=max(30.0, args.exit_after))
        dist.init_process_group(
            args.backend,
            store=store,
            rank=self.rank,
            world_size=self.world,
            timeout=timeout,
            device_id=self.device if args.backend == "nccl" else None,
        )
        self.result = RankResult(rank=self.rank, backend=args.backend, device=str(self.device))
        if args.backend == "nccl":
            self.result.timing = "cuda_events"
            self.result.nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
            self.result.device_name = torch.cuda.get_device_name(self.device)
        else:
            self.result.timing = "perf_counter"

    def inject(self, kind: str) -> None:
        if self.fault_here and (self.fault_kind == kind or (kind, self.fault_kind) == ("fail", "linger")):
            if kind == "fail":
                raise RuntimeError("injected failure (test hook)")
            if kind == "hang":
                print(f"rank {self.rank}: hanging (test hook)", file=sys.stderr, flush=True)
                while True:
                    time.sleep(1)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def agree(self, values: list[float], op: str) -> list[float]:
        """All-reduce a few figures (max or min) so every rank decides the same."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        red = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN
        dist.all_reduce(t, op=red)
        return [float(v) for v in t.tolist()]

    def timed(self, buf: torch.Tensor, ops: int) -> float:
        """Seconds per all-reduce over `ops` back-to-back in-place all-reduces of `buf`."""
        dist.barrier()
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.sync()
            start.record()
            for _ in range(ops):
                dist.all_reduce(buf)
            end.record()  # the current stream waits on NCCL's stream after each synchronous op
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3 / ops
        t0 = time.perf_counter()
        for _ in range(ops):
            dist.all_reduce(buf)
        return (time.perf_counter() - t0) / ops

    def measure(self, sizes: list[int]) -> None:
        """Largest size first (the headline figure), then the rest in ascending order."""
        args, r = self.args, self.result
        max_iters = min(args.max_iters, max_safe_iterations(self.world))
        ascending = sorted(set(sizes))
        order = [ascending[-1], *ascending[:-1]]
        dist.barrier()
        t0 = time.perf_counter()
        deadline = t0 + args.budget
        self.inject("hang")
        self.inject("fail")
        for i, size in enumerate(order):
            (left,) = self.agree([deadline - time.perf_counter()], "min")
            if i > 0 and left <= 0:
                r.skipped_bytes.append(size)
                continue
            buf = torch.empty(size // ELEMENT_BYTES, dtype=torch.float32, device=self.device)
            buf.uniform_()  # random data, like a real gradient; never zeros
            dist.all_reduce(buf)  # untimed: the first op of a size sets up channels and buffers
            (estimate,) = self.agree([self.timed(buf, ESTIMATE_OPS)], "max")
            (left,) = self.agree([deadline - time.perf_counter()], "min")
            iters = plan_iterations(estimate, left / (len(order) - i), max_iters)
            if iters < MIN_ITERS:
                if i > 0:
                    r.skipped_bytes.append(size)
                    del buf
                    continue
                iters = MIN_ITERS  # the headline size is always measured, even over budget
            buf.uniform_()  # fresh values: keeps the in-place sums finite
            r.sizes_bytes.append(size)
            r.seconds_per_op.append(self.timed(buf, iters))
            r.iterations.append(iters)
            del buf
        r.measure_seconds = time.perf_counter() - t0

    def check(self) -> None:
        """All-reduce known random data (rank r: seed CHECK_SEED + r) and compare with a float64 sum."""
        numel = max(1, self.args.check_bytes // ELEMENT_BYTES)

        def data(rank: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(CHECK_SEED + rank)
            return torch.rand(numel, generator=g, dtype=torch.float32)

        mine = data(self.rank)
        if self.fault_here and self.fault_kind == "corrupt":
            mine[numel // 2] += 1.0  # what a flipped bit on one link would do to one element
        got = mine.to(self.device)
        dist.all_reduce(got)
        got_cpu = got.double().cpu()
        expected = torch.zeros(numel, dtype=torch.float64)
        for rank in range(self.world):
            expected += data(rank).double()
        self.result.check_finite = bool(torch.isfinite(got_cpu).all())
        scale = float(expected.abs().max())
        self.result.check_relative_error = float((got_cpu - expected).abs().max()) / scale
        del got

    def close(self) -> None:
        self.sync()
        dist.destroy_process_group()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _exit_after(args.exit_after, args.rank, args.parent_pid)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        if not sizes or min(sizes) < ELEMENT_BYTES:
            raise ValueError(f"--sizes needs sizes of at least {ELEMENT_BYTES} bytes, got {args.sizes!r}")
        rank = _Rank(args)
        rank.measure(sizes)
        rank.check()
        rank.close()
        payload: dict[str, Any] = asdict(rank.result)
        tmp = f"{args.out}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        os.replace(tmp, args.out)  # the parent never reads a half-written result
    except Exception as exc:  # noqa: BLE001 - the parent reports a rank by its record and last line
        # The record first, while this rank's connections are still open: a peer that fails because
        # this rank went away records its own error later, so the parent can tell which came first.
        _write_failure(args.out, failure_record(args.rank, exc, time.monotonic()))
        traceback.print_exc()
        print(f"nccl_worker rank {args.rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        if args.inject_fault == f"linger:{args.rank}":
            _linger()
        return 1
    return 0


def _linger() -> None:
    """Test hook: close this rank's connections (its peers fail and exit) but exit LINGER_SECONDS
    later, so a peer that failed because of it exits first: the parent must still blame this rank."""
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stderr.flush()
    time.sleep(LINGER_SECONDS)


def _write_failure(out: str, record: dict[str, Any]) -> None:
    path = failure_record_path(out)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:  # the parent still has the exit status and the last line
        print(f"nccl_worker rank {record['rank']}: cannot write {path}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
