"""Graph layers against PyG and a hand-ordered contraction: see structconv.bench.graph."""

import sys

from structconv.bench.graph import main

if __name__ == "__main__":
    sys.exit(main())
