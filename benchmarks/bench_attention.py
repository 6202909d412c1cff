"""Attention layers against torch and PyG: see structconv.bench.attention."""

import sys

from structconv.cli import suite_main

if __name__ == "__main__":
    sys.exit(suite_main("bench", "attention"))
