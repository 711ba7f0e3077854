"""`modeld serve` flags through the real console script: preload, keep-alive, limits."""

from __future__ import annotations

from pathlib import Path

from cliutil import CliEnv, until


def test_serve_flags_preload_and_defaults(tiny_model: Path, gqa_model: Path) -> None:
    flags = (
        *("--preload", str(tiny_model), "--preload", str(gqa_model)),
        *("--keep-alive", "-1", "--max-models", "2", "--memory-cap", "2GiB"),
    )
    with CliEnv.served(*flags) as env:

        def both_ready() -> list[dict[str, object]]:
            rows = [env.ps_row(tiny_model), env.ps_row(gqa_model)]
            ready = [r for r in rows if r is not None and r["state"] == "ready"]
            return ready if len(ready) == 2 else []

        rows = until(both_ready, timeout=60, what="both preloaded models ready")
        assert all(row["forever"] is True for row in rows)  # --keep-alive -1
        stats = env.json("stats")
        assert stats["max_models"] == 2
        assert stats["budget_bytes"] <= 2 * 2**30
        config = env.json("config")  # the client's view of settings, not the daemon's
        assert config["sources"]["keep_alive"] == "default"
