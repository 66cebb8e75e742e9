"""`python -m bench.chaos`: the chaos run (bench.chaos.run)."""

import sys

from bench.chaos.run import main

sys.exit(main())
