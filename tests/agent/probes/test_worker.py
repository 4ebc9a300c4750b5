"""The worker's steps: failures become outcomes, a spent budget skips, the request is validated."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import ProbeError, ProbeParams
from agent.probes.suite import Ledger, Step
from agent.probes.worker import Request, encode, guarded, run_step


class Kernel:
    """A kernel that raises what it is given, or reports its params."""

    name = "gemm"
    node_level = False

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.seen: list[ProbeParams] = []

    def variants(self, device: str) -> list[str]:
        return ["bf16"]

    def run(self, params: ProbeParams) -> ProbeOutcome:
        self.seen.append(params)
        if self.error is not None:
            raise self.error
        return ProbeOutcome("gemm", params.variant, None, 1.0, "TFLOP/s", 0.25, 100.0, device=params.device)


STEP = Step("gemm", "bf16", ("cpu",), False, "concurrent", 1.5)
REQUEST = Request(device="cpu", suite="short", budget_seconds=2.0, sizes={"gemm": 64})


def test_a_step_runs_with_what_the_budget_allows_and_is_charged() -> None:
    kernel = Kernel()
    ledger = Ledger(2.0, {"cpu": 1.0})
    (outcome,) = run_step(kernel, STEP, ledger, REQUEST)
    (params,) = kernel.seen
    assert (params.budget_seconds, params.size, params.mode, params.gpus) == (1.0, 64, "concurrent", ())
    assert (outcome.mode, outcome.device, outcome.error) == ("concurrent", "cpu", "")
    assert ledger.spent["cpu"] == pytest.approx(1.25)


def test_a_spent_budget_skips_the_step() -> None:
    kernel = Kernel()
    (outcome,) = run_step(kernel, STEP, Ledger(2.0, {"cpu": 2.0}), REQUEST)
    assert kernel.seen == []
    assert outcome.error == "not run: the short suite's 2 s per GPU is spent"


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (ProbeError("correctness check failed"), "correctness check failed"),
        (
            RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore detail"),
            "RuntimeError: CUDA out of memory",
        ),
    ],
)
def test_what_a_kernel_raises_becomes_an_outcome(error: Exception, text: str) -> None:
    outcome = guarded(Kernel(error), STEP, ProbeParams(variant="bf16", device="cpu"))
    assert outcome.error.startswith(text) and "more detail" not in outcome.error
    assert (outcome.probe, outcome.variant, outcome.mode, outcome.value) == (
        "gemm",
        "bf16",
        "concurrent",
        0.0,
    )
    assert "during" not in encode(outcome)


def test_bad_requests_are_refused() -> None:
    for bad in ({"device": "tpu"}, {"probes": ["warp"]}, {"budget_seconds": 0}, {"colour": "red"}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(json.dumps(bad).encode(), type=Request)
    proc = subprocess.run(
        [sys.executable, "-m", "agent.probes.worker"],
        input=b'{"device": "tpu"}',
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    (event,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert event["event"] == "fatal" and "device must be" in event["error"]


def test_the_worker_exits_when_its_parent_dies(tmp_path: Path) -> None:
    """A SIGKILLed agent must not leave a probe running on the GPUs until its budget is spent."""
    request = {"device": "cpu", "probes": ["gemm"], "budget_seconds": 60, "sizes": {"gemm": 2048}}
    events = tmp_path / "events"  # a file, not a pipe: the worker cannot learn of its parent's death by EPIPE
    parent_code = (
        "import json, os, subprocess, sys, time\n"
        f"request = {{**json.loads({json.dumps(json.dumps(request))}), 'parent_pid': os.getpid()}}\n"
        f"out = open({str(events)!r}, 'wb')\n"
        "worker = subprocess.Popen([sys.executable, '-m', 'agent.probes.worker'],\n"
        "                          stdin=subprocess.PIPE, stdout=out, stderr=subprocess.DEVNULL)\n"
        "worker.stdin.write(json.dumps(request).encode()); worker.stdin.close()\n"
        f"while b'\"start\"' not in open({str(events)!r}, 'rb').read():  # the gemm runs now (about 18 s)\n"
        "    time.sleep(0.05)\n"
        "print(worker.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    parent = subprocess.run(
        [sys.executable, "-c", parent_code], capture_output=True, text=True, timeout=60, check=True
    )
    worker = psutil.Process(int(parent.stdout.split()[0]))
    deadline = time.monotonic() + 5  # the watch looks every 0.5 s; without it, ~18 s of gemm
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                if worker.status() != psutil.STATUS_ZOMBIE:
                    time.sleep(0.1)
                    continue
            break
        else:
            raise AssertionError("the worker outlived its parent by 5 s")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
