"""`gpufleet probe`: the whole command on the CPU, usage errors, the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import probe_cli
from agent.probes.base import ProbeOutcome
from agent.probes.gemm import EMULATED_MAX_SIZE, cpu_flags, native_on_cpu
from agent.probes.suite import SUITE_BUDGET_SECONDS

REPO = Path(__file__).resolve().parents[3]


def test_probe_device_cpu_json_runs_all_four_probes() -> None:
    pytest.importorskip("torch")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "probe", "--device", "cpu", "--json"],  # as `gpufleet probe`
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["device"], doc["suite"], doc["gpus"]) == ("cpu", "short", [])
    assert doc["torch"].startswith("2.")
    assert {r["probe"] for r in doc["results"]} == {"gemm", "membw", "pcie", "nccl"}
    for result in doc["results"]:
        assert result["error"] == "", result
        assert result["value"] > 0 and result["unit"] in ("TFLOP/s", "GB/s")
        assert result["check_passed"] is True
        assert result["device"] == "cpu" and result["mode"] in ("concurrent", "isolated")
        assert result["params"] and result["duration_seconds"] > 0
    gemm = {r["variant"]: r for r in doc["results"] if r["probe"] == "gemm"}
    assert set(gemm) == {"fp32", "bf16"}
    for variant, result in gemm.items():
        # 10 MFLOP/s .. 10 TFLOP/s: plausible, not fast. An emulated dtype (bf16 without
        # AVX512-BF16 or AMX) runs a tiny shape at ~1 GFLOP/s idle and says so; on a loaded 2-core
        # box the warm-up picks a small shape and fp32 measured 0.26 GFLOP/s. The FLOP count itself
        # is checked exactly in test_gemm.py.
        assert 1e-5 <= result["value"] <= 10.0, result
        emulated = native_on_cpu(variant, cpu_flags()) is False
        assert "warm-up" in result["params"]["sized_by"]
        assert ("emulated" in result["params"]) == emulated
        assert int(result["params"]["m"]) <= (EMULATED_MAX_SIZE if emulated else 1024)
    # The short suite plans at most 10 s of device time (test_suite.py checks the plan). The per-CPU
    # probes keep to it on any CPU (gemm sizes its shape to the CPU: unsized, its bf16 alone took
    # ~20 s on a 2-core AVX2 machine); nccl's time includes its ranks' start-up, which varies with
    # load, so only gross overruns of the whole fail here. The command's wall time is measured, not
    # asserted (README).
    per_cpu = [r["duration_seconds"] for r in doc["results"] if r["probe"] != "nccl"]
    assert sum(per_cpu) <= SUITE_BUDGET_SECONDS["short"], per_cpu
    assert sum(r["duration_seconds"] for r in doc["results"]) <= 30.0
    assert doc["elapsed_seconds"] <= took
    assert proc.stderr == ""  # no progress lines without a terminal


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_cli.main(["--device", "cpu", "--gpu", "0"]) == 2
    assert "--gpu selects GPUs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        probe_cli.main(["--probe", "warp_drive"])
    assert info.value.code == 2


def test_without_a_gpu_the_default_device_suggests_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the default device is cuda here")
    assert probe_cli.main([]) == 2
    assert "use --device cpu" in capsys.readouterr().err


def test_the_table_has_a_row_per_result() -> None:
    ok = ProbeOutcome("gemm", "bf16", 0, 712.345, "TFLOP/s", 1.25, 0.0, peak_ratio=0.72, check_passed=True)
    ok.mode = "concurrent"
    bad = ProbeOutcome("pcie", "h2d", 1, 0.0, "", 0.0, 0.0, error="refused: GPU 1 is 90% busy")
    lines = probe_cli.table([ok, bad]).splitlines()
    assert lines[0].split() == [
        "probe",
        "variant",
        "where",
        "value",
        "unit",
        "of",
        "peak",
        "check",
        "mode",
        "seconds",
        "error",
    ]
    assert lines[1].split() == [
        "gemm",
        "bf16",
        "gpu",
        "0",
        "712.35",
        "TFLOP/s",
        "72%",
        "ok",
        "concurrent",
        "1.25",
    ]
    assert lines[2].endswith("refused: GPU 1 is 90% busy")


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc (Linux)")
def test_ctrl_c_ends_the_command_in_one_line_and_kills_its_worker() -> None:
    """Ctrl-C in a terminal: SIGINT to the command's process group (its worker has a group of its
    own, so only the command hears it): one line, exit 130, no traceback, no worker left running."""
    pytest.importorskip("torch")
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "probe", "--device", "cpu", "--suite", "full"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (workers := Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()):
            assert proc.poll() is None and time.monotonic() < deadline, "no probe worker started"
            time.sleep(0.05)
        time.sleep(1.0)  # the command now waits on its worker's results
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "gpufleet probe: interrupted; no results printed", err
    assert "Traceback" not in err and out == ""
    deadline = time.monotonic() + 10
    while any(_alive(int(pid)) for pid in workers):
        assert time.monotonic() < deadline, f"probe worker(s) {workers} left running"
        time.sleep(0.05)
