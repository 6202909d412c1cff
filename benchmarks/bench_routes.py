"""Time the three contraction orders and the planner's choice: see structconv.bench.routes."""

import sys

from structconv.bench.routes import main

if __name__ == "__main__":
    sys.exit(main())
