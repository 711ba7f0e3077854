"""``python -m modeld``: the same as the ``modeld`` console script."""

from modeld.cli.app import main

main()
