"""The controller's event loop (controller/event_loop.py): uvloop where installed unless asked
otherwise, a clear error where asked for and missing, and the pieces that differ between the two
loops (their transport classes) handled on both."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from controller import event_loop
from controller.main import main
from controller.pipe_sizes import widen


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


def test_what_is_not_a_pipe_is_left(tmp_path: Path) -> None:
    with (tmp_path / "file").open("wb") as file:
        assert widen(FileTransport(file)) == 0


class FileTransport(asyncio.BaseTransport):
    def __init__(self, file: object) -> None:
        super().__init__({"pipe": file})


async def _kind() -> str:
    return event_loop.kind()
