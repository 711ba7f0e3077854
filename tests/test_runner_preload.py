"""MODELD_RUNNER_PRELOAD (issue 44): libraries a runner puts in its global symbol scope before
llama.cpp. Real dlopen calls, checked in a child process (a library once loaded stays)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from modeld.runner import preload

CHECK = """
import ctypes, os
from modeld.runner import preload

def loaded():  # RTLD_NOLOAD answers only for a library this process has loaded
    try:
        ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        return True
    except OSError:
        return False

print(loaded(), preload.preload(), loaded())
"""


def test_names_split_on_colons_and_spaces() -> None:
    assert preload.names({}) == []
    assert preload.names({preload.ENV: "libstdc++.so.6:libm.so.6  libgcc_s.so.1"}) == [
        "libstdc++.so.6",
        "libm.so.6",
        "libgcc_s.so.1",
    ]


def test_preload_loads_the_library_in_a_fresh_process() -> None:
    env = {"PATH": "/usr/bin:/bin", preload.ENV: "libstdc++.so.6", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False ['libstdc++.so.6'] True"


def test_a_library_that_does_not_load_names_the_variable() -> None:
    with pytest.raises(RuntimeError, match=f"{preload.ENV}: cannot load 'libno-such-lib.so.9'"):
        preload.preload({preload.ENV: "libno-such-lib.so.9"})
