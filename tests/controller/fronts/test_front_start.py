"""An ingest front (controller/fronts/front.py) whose controller goes while starting it: a Ctrl-C
in the controller's first second ends the controller before it can end its children, so the front
gets its settings and then finds both pipes closed. It ends quietly, status 0."""

from __future__ import annotations

import subprocess
import sys

from controller import children
from controller.fronts import wire


def test_a_front_whose_controller_went_as_it_started_ends_without_a_traceback() -> None:
    """Before, it went on to serve and raised RuntimeError (the closed pipe's transport) with a
    traceback, every time."""
    settings = wire.FrontSettings(listen="127.0.0.1:0", options=[], tls=None)
    for _ in range(3):
        with children.popen(
            [sys.executable, "-m", "controller.fronts.front"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as front:
            assert front.stdin is not None and front.stdout is not None and front.stderr is not None
            front.stdin.write(wire.pickled(wire.INIT, 0, settings))
            front.stdin.close()  # the controller is gone: its ends of both pipes closed
            front.stdout.close()
            err = front.stderr.read().decode()
            assert front.wait(20) == 0, err
        assert "Traceback" not in err, err
        assert "ingest front" not in err, err  # it never served
