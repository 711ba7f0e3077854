"""The runner process (one per loaded model): everything here runs only in it.

Kept free of imports (``python -m modeld.runner`` starts fast); the daemon<->runner contract the
daemon shares is :mod:`modeld.wire.runnerwire`."""
