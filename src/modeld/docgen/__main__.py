"""``python -m modeld.docgen``: see :mod:`modeld.docgen.build`."""

import sys

from modeld.docgen.build import main

sys.exit(main())
