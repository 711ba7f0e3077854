"""Several modeld daemons behind one HTTP front door, on Ray Serve (the ``modeld[ray]`` extra).

``placement`` (pure: which daemon serves a model), ``asgi`` (one ASGI request run in-process as a
stream of messages), ``node`` (what runs beside each daemon), ``ingress`` (the HTTP front door's
routing) and ``serve`` (the only module that imports Ray) — see docs/cluster.md.
"""
