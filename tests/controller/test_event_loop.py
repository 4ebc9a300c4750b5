"""The controller's event loop (controller/event_loop.py): uvloop where installed unless asked
otherwise, a clear error where asked for and missing, and the pieces that differ between the two
loops (transport classes, subprocess pipes that are socket pairs under uvloop) handled on both."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
import yaml

from controller import event_loop
from controller.main import main
from controller.pipe_sizes import PIPE_BYTES, widen
from tests.controller.loops import LOOPS, pipe_capacity


def hide_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # its import raises ImportError


def test_auto_is_uvloop_where_installed_and_asyncio_where_not(monkeypatch: pytest.MonkeyPatch) -> None:
    assert event_loop.run(_kind(), "auto") == "uvloop"
    assert event_loop.run(_kind(), "asyncio") == "asyncio"
    assert event_loop.run(_kind(), "uvloop") == "uvloop"
    hide_uvloop(monkeypatch)
    assert event_loop.factory("auto") is None
    assert event_loop.run(_kind(), "auto") == "asyncio"


def test_uvloop_asked_for_and_missing_is_an_error_and_an_unknown_loop_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="event_loop must be one of auto, uvloop, asyncio"):
        event_loop.run(_kind(), "trio")
    hide_uvloop(monkeypatch)
    with pytest.raises(event_loop.NoUvloop, match="uvloop is not installed"):
        event_loop.run(_kind(), "uvloop")


def test_the_controller_asked_for_a_missing_uvloop_says_so_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump({"event_loop": "uvloop", "db": ":memory:", "metrics_address": "none"}))
    hide_uvloop(monkeypatch)
    assert main(["controller", "--config", str(path), "--listen", "127.0.0.1:0"]) == 2
    assert "gpufleet controller: event_loop is uvloop, and uvloop is not installed" in capsys.readouterr().err


def test_write_transport_takes_either_loops_and_refuses_what_cannot_write() -> None:
    with pytest.raises(TypeError, match="not a write transport"):
        event_loop.write_transport(None)
    assert event_loop.read_transport(None) is None


@pytest.mark.parametrize("loop", LOOPS)
def test_a_child_process_pipes_are_widened_on_either_loop(loop: str) -> None:
    """What the controller widens: its end of a child's stdin (a pipe on asyncio's loop, a Unix
    socket on uvloop's) holds pipe_capacity bytes, and the child reads all that is sent, in order."""

    async def go() -> tuple[int, bytes]:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert child.stdin is not None and child.stdout is not None
        writer = event_loop.write_transport(child.stdin.transport)
        got = widen(writer)
        sent = bytes(range(256)) * 8192  # 2 MiB: more than the pipe holds
        writer.write(sent)
        child.stdin.close()
        echoed = await child.stdout.read()
        await child.wait()
        assert echoed == sent
        return got, echoed

    got, _ = event_loop.run(go(), loop)
    assert got == pipe_capacity(loop)


def test_a_socket_is_widened_by_its_send_buffer_and_what_is_neither_is_left(tmp_path: Path) -> None:
    async def go() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        with ours, theirs:
            transport, _ = await loop.connect_write_pipe(asyncio.Protocol, ours.makefile("wb"))
            got = widen(transport)
            asked = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            transport.close()
        return got, asked

    got, asked = event_loop.run(go(), "uvloop")
    assert got == pipe_capacity("uvloop") and asked >= 2 * min(got, PIPE_BYTES)
    with (tmp_path / "file").open("wb") as file:
        assert widen(FileTransport(file)) == 0  # neither a pipe nor a socket


class FileTransport(asyncio.BaseTransport):
    def __init__(self, file: object) -> None:
        super().__init__({"pipe": file})


async def _kind() -> str:
    return event_loop.kind()
