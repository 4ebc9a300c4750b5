"""Real processes for end-to-end tests: `python -m MODULE ...` with its output in a log file, and a
stop that always ends it (SIGCONT first: a stopped process would not act on SIGTERM), and waiting
for a controller's ready file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

START_TIMEOUT = 60.0


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python -m ARGS`, stdout and stderr appended to `log`, unbuffered, no stdin; `env` added to
    this process's environment."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (after SIGCONT), then SIGKILL after 10 s; returns once it has ended."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ready_address(
    process: subprocess.Popen[bytes], ready: Path, log: Path, timeout: float = START_TIMEOUT
) -> dict[str, str]:
    """The controller's ready file ({"address": ..., "operator_address": ...}) once written; fails with
    its log when the process ends or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"the controller did not start:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)
    return {k: str(v) for k, v in json.loads(ready.read_text()).items()}


def start_controller(directory: Path, config: dict[str, object]) -> tuple[subprocess.Popen[bytes], str]:
    """`gpufleet controller` with `config` (YAML in `directory`, log in controller.log there); returns
    the process and the address it bound, once ready. The caller stops it."""
    path = directory / "controller.yaml"
    path.write_text(yaml.safe_dump(config))
    ready, log = directory / "controller.ready", directory / "controller.log"
    process = spawn(["controller", "controller", "--config", str(path), "--ready-file", str(ready)], log)
    try:
        return process, ready_address(process, ready, log)["address"]
    except BaseException:
        stop(process)
        raise
