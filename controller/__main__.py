"""`python -m controller` is the `gpufleet` command."""

import sys

from controller.cli.main import main

sys.exit(main())
