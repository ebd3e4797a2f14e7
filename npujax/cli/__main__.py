"""``python -m npujax.cli``."""

import sys

from npujax.cli.main import main

sys.exit(main())
