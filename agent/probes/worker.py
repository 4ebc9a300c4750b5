"""The process that runs the probe kernels: `python -m agent.probes.worker`.

The agent never imports torch. It starts this process for each run (agent/probes/runner.py), so the
memory and CUDA contexts of a run are gone when it ends, a hung kernel can be killed, and no
process of the agent stays on a GPU between runs (the next run's safety check would see it).

Protocol: one JSON request on stdin (see `Request`); one JSON object per line on stdout:

    {"event": "hello", "torch": "2.13.0", "device": "cuda", "devices": [{"device": "cuda:0",
     "name": ..., "uuid": ..., "capability": "9.0", "memory_bytes": ..., "variants": {...}}]}
    {"event": "plan", "steps": [{"probe", "variant", "devices", "node_level", "mode", "budget_seconds"}]}
    {"event": "start", "step": 0}
    {"event": "outcome", "step": 0, "outcome": {ProbeOutcome's fields but `during`}}
    {"event": "done"}                    or, when nothing can run,  {"event": "fatal", "error": ...}

Devices are numbered as this process sees them (CUDA_VISIBLE_DEVICES, set by the runner). Whatever
else the process prints (libraries, NCCL) goes to stderr, never into the protocol.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from typing import IO, Any

import msgspec

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import Probe, ProbeError, ProbeParams, Suite
from agent.probes.kernels import REGISTRY, make, names
from agent.probes.suite import MIN_STEP_SECONDS, Ledger, Step, plan
from agent.probes.timing import release

NO_TORCH = "torch is not installed: python -m pip install '.[probes]' in a gpufleet clone"
NO_CUDA = "no CUDA device visible to torch"


class Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    device: str = "cuda"  # "cuda" (every visible GPU) or "cpu"
    probes: list[str] = msgspec.field(default_factory=list)  # empty: every registered probe
    suite: Suite = "short"
    budget_seconds: float = 10.0  # per GPU, for the whole run
    sizes: dict[str, int] = msgspec.field(default_factory=dict)  # probe -> size override (tests)
    describe: bool = False  # only say what is here (hello), run nothing
    parent_pid: int | None = None  # exit as soon as this process (the agent) is gone

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', not {self.device!r}")
        unknown = [p for p in self.probes if p not in REGISTRY]
        if unknown:
            raise ValueError(f"unknown probe(s) {', '.join(unknown)}; registered: {', '.join(names())}")
        if self.budget_seconds <= 0:
            raise ValueError("budget_seconds must be > 0")


class Events:
    """The protocol stream: one JSON object per line, flushed at once (the runner waits on each)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def emit(self, event: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"event": event, **fields}) + "\n")
        self.stream.flush()


def main() -> int:
    events = Events(_protocol_stream())
    try:
        request = msgspec.json.decode(sys.stdin.buffer.read() or b"{}", type=Request)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        events.emit("fatal", error=f"bad request: {exc}")
        return 2
    if request.parent_pid is not None:
        _exit_with_parent(request.parent_pid)
    try:
        import torch
    except ImportError:
        events.emit("fatal", error=NO_TORCH)
        return 1
    if request.device == "cuda" and not torch.cuda.is_available():
        events.emit("fatal", error=NO_CUDA)
        return 1
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if request.device == "cuda" else ["cpu"]
    kernels = {name: make(name) for name in (request.probes or names())}
    events.emit(
        "hello", torch=str(torch.__version__), device=request.device, devices=describe(devices, kernels)
    )
    if request.describe:
        events.emit("done")
        return 0
    _initialise(devices)
    steps = plan(
        list(kernels),
        devices,
        lambda probe, device: kernels[probe].variants(device),
        {name: k.node_level for name, k in kernels.items()},
        request.budget_seconds,
    )
    events.emit("plan", steps=[dataclasses.asdict(s) for s in steps])
    ledger = Ledger(request.budget_seconds)
    for index, step in enumerate(steps):
        events.emit("start", step=index)
        for outcome in run_step(kernels[step.probe], step, ledger, request):
            events.emit("outcome", step=index, outcome=encode(outcome))
    events.emit("done")
    return 0


def _exit_with_parent(parent: int, every_seconds: float = 0.5) -> None:
    """A killed agent must not leave its probe running on the GPUs: once the parent is gone (this
    process reparented), exit at once, GPU memory and all (the NCCL ranks watch this process)."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(every_seconds)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def describe(devices: list[str], kernels: dict[str, Probe]) -> list[dict[str, Any]]:
    import torch

    out = []
    for device in devices:
        item: dict[str, Any] = {
            "device": device,
            "name": "cpu",
            "uuid": "",
            "capability": "",
            "memory_bytes": None,
        }
        if device != "cpu":
            props = torch.cuda.get_device_properties(torch.device(device))
            item.update(
                name=props.name,
                uuid=_uuid(props),
                capability=f"{props.major}.{props.minor}",
                memory_bytes=int(props.total_memory),
            )
        whole = "cpu" if device == "cpu" else "cuda"
        item["variants"] = {
            name: k.variants(whole if k.node_level else device) for name, k in kernels.items()
        }
        out.append(item)
    return out


def run_step(kernel: Probe, step: Step, ledger: Ledger, request: Request) -> list[ProbeOutcome]:
    """The step's outcomes: one per device (per-GPU probes) or one (node-level); failures as errors."""
    allowance = ledger.allowance(step)
    targets = ["cuda" if step.devices[0] != "cpu" else "cpu"] if step.node_level else list(step.devices)
    if allowance < MIN_STEP_SECONDS:
        why = f"not run: the {request.suite} suite's {request.budget_seconds:g} s per GPU is spent"
        return [_failed(step, device, why, time.time(), 0.0) for device in targets]

    def params(device: str) -> ProbeParams:
        if step.node_level:
            gpus = tuple(range(len(step.devices))) if device == "cuda" else ()
        else:
            gpus = () if device == "cpu" else (int(device.partition(":")[2]),)
        return ProbeParams(
            variant=step.variant,
            device=device,
            gpus=gpus,
            suite=request.suite,
            budget_seconds=allowance,
            mode=step.mode,
            size=request.sizes.get(step.probe),
        )

    if step.node_level:
        outcome = guarded(kernel, step, params(targets[0]))
        ledger.charge(step.devices, outcome.duration_seconds)
        return [outcome]
    results: dict[str, ProbeOutcome] = {}
    if step.mode == "concurrent" and len(targets) > 1:
        threads = [
            threading.Thread(
                target=lambda d=device: results.__setitem__(d, guarded(kernel, step, params(d))),
                name=f"probe-{step.probe}-{device}",
            )
            for device in targets
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for device in targets:
            results[device] = guarded(kernel, step, params(device))
    for device in targets:
        ledger.charge([device], results[device].duration_seconds)
    return [results[device] for device in targets]


def guarded(kernel: Probe, step: Step, params: ProbeParams) -> ProbeOutcome:
    """Run the kernel; what it raises becomes an outcome with `error` (one bad GPU spoils nothing else)."""
    started, t0 = time.time(), time.perf_counter()
    try:
        outcome = kernel.run(params)
    except ProbeError as exc:
        outcome = _failed(step, params.device, str(exc), started, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError & co (out of memory, CUDA errors): reported
        text = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else ""
        outcome = _failed(
            step, params.device, f"{type(exc).__name__}: {text}", started, time.perf_counter() - t0
        )
    if outcome.error:  # out of the except blocks: the traceback no longer holds the kernel's tensors
        release_quietly(params.device)
    outcome.probe, outcome.variant, outcome.mode = step.probe, step.variant, step.mode
    outcome.device = outcome.device or params.device
    return outcome


def release_quietly(device: str) -> None:
    try:
        release(device if device != "cuda" else "cuda:0")
    except RuntimeError as exc:  # a broken CUDA context: the process exit frees it
        print(f"probe worker: cannot release {device}: {exc}", file=sys.stderr)


def encode(outcome: ProbeOutcome) -> dict[str, Any]:
    data = dataclasses.asdict(outcome)
    data.pop("during")
    return data


def _failed(step: Step, device: str, error: str, started: float, seconds: float) -> ProbeOutcome:
    return ProbeOutcome(
        probe=step.probe,
        variant=step.variant,
        gpu=None,
        value=0.0,
        unit="",
        duration_seconds=seconds,
        time=started,
        error=error,
        mode=step.mode,
        device=device,
    )


def _uuid(props: Any) -> str:
    """NVML's spelling of the device's UUID ("GPU-..."), so the runner can map devices to GPUs."""
    value = str(getattr(props, "uuid", "") or "")
    if not value or value.startswith(("GPU-", "MIG-")):
        return value
    return f"GPU-{value}"


def _initialise(devices: list[str]) -> None:
    """Create each GPU's context and cuBLAS handle now, so that no probe's budget pays for them."""
    import torch

    for device in devices:
        if device == "cpu":
            continue
        with torch.cuda.device(torch.device(device)):
            a = torch.ones(64, 64, device=device)
            float((a @ a).sum())


def _protocol_stream() -> IO[str]:
    """A private copy of stdout for the protocol; fd 1 (and sys.stdout) then point at stderr."""
    sys.stdout.flush()
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


if __name__ == "__main__":
    sys.exit(main())
