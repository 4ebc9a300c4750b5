"""`python -m controller` is the `gpufleet` command."""

import sys

from controller.command import main

sys.exit(main())
