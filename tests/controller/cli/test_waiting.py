"""controller/cli/waiting.py: a long operator call says on a terminal's stderr what it waits for
and for how long; piped, nothing is added; a Ctrl-C cancels the call."""

from __future__ import annotations

import io
import sys
import time
from typing import Any

import pytest

from controller.cli import waiting


class Call:
    """A grpc.Future stand-in, done `after` seconds from its making."""

    def __init__(self, after: float, result: Any = "answer", interrupt: bool = False) -> None:
        self.ends = time.monotonic() + after
        self.answer, self.interrupt, self.cancelled = result, interrupt, False

    def done(self) -> bool:
        if self.interrupt:
            raise KeyboardInterrupt  # as a Ctrl-C lands in the wait's loop
        return time.monotonic() >= self.ends

    def result(self) -> Any:
        while not self.done():
            time.sleep(0.01)
        return self.answer

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_it_says_what_it_waits_for_and_for_how_long(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    assert waiting.waited(Call(1.2), "draining n0", 30) == "answer"
    shown = screen.getvalue()
    assert "draining n0: 1s (at most 30s)" in shown
    assert waiting.waited(Call(0.5), "draining n1", 0) == "answer"
    assert "draining n1: 0s" in screen.getvalue() and "draining n1: 0s (at most" not in screen.getvalue()


def test_piped_it_adds_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert waiting.waited(Call(0.3), "draining n0", 30) == "answer"
    assert capsys.readouterr().err == ""


def test_ctrl_c_while_waiting_cancels_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", Terminal())
    call = Call(60, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        waiting.waited(call, "applying", 60)
    assert call.cancelled
