"""The runner process (one per loaded model) and the wire protocol the daemon speaks to it.

Kept free of imports: the daemon imports :mod:`modeld.runner.protocol` without llama_cpp."""
