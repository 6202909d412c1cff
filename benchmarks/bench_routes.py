"""Time the three contraction orders and the planner's choice: see structconv.bench.routes."""

import sys

from structconv.cli import suite_main

if __name__ == "__main__":
    sys.exit(suite_main("bench", "routes"))
