"""A command whose reader goes away (`gpufleet ... | head`) ends with 141 and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# More than a pipe buffer holds, so the writer meets the closed pipe.
FLOOD = "[print('x' * 99) for _ in range(200000)] and 0"


def _read_one_line_then_close(args: list[str]) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert first, "the command printed nothing"
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read()
    proc.stderr.close()
    return proc.wait(timeout=60), err


@pytest.mark.parametrize("package", ["agent", "controller"])
def test_a_closed_pipe_ends_the_command_quietly(package: str) -> None:
    code = f"from {package} import pipes; import sys; sys.exit(pipes.run(lambda: {FLOOD}))"
    status, err = _read_one_line_then_close(["-c", code])
    assert (status, err) == (141, "")


@pytest.mark.parametrize("package", ["agent", "controller"])
def test_ctrl_c_ends_the_command_in_one_line(package: str) -> None:
    interrupted = "exec('raise KeyboardInterrupt')"
    code = f"from {package} import pipes; import sys; sys.exit(pipes.run(lambda: {interrupted}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "gpufleet: interrupted\n")
