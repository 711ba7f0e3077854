"""``python -m modeld.daemon``: see :mod:`modeld.daemon.server`."""

import sys

from modeld.daemon.server import main

sys.exit(main())
