"""``python -m gpuwear``."""

import sys

from gpuwear.cli import main

sys.exit(main())
