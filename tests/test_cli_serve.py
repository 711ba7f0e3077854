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


def test_serve_leaves_a_shared_directory_mode_alone(tmp_path: Path) -> None:
    """A socket in a shared directory (here one like /tmp: sticky and world-writable, and one
    like a home: 0755): `serve` makes the socket 0600 and changes neither directory's mode
    (it once made /tmp 0700, locking every other user out of it). Its own runtime dir it still
    makes private."""
    import os
    import stat
    import subprocess

    sticky = tmp_path / "shared-tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    own = tmp_path / "own-run"
    own.mkdir()
    own.chmod(0o755)
    for variable, value, sock in (
        ("MODELD_SOCKET", f"ipc://{sticky}/m.sock", sticky / "m.sock"),
        ("MODELD_SOCKET", f"ipc://{home}/m.sock", home / "m.sock"),
        ("MODELD_RUNTIME_DIR", str(sticky), sticky / "modeld.sock"),
        ("MODELD_RUNTIME_DIR", str(own), own / "modeld.sock"),
    ):
        env = CliEnv.create()
        env.env.pop("MODELD_SOCKET")
        env.env[variable] = value
        before = {d: stat.S_IMODE(os.stat(d).st_mode) for d in (sticky, home)}
        try:
            proc = env.popen("serve", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            env.serve_proc = proc
            until(lambda: env.run("ps").returncode == 0, timeout=60, what="serve")  # noqa: B023
            assert stat.S_IMODE(sock.stat().st_mode) == 0o600
            after = {d: stat.S_IMODE(os.stat(d).st_mode) for d in (sticky, home)}
            assert after == before, (variable, value, before, after)
            if sock.parent == own:
                assert stat.S_IMODE(own.stat().st_mode) == 0o700  # its own: made private
            assert env.run("stop").returncode == 0
            assert proc.wait(30) == 0
        finally:
            env.cleanup()
