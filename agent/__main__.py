"""`python -m agent`: the agent's command line (what `gpufleet agent` runs)."""

import sys

from agent import pipes
from agent.cli import main

sys.exit(pipes.run(main))
