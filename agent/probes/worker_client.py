"""Start the probe worker (agent/probes/worker.py), follow its events, kill it when it hangs.

Every step the worker planned gets its outcomes, whatever happens: a step that times out, or that
the worker never reached because it died or was killed, gets outcomes that say so in `error`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec

from agent.probes.base import ProbeOutcome

log = logging.getLogger("gpufleet.agent.probes")

STDERR_TAIL = 20  # lines of the worker's stderr kept for error messages


class WorkerError(Exception):
    """The worker could not run the probes at all (no torch, no CUDA, a crash before its plan)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    startup_seconds: float = 120.0  # torch's import, CUDA's initialisation: until the plan arrives
    grace_seconds: float = 60.0  # how far past its budget a step may run before the worker is killed

    def __post_init__(self) -> None:
        if self.startup_seconds <= 0 or self.grace_seconds <= 0:
            raise ValueError("probe timeouts must be > 0")


@dataclass
class WorkerRun:
    hello: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    outcomes: list[tuple[int, ProbeOutcome]] = field(default_factory=list)  # (step, outcome) in order
    # (step, device) of each outcome as the worker numbered it: on_outcome may renumber the outcome
    reported: set[tuple[int, str]] = field(default_factory=set)


def run_worker(
    request: Mapping[str, Any],
    *,
    python: str,
    env: Mapping[str, str] | None = None,
    timeouts: Timeouts = Timeouts(),
    on_outcome: Callable[[int, ProbeOutcome], None] | None = None,
    on_hello: Callable[[dict[str, Any]], None] | None = None,
    live: set[subprocess.Popen[bytes]] | None = None,
) -> WorkerRun:
    """Run one worker to its end; WorkerError when it produced no plan (or, describing, no hello).

    `on_hello` sees the worker's hello (its devices) before any outcome; `on_outcome` each result as
    it arrives. The worker is in `live` while it runs, so `kill_all(live)` from another thread ends
    it (the agent shutting down mid-run). It exits by itself if this process dies.
    """
    request = {**request, "parent_pid": os.getpid()}
    proc = subprocess.Popen(
        [python, "-m", "agent.probes.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,  # its own process group, killed as one (NCCL ranks exit with it)
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    if live is not None:
        live.add(proc)
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
    lines: queue.Queue[bytes | None] = queue.Queue()
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, tail), daemon=True),
    ]
    for reader in readers:
        reader.start()
    run = WorkerRun()
    failure = ""
    try:
        with contextlib.suppress(BrokenPipeError):  # a worker that died at once: its status says why
            proc.stdin.write(json.dumps(dict(request)).encode())
            proc.stdin.close()
        failure = _follow(proc, lines, run, timeouts, on_outcome=on_outcome, on_hello=on_hello)
    finally:
        if proc.poll() is None:
            _kill(proc)
        proc.wait()
        if live is not None:
            live.discard(proc)
        for reader in readers:
            reader.join(timeout=5)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(BrokenPipeError):
                stream.close()
    if failure.startswith("fatal: "):
        raise WorkerError(failure.removeprefix("fatal: "))
    describing = bool(request.get("describe"))
    if (describing and not run.hello) or (not describing and not run.steps):
        why = failure or f"the probe worker exited with status {proc.returncode} before its plan"
        raise WorkerError(_with_tail(why, tail))
    if failure:
        _fill_missing(run, _with_tail(failure, tail) if "exited" in failure else failure)
    return run


def _follow(
    proc: subprocess.Popen[bytes],
    lines: queue.Queue[bytes | None],
    run: WorkerRun,
    timeouts: Timeouts,
    *,
    on_outcome: Callable[[int, ProbeOutcome], None] | None,
    on_hello: Callable[[dict[str, Any]], None] | None,
) -> str:
    """Read events until `done`; return "" or what went wrong (timed out, exited, fatal: ...)."""
    deadline = time.monotonic() + timeouts.startup_seconds
    while True:
        try:
            raw = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return _timed_out(proc, run, timeouts)
        if raw is None:
            proc.wait()
            return f"the probe worker exited with status {proc.returncode} before it finished"
        event = _decode(raw)
        if event is None:
            continue
        kind = event.get("event")
        if kind == "fatal":
            return f"fatal: {event.get('error', 'unknown error')}"
        if kind == "done":
            return ""
        if kind == "hello":
            run.hello = event
            if on_hello is not None:
                on_hello(event)
        elif kind == "plan":
            run.steps = list(event.get("steps", []))
        elif kind == "start":
            step = run.steps[int(event["step"])]
            # An isolated step runs its devices one after another, each with the step's budget.
            runs = 1 if step["node_level"] or step["mode"] == "concurrent" else len(step["devices"])
            deadline = time.monotonic() + float(step["budget_seconds"]) * runs + timeouts.grace_seconds
        elif kind == "outcome":
            index = int(event["step"])
            outcome = msgspec.convert(event["outcome"], ProbeOutcome)
            run.outcomes.append((index, outcome))
            run.reported.add((index, outcome.device))
            if on_outcome is not None:
                on_outcome(index, outcome)


def _timed_out(proc: subprocess.Popen[bytes], run: WorkerRun, timeouts: Timeouts) -> str:
    _kill(proc)
    if not run.steps:
        return f"the probe worker did not start within {timeouts.startup_seconds:g} s"
    grace = timeouts.grace_seconds
    return f"timed out: no result within its budget plus {grace:g} s; the probe process was killed"


def _fill_missing(run: WorkerRun, why: str) -> None:
    """Outcomes with `why` for every (step, device) that has none; later steps say they did not run."""
    first = True
    for index, step in enumerate(run.steps):
        devices = [_whole(step)] if step["node_level"] else list(step["devices"])
        missing = [d for d in devices if (index, d) not in run.reported]
        for device in missing:
            error = why if first else f"not run: an earlier probe failed ({why})"
            run.outcomes.append(
                (
                    index,
                    ProbeOutcome(
                        probe=step["probe"],
                        variant=step["variant"],
                        gpu=None,
                        value=0.0,
                        unit="",
                        duration_seconds=0.0,
                        time=time.time(),
                        error=error,
                        mode=step["mode"],
                        device=device,
                    ),
                )
            )
        if missing:
            first = False


def _whole(step: dict[str, Any]) -> str:
    return "cpu" if list(step["devices"]) == ["cpu"] else "cuda"


def kill_all(live: set[subprocess.Popen[bytes]]) -> None:
    """Kill every worker in `live` (and its NCCL ranks); run_worker then returns with what arrived."""
    for proc in list(live):
        if proc.poll() is None:
            _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the worker's own group (start_new_session)


def _decode(raw: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(raw)
    except ValueError:
        log.warning("probe worker: not an event: %r", raw[:200])
        return None
    return event if isinstance(event, dict) else None


def _pump(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    for raw in stream:
        lines.put(raw)
    lines.put(None)


def _drain(stream: IO[bytes], tail: collections.deque[str]) -> None:
    for raw in stream:
        text = raw.decode(errors="replace").rstrip()
        tail.append(text)
        log.debug("probe worker: %s", text)


def _with_tail(message: str, tail: collections.deque[str]) -> str:
    return f"{message}: {' | '.join(tail)}" if tail else message
