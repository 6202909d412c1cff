"""Graph classification (GIN, batches of graphs) against PyG: see structconv.bench.graphs."""

import sys

from structconv.cli import suite_main

if __name__ == "__main__":
    sys.exit(suite_main("bench", "graphs"))
