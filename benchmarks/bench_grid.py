"""Grid convolutions against torch.nn.ConvNd: see structconv.bench.grid."""

import sys

from structconv.cli import suite_main

if __name__ == "__main__":
    sys.exit(suite_main("bench", "grid"))
