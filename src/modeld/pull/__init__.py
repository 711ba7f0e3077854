"""Getting models from a Hugging Face hub: ``modeld pull``, ``modeld rm``, ``/api/pull``.

huggingface_hub lists the repository (tree with LFS sha256, endpoint, token, offline mode); the
bytes are fetched here (:mod:`modeld.pull.download`) so a pull resumes where it stopped and the
file's SHA-256 is checked before it becomes visible. Modules:

- :mod:`~modeld.pull.names`: reference parsing and quantisation choice (pure)
- :mod:`~modeld.pull.hub`: listing and errors through huggingface_hub
- :mod:`~modeld.pull.listing`: what a hub's listing may say (the hub is untrusted; pure)
- :mod:`~modeld.pull.download`: one resumable, verified, locked file transfer
- :mod:`~modeld.pull.interrupt`: a cancelled pull shuts its stalled connection down
- :mod:`~modeld.pull.store`: where pulled files live, their records, finding and removing them
- :mod:`~modeld.pull.puller`: a whole pull (choice, disk check, shards) as events
"""
