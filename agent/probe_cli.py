"""`gpufleet probe`: run the probes on this machine and print the results.

The same runner as the agent's (agent/probes/runner.py): the kernels run in a worker process, GPUs
busy with other work are refused unless --force, and on a GPU each result carries the readings
taken while it ran and its ratio to the datasheet peak. `--device cpu` runs the same code on the
CPU (shapes sized to the CPU, gloo for NCCL), needing neither a GPU nor NVML.

Exit status: 0 when every probe ran and passed its check, 1 when one failed or was refused (or
nothing could run), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from agent.compose.probes import open_nvml, policy, timeouts
from agent.config import ConfigError, ProbesConfig, load
from agent.jsonout import finite
from agent.probes.base import ProbeOutcome
from agent.probes.kernels import names
from agent.probes.runner import Device, OpenSource, TorchProbes
from agent.probes.suite import SUITE_BUDGET_SECONDS
from agent.probes.worker import NO_CUDA
from agent.probes.worker_client import WorkerError, run_worker
from agent.sources.errors import SourceError

CPU_HINT = "use --device cpu to run the probes on the CPU"


class UsageError(Exception):
    """The command line asks for something this machine cannot do (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet probe",
        description="Run the probes (GEMM, memory bandwidth, PCIe, NCCL all-reduce) on this machine.",
    )
    parser.add_argument(
        "--suite",
        choices=sorted(SUITE_BUDGET_SECONDS),
        default="short",
        help="short: at most 10 s of GPU time per GPU (default); full: 60 s, bigger copies",
    )
    parser.add_argument(
        "--device", choices=["cuda", "cpu"], help="where to run (default: cuda if torch sees a GPU)"
    )
    parser.add_argument(
        "--probe",
        action="append",
        default=[],
        choices=names(),
        metavar="NAME",
        help=f"run only this probe ({', '.join(names())}); repeatable (default: all)",
    )
    parser.add_argument(
        "--gpu", action="append", type=int, default=[], metavar="N", help="probe GPU N only; repeatable"
    )
    parser.add_argument(
        "--force", action="store_true", help="probe GPUs that are busy or run other processes"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--config", metavar="FILE", help="agent config file (its probes section)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    runner: TorchProbes | None = None
    try:
        cfg = load(args.config).probes if args.config else ProbesConfig()
        device: Device = "cpu" if (args.device or _default_device(cfg)) == "cpu" else "cuda"
        if device == "cpu" and args.gpu:
            raise UsageError("--gpu selects GPUs: it does not go with --device cpu")
        runner = TorchProbes(
            device,
            open_source=_nvml(args.force) if device == "cuda" else None,
            policy=policy(cfg),
            budgets={"short": cfg.short_budget_seconds, "full": cfg.full_budget_seconds},
            timeouts=timeouts(cfg),
            sample_interval=cfg.sample_interval_seconds,
            progress=_progress_printer(sys.stderr) if sys.stderr.isatty() else None,
        )
        outcomes = runner.run(args.probe, force=args.force, gpus=args.gpu or None, suite=args.suite)
    except (UsageError, ConfigError, ValueError) as exc:
        print(f"gpufleet probe: {exc}", file=sys.stderr)
        return 2
    except WorkerError as exc:
        if str(exc) == NO_CUDA:
            print(f"gpufleet probe: {exc}: {CPU_HINT}", file=sys.stderr)
            return 2
        print(f"gpufleet probe: cannot run the probes: {exc}", file=sys.stderr)
        return 1
    except SourceError as exc:
        print(f"gpufleet probe: cannot read the GPUs for the safety checks: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the worker (its own process group) is killed, not left running
        if runner is not None:
            runner.close()
        print("gpufleet probe: interrupted; no results printed", file=sys.stderr)
        return 130
    elapsed = time.monotonic() - started
    if args.json:
        print(json.dumps(document(runner, device, args.suite, outcomes, elapsed), indent=2, allow_nan=False))
    else:
        print(table(outcomes))
        print(f"{len(outcomes)} results in {elapsed:.1f} s on {device}")
    return 1 if any(o.error for o in outcomes) or not outcomes else 0


def _default_device(cfg: ProbesConfig) -> str:
    """cuda when torch sees a GPU; otherwise a usage error that suggests --device cpu."""
    request = {"device": "cuda", "describe": True}
    try:
        run = run_worker(request, python=sys.executable, timeouts=timeouts(cfg))
    except WorkerError as exc:
        if str(exc) == NO_CUDA:
            raise UsageError(f"{exc}: {CPU_HINT}") from exc
        raise
    return "cuda" if run.hello.get("devices") else "cpu"


def _nvml(force: bool) -> OpenSource | None:
    """NVML for the safety checks and readings; without it only --force may go on (no checks)."""
    try:
        open_nvml(False).close()
    except SourceError as exc:
        if force:
            print(
                f"gpufleet probe: no NVML ({exc}): probing without safety checks or readings", file=sys.stderr
            )
            return None
        raise
    return open_nvml


def document(
    runner: TorchProbes, device: str, suite: str, outcomes: list[ProbeOutcome], elapsed: float
) -> dict[str, Any]:
    """The --json document: every field of every result, and what ran them."""
    hello = runner.hello
    body: dict[str, Any] = finite(
        {
            "device": device,
            "suite": suite,
            "torch": hello.get("torch", ""),
            "gpus": [d.get("name", "") for d in hello.get("devices", []) if d.get("device") != "cpu"],
            "elapsed_seconds": round(elapsed, 3),
            "results": [dataclasses.asdict(o) for o in outcomes],
        }
    )
    return body


def _where(outcome: ProbeOutcome) -> str:
    return f"gpu {outcome.gpu}" if outcome.gpu is not None else outcome.device or "node"


def _progress_printer(stream: TextIO) -> Callable[[ProbeOutcome], None]:
    def show(outcome: ProbeOutcome) -> None:
        status = f"FAILED: {outcome.error}" if outcome.error else f"{outcome.value:.2f} {outcome.unit}"
        stream.write(
            f"probe {outcome.probe} {outcome.variant} on {_where(outcome)}: {status} "
            f"({outcome.duration_seconds:.1f} s)\n"
        )
        stream.flush()

    return show


def table(outcomes: list[ProbeOutcome]) -> str:
    header = ("probe", "variant", "where", "value", "unit", "of peak", "check", "mode", "seconds", "error")
    rows = [header]
    for o in outcomes:
        check = "" if o.check_passed is None else ("ok" if o.check_passed else "FAILED")
        rows.append(
            (
                o.probe,
                o.variant,
                _where(o),
                "" if o.error and not o.value else f"{o.value:.2f}",
                o.unit,
                "" if o.peak_ratio is None else f"{o.peak_ratio:.0%}",
                check,
                o.mode,
                f"{o.duration_seconds:.2f}",
                o.error,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


if __name__ == "__main__":
    from agent import pipes

    sys.exit(pipes.run(main))
