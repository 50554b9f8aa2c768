"""``python -m tbq``: the same as the ``tbq`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
