"""`gpufleet controller` whose store cannot be opened at start: one line naming the store (never its
password) and exit 1, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import free_port


def _controller(tmp_path: Path, db: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "controller",
            "controller",
            "--db",
            db,
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--metrics-address",
            "none",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def _last_line(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return run.stderr.strip().splitlines()[-1]


def test_a_postgresql_server_that_cannot_be_reached_is_one_line_without_the_password(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there
    run = _controller(tmp_path, f"postgresql://gf:s3cret@127.0.0.1:{port}/fleet")
    line = _last_line(run)
    assert line.startswith(
        f"gpufleet controller: cannot open the store postgresql://gf:***@127.0.0.1:{port}/fleet: "
    )
    assert "refused" in line.lower()
    assert "s3cret" not in run.stderr + run.stdout


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs /proc (Linux): a directory no one can create in"
)
def test_an_sqlite_file_that_cannot_be_made_is_one_line_naming_it(tmp_path: Path) -> None:
    run = _controller(tmp_path, "/proc/self/gpufleet/fleet.db")  # /proc refuses new directories to root too
    line = _last_line(run)
    assert line.startswith("gpufleet controller: cannot open the store /proc/self/gpufleet/fleet.db: "), line
