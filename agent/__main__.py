"""`python -m agent`: the agent's command line (what `gpufleet agent` runs)."""

import sys

from agent.cli import main

sys.exit(main())
