"""Grid convolutions against torch.nn.ConvNd: see structconv.bench.grid."""

import sys

from structconv.bench.grid import main

if __name__ == "__main__":
    sys.exit(main())
