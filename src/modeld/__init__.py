"""modeld: a memory-aware model manager daemon for local GGUF models."""

__version__ = "0.1.0"
