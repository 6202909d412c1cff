"""Attention layers against torch and PyG: see structconv.bench.attention."""

import sys

from structconv.bench.attention import main

if __name__ == "__main__":
    sys.exit(main())
