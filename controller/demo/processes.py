"""Child processes of the demo: started in their own session, logged to files, always reaped."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: if the demo is killed outright, the kernel stops its children too.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, module_args: list[str], log_dir: Path) -> Child:
    """Start `python -m <module_args>` with stdout and stderr to <log_dir>/<name>.log."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *module_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops children in order
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509 - no threads yet
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return Child(name, process, log_path)


def stop_all(children: list[Child], timeout: float = 10.0) -> None:
    """SIGTERM every child still running, wait up to `timeout`, then SIGKILL the rest."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
