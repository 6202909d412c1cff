"""``python -m structconv``: the command line, as the ``structconv`` script runs it."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
