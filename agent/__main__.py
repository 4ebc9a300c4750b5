"""`python -m agent`: the agent's command line (`gpufleet agent` runs it through agent.launch)."""

import sys

from agent import pipes


def _main() -> int:
    from agent.cli import main  # inside pipes.run: a Ctrl-C while it loads is one line too

    return main()


sys.exit(pipes.run(_main))
