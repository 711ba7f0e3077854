"""Pre-rendered ``modeld --help`` (regenerate: python -m modeld.cli.entry --write-help).

tests/test_entry.py fails when it no longer matches the Typer app.
"""

HELP = (
    'Usage: modeld [OPTIONS] COMMAND [ARGS]...\n'
    '\n'
    '  Keep local GGUF models warm in a memory-aware cache and run them.\n'
    '\n'
    'Options:\n'
    '  --version   Show the version.\n'
    '  -h, --help  Show this message and exit.\n'
    '\n'
    'Commands:\n'
    '  serve       Run the daemon in the foreground (stop it with Ctrl-C,...\n'
    '  stop        Stop the running daemon (models are unloaded, in-flight...\n'
    '  run         Generate a reply, streamed to stdout.\n'
    '  embed       Print embeddings as JSON (one vector per input text).\n'
    '  rerank      Score how well each document answers the query (a...\n'
    '  load        Load a model (or refresh its keep-alive) without generating.\n'
    '  unload      Unload a model (or all); busy ones go as soon as their...\n'
    '  ps          Show loaded models: memory, context, requests...\n'
    '  stats       Cache statistics: hits, loads, evictions, memory, estimate...\n'
    '  show        Model metadata, the context it would get now and why, and...\n'
    '  list        GGUF models in the models directory, aliases, and the...\n'
    '  pull        Download a GGUF model from Hugging Face (resumable, SHA-256...\n'
    '  rm          Delete a model (all its shards) from the models directory.\n'
    '  config      The effective settings and where each one came from.\n'
    '  launch      Point Claude Code or Codex at this daemon: print the...\n'
    "  rpc-worker  Serve this machine's memory to a model loaded elsewhere...\n"
    '  cluster     Several daemons behind one HTTP front door on Ray Serve...\n'
)
