"""The `gpufleet` command's entry point (pyproject's script, `python -m controller`). It loads
nothing of its own before pipes.run, so a Ctrl-C while the command loads (its parser, the version
lookup, gRPC) ends in one line, as one later does, instead of a traceback from inside an import."""

from __future__ import annotations

import sys

from controller import pipes


def _main() -> int:
    from controller.main import run

    return run(sys.argv[1:])


def main() -> int:
    return pipes.run(_main)
