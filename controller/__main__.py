"""`python -m controller` is the `gpufleet` command."""

import sys

from controller.main import main

sys.exit(main())
