"""``python -m tbq.cli``: the same as the ``tbq`` command."""

import sys

from . import main

sys.exit(main())
