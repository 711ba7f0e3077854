"""A log file on a full disk (issue 21, item 7): one warning on stderr, then quiet, and the
daemon keeps serving. ``/dev/full`` fails every write with ENOSPC, as a full disk does."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemonutil import until


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_log_disk_is_one_warning(daemon_factory: Callable[..., Any],
                                        tiny_model: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="md-", dir="/tmp"))
    (root / "log").mkdir()
    (root / "log" / "modeld.log").symlink_to("/dev/full")
    try:
        d = daemon_factory("--log-level", "debug", root=root)
        c = d.client()
        for _ in range(3):
            assert "".join(c.generate(str(tiny_model), "hello", max_tokens=4))
        c.unload(str(tiny_model))
        until(lambda: c.ps() == [], what="the unload")
        d.stop()
        err = (root / "log" / "daemon.stderr").read_text()
    finally:  # never leave a file that reads as endless zeros where others may grep logs
        (root / "log" / "modeld.log").unlink()
        shutil.rmtree(root, ignore_errors=True)
    assert "--- Logging error ---" not in err and "Traceback" not in err, err[:2000]
    assert err.count("cannot write the log file") == 1, err[:2000]
    assert "No space left on device" in err
