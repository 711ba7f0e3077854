"""The HTTP front door: Ollama's and OpenAI's APIs over the daemon's own ZeroMQ requests.

Imported only by ``modeld serve`` when ``http`` is not ``off`` (starlette and uvicorn stay out of
the CLI's start-up).
"""
