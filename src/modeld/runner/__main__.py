"""``python -m modeld.runner``: see :mod:`modeld.runner.process`."""

import sys

from modeld.runner.process import main

sys.exit(main())
