"""``python -m npujax.cli``."""

import sys

from npujax.cli import main

sys.exit(main())
