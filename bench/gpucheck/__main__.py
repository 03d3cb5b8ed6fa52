"""`python -m gpucheck` (with bench/ and src/ on the path): see gpucheck.cli."""

import sys

from gpucheck.cli import main

sys.exit(main())
