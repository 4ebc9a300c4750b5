"""`python -m agent.launch MODULE ARG...`: what `gpufleet agent|bmc|probe` run, in a fresh
interpreter. MODULE (agent.cli, agent.bmc_cli, agent.probe_cli) is imported inside pipes.run, so a
Ctrl-C while it loads (gRPC, the Redfish library, torch: a second and more) ends in one line, as
one later does, instead of a traceback from the middle of an import."""

from __future__ import annotations

import importlib
import signal
import sys

from agent import pipes

COMMANDS = ("agent.cli", "agent.bmc_cli", "agent.probe_cli")


def _main() -> int:
    # `gpufleet` blocked SIGINT before its exec: one sent since is delivered now, as a
    # KeyboardInterrupt inside pipes.run.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    module = sys.argv.pop(1)  # the command's own arguments follow, as sys.argv[1:]
    if module not in COMMANDS:
        print(
            f"python -m agent.launch: MODULE must be one of {', '.join(COMMANDS)}, not {module!r}",
            file=sys.stderr,
        )
        return 2
    status: int = importlib.import_module(module).main()
    return status


if __name__ == "__main__":
    sys.exit(pipes.run(_main))
