"""How long llama.cpp's idle OpenMP threads spin before they sleep.

llama.cpp's CPU backend computes each graph on an OpenMP team (libgomp on Linux). With no
``OMP_WAIT_POLICY`` set, libgomp keeps the team's threads spinning for 300,000 iterations after
every parallel region: about 10 ms of a core after each decode on a 2-core AMD EPYC VM
(measured: the CPU a runner burns in the 20 ms after a decode, 10.1 ms by default, 1.6-3.0 ms
at 10,000). That spin lands exactly when the reply goes out: the daemon, the HTTP thread and
the client then share the one core left (the repeated-image turn's reply took 2.1-2.6 ms from
the runner to the daemon, 0.9-1.1 ms at 10,000), and another model's runner loses a core it
could decode on. Inside a graph the threads meet at barriers microseconds apart, which 10,000
iterations still cover: a 35-token prompt and a one-token decode took as long either way.

libgomp reads its environment once, when it loads: :func:`settle` runs before the runner
imports llama_cpp. A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: Iterations an idle OpenMP thread spins before it sleeps (libgomp's default: 300,000).
SPINCOUNT = 10_000
#: The variables that already say how OpenMP threads wait; either one set is left alone.
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def settle(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPINCOUNT` unless the user chose a wait policy."""
    if not any(name in environ for name in USER_SETTINGS):
        environ["GOMP_SPINCOUNT"] = str(SPINCOUNT)
