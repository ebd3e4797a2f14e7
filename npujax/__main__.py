"""``python -m npujax``: the ``npujax`` command line."""

import sys

from npujax.cli import main

sys.exit(main())
