"""bench/gpu_node_e2e.sh on the simulator (SOURCE=sim): the script a lent GPU runs, kept from rotting here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.bench.scripts import BENCH

pytestmark = pytest.mark.slow


def test_one_node_end_to_end_on_the_simulator() -> None:
    done = subprocess.run(
        ["bash", str(BENCH / "gpu_node_e2e.sh"), sys.executable],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "SOURCE": "sim"},
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "on-connect probe round finished" in out
    assert out.count("(rc=0)") == 6  # nodes, node, findings, probe-node, retune --dry-run, commands
    assert "Probe results (latest)" in out and "Probe results of gpu-e2e" in out
    assert "gpu-defaults (dry run):" in out
    assert "applying profile gpu-defaults as a dry run" in out  # the agent's log, printed at the end
