"""``python -m modeld.docgen [--check] [ROOT]``: see :mod:`modeld.docgen.generate`."""

import sys

from modeld.docgen.generate import main

sys.exit(main())
