"""``python -m server.cli``: the command line, as the ``tandem`` script runs it."""

import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
