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


def test_ctrl_c_while_the_gpufleet_command_loads_is_one_line_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The installed `gpufleet` (pyproject's script) loads the command's modules inside the guard;
    before, the script imported controller.main first, and a Ctrl-C then was an import traceback."""
    import builtins
    import tomllib

    from controller import command

    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["gpufleet"]
    assert script == "controller.command:main"
    real = builtins.__import__

    def interrupted_loading(name: str, *args: object, **kwargs: object) -> object:
        if name == "controller.main":
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", interrupted_loading)
    assert command.main() == 130
    assert capsys.readouterr().err == "gpufleet: interrupted\n"


def test_an_agent_command_is_exec_d_with_ctrl_c_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpufleet agent|bmc|probe` exec a fresh interpreter (agent.launch) with SIGINT blocked, so a
    Ctrl-C while it starts waits for the guard; a failed exec gives the mask back."""
    import signal

    from controller import main

    seen: list[tuple[str, list[str], bool]] = []

    def execv(path: str, argv: list[str]) -> None:
        seen.append((path, argv, signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        raise OSError("not this time")

    monkeypatch.setattr("os.execv", execv)
    with pytest.raises(OSError, match="not this time"):
        main.run(["bmc", "--url", "http://bmc"])
    assert seen == [
        (sys.executable, [sys.executable, "-m", "agent.launch", "agent.bmc_cli", "--url", "http://bmc"], True)
    ]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.parametrize("module", ["agent.cli", "agent.bmc_cli", "agent.probe_cli"])
def test_a_ctrl_c_held_back_across_the_exec_ends_the_agent_command_in_one_line(module: str) -> None:
    """What `gpufleet` leaves agent.launch: SIGINT blocked, and here one already sent. It is
    delivered inside the guard: one line and 130, not a traceback from the interpreter's start."""
    import signal

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.launch", module, "--help"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "gpufleet: interrupted\n")


def test_agent_launch_runs_the_command_it_is_given_and_no_other() -> None:
    run = [sys.executable, "-m", "agent.launch"]
    done = subprocess.run(
        [*run, "agent.bmc_cli", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: gpufleet bmc ")
    done = subprocess.run(
        [*run, "os", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert (
        done.returncode == 2
        and "MODULE must be one of agent.cli, agent.bmc_cli, agent.probe_cli" in done.stderr
    )
