"""The runner pool: the spare runner, reuse of an evicted model's runner, the measured baseline.

A cold load pays for a runner process (Python plus ``import llama_cpp``: about half a second
of CPU) unless one is already started, so the pool keeps one idle *spare*; an evicted model's
runner closes its model and, when it gave the memory back, becomes the next spare instead of
exiting. The first runner to say ``hello`` brings the measured baseline (its RSS with nothing
loaded) that every load is sized with. Owned by the daemon's event loop (no locks).

With the fork server (:mod:`modeld.daemon.forkserver`) a runner starts in milliseconds with
llama_cpp imported, so no spare is started once the first hello measured the baseline; an
evicted model's runner is still kept as the spare when it gives its memory back, because a
reload in a process that has loaded before is faster than a first load in a fresh fork
(bench cold_load: 0.55 s against 0.58-0.62 s for gemma-270m).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from modeld.cache.policy import CachePolicy
from modeld.config import Settings
from modeld.daemon.supervisor import RunnerHandle, Supervisor
from modeld.errors import format_bytes
from modeld.model import memory
from modeld.wire import runnerwire

log = logging.getLogger("modeld.daemon")

#: A runner that holds more than this above its baseline after closing its model is stopped
#: rather than reused (measured: ~7 MiB after close + malloc_trim on gemma-3-270m).
RECYCLE_SLACK_BYTES = 32 << 20

#: Used for a runner's memory before any runner has said hello (replaced by measurements).
DEFAULT_RUNNER_BASELINE = memory.RUNNER_BASELINE

#: How long after the spare runner started a load waits for its ``hello`` when none has reported
#: a measured baseline yet: a load that arrives right after start would otherwise be sized
#: (n_ctx, reservation) with the built-in guess. A runner says hello ~0.5 s after start.
BASELINE_WAIT_S = 5.0


class RunnerPool:
    """Which runner process a load gets, and what becomes of a runner whose model left."""

    def __init__(
        self,
        settings: Settings,
        cache: CachePolicy,
        supervisor: Supervisor,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.sup = supervisor
        self._clock = clock
        self.spare: str | None = None
        self.baseline = DEFAULT_RUNNER_BASELINE
        self.baseline_measured = False  # set by the first hello that carries an RSS
        self.rpc_supported: bool | None = None  # the last hello: llama.cpp RPC backend built in
        self.gpu_devices: int | None = None  # the last hello: llama.cpp's CUDA devices
        self.devices: list[dict[str, Any]] = []  # the last hello: llama.cpp's devices
        self.recycling: set[str] = set()  # runners unloading their model to become the spare
        self.stopping = False
        self._spare_failures = 0
        self._spare_retry_at = 0.0

    # ------------------------------------------------------------------ taking and keeping

    def take(self, fork: bool = True) -> RunnerHandle:
        """The spare runner if it answers, else a new one (a stuck spare is stopped). With
        ``fork`` false and the fork server up, a new process, whatever the spare (a model on
        RPC workers: its decode measured 3-4% slower in a forked runner, cause not found)."""
        if not fork and self.sup.forking():
            return self.sup.spawn(fork=False)
        if self.spare is not None and self.spare in self.sup.runners:
            runner = self.sup.runners[self.spare]
            self.spare = None
            if runner.stopping_since is None and self.sup.responsive(runner):
                return runner
            if runner.stopping_since is None:  # stopped or stuck: never hand it a load
                log.warning("spare runner %s is not answering; starting another", runner.id)
                self.sup.stop(runner.id)
        self.spare = None
        return self.sup.spawn()

    def ensure_spare(self, loading: bool) -> None:
        """Keep one idle runner started (llama_cpp imported) so a cold load skips that cost.

        Not while a model is ``loading``: the new runner's import (about half a second of CPU)
        would compete with the load and its warm-up. On 2 cores that made a gemma-270m load
        0.8-2.6 s instead of 0.4 s (bench/b_daemon.py cold_load; docs/benchmarks.md).
        """
        if (
            self.settings.spare_runner
            and not (self.sup.forking() and self.baseline_measured)
            and self.spare is None
            and not self.stopping
            and not loading
            and self._clock() >= self._spare_retry_at
            and not self.recycling  # an evicted runner is about to become the spare
        ):
            self.spare = self.sup.spawn().id

    def starting_baseline_runner(self) -> RunnerHandle | None:
        """The spare runner, still starting, whose hello will bring the first measured
        baseline; None when one was measured already, there is no such spare (``spare_runner``
        off: the load's own runner starts with it) or it has taken over
        :data:`BASELINE_WAIT_S`."""
        if self.baseline_measured or self.stopping or self.spare is None:
            return None
        runner = self.sup.runners.get(self.spare)
        if (
            runner is None
            or runner.ready
            or runner.stopping_since is not None
            or self._clock() - runner.started_at >= BASELINE_WAIT_S
        ):
            return None
        return runner

    # ------------------------------------------------------------------ runner events

    def on_hello(self, runner: RunnerHandle) -> None:
        """A runner is ready: its RSS with nothing loaded is the baseline loads are sized with."""
        if runner.rpc_supported is not None:
            self.rpc_supported = runner.rpc_supported
        if runner.devices:
            self.devices = list(runner.devices)
            self.gpu_devices = sum(1 for d in runner.devices
                                   if str(d.get("name", "")).startswith("CUDA"))  # fmt: skip
        rss = runner.baseline.get("rss")
        if isinstance(rss, int) and rss > 0:
            self.baseline = rss
            self.baseline_measured = True
        log.info("runner %s is ready: baseline %s", runner.id, format_bytes(self.baseline))

    def retire(self, runner_id: str, reusable: bool = True) -> None:
        """Stop the runner of an evicted model, or have it close the model so it can be reused:
        each model switch then hands the freed process on as the next spare instead of starting
        one (about half a second of CPU for Python and llama_cpp; bench trace). Its memory
        stays charged until it reports what it still holds (:meth:`on_unloaded`) or exits."""
        runner = self.sup.runners.get(runner_id)
        if (
            reusable
            and self.settings.spare_runner
            and not self.recycling
            and not self.stopping
            and runner is not None
            and runner.ready
            and runner.stopping_since is None
        ):
            self.recycling.add(runner_id)
            self.sup.send(runner_id, runnerwire.unload())
        else:
            self.sup.stop(runner_id)

    def on_unloaded(self, runner: RunnerHandle, msg: dict[str, Any]) -> bool:
        """A runner closed its model. True (and its memory released) when it gave the memory
        back and may be reused; otherwise it is stopped and its memory is freed on exit."""
        self.recycling.discard(runner.id)
        footprint = msg.get("footprint")
        held = footprint.get("rss") if isinstance(footprint, dict) else None
        reusable = msg.get("reusable") is not False  # false: it turned a CPU kernel off for good
        if (
            isinstance(held, int)
            and held <= RECYCLE_SLACK_BYTES
            and reusable
            and not self.stopping
            and runner.stopping_since is None
        ):
            self.cache.unload_finished(runner.id)
            return True
        if not reusable:
            log.info("runner %s asks not to be reused; stopping it", runner.id)
        else:
            log.info("runner %s kept %s after unloading; stopping it", runner.id,
                     format_bytes(held) if isinstance(held, int) else "an unknown amount")
        self.sup.stop(runner.id)
        return False

    def adopt(self, runner: RunnerHandle) -> None:
        """An idle, reusable runner: the spare if there is none, else it is not needed."""
        if self.spare is None and not self.stopping and runner.id in self.sup.runners:
            self.spare = runner.id
            log.info("runner %s is reused as the spare", runner.id)
        else:
            self.sup.stop(runner.id)

    def on_exit(self, runner: RunnerHandle) -> None:
        """A runner process ended: forget it as the spare (a spare that dies before saying
        hello, a broken install, backs the next one off instead of looping) or as recycling."""
        self.recycling.discard(runner.id)
        if self.spare == runner.id:
            self.spare = None
            self._spare_failures = 0 if runner.ready else self._spare_failures + 1
            self._spare_retry_at = self._clock() + min(60.0, 0.5 * 2**self._spare_failures)
            log.warning("spare runner %s exited with code %s", runner.id, runner.exit_code)
