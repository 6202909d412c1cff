"""Graph layers against PyG and a hand-ordered contraction: see structconv.bench.graph."""

import sys

from structconv.cli import suite_main

if __name__ == "__main__":
    sys.exit(suite_main("bench", "graph"))
