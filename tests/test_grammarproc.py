"""modeld.daemon.grammarproc: a big schema's grammar is built in a low-priority child and comes
back the same as built in the daemon, errors included (issue 35 finding 4)."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

from modeld.daemon import grammar, grammarproc
from modeld.errors import InvalidRequestError, ModeldError
from modeld.wire import protocol  # noqa: F401  (its errors are among those checked)

WORDS = [f"w{i:05d}x" for i in range(20_000)]


def _subclasses(cls: type[ModeldError]) -> list[type[ModeldError]]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


#: The errors a build can raise: the library's and the protocol's. Not every subclass alive in
#: the test process (the HTTP layer's own, which never leave it, depend on what was imported).
BUILD_ERRORS = [c for c in _subclasses(ModeldError)
                if c.__module__ in ("modeld.errors", "modeld.wire.protocol")]


@pytest.mark.parametrize("cls", BUILD_ERRORS, ids=lambda c: c.__name__)
def test_every_modeld_error_comes_back_from_a_child_whole(cls: type[ModeldError]) -> None:
    exc = cls("what went wrong", hint="what to do", details={"field": "format", "n": 3})
    back = pickle.loads(pickle.dumps(exc, pickle.HIGHEST_PROTOCOL))
    assert type(back) is cls
    assert (back.message, back.hint, back.details) == ("what went wrong", "what to do",
                                                       {"field": "format", "n": 3})
    assert back.to_dict() == exc.to_dict()


def test_a_big_enum_is_built_in_a_child_and_matches(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "modeld")
    built = grammarproc.for_request({"enum": WORDS}, (), "auto")
    assert built == grammar.for_request({"enum": WORDS}, (), "auto")
    assert any("built in a child" in r.getMessage() for r in caplog.records)


def test_a_small_schema_stays_in_the_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "modeld")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert grammarproc.for_request(schema, (), "auto") == grammar.for_request(schema, (), "auto")
    assert not any("built in a child" in r.getMessage() for r in caplog.records)


def test_a_childs_refusal_is_the_same_error_and_its_log_lines_come_back(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "modeld")
    bad = {"enum": WORDS, "contains": {}}
    with pytest.raises(InvalidRequestError) as here:
        grammar.for_request(bad, (), "auto")
    with pytest.raises(InvalidRequestError) as there:
        grammarproc.for_request(bad, (), "auto")
    assert there.value.to_dict() == here.value.to_dict()
    assert there.value.details  # the schema path
    grammarproc.for_request({"enum": WORDS, "format": "uuid-ish"}, (), "auto")
    assert any("not checked" in r.getMessage() and "uuid-ish" in r.getMessage()
               for r in caplog.records)  # the child's "accepted, not held" line


def test_the_child_runs_at_the_lowest_priority_in_its_own_autogroup() -> None:
    code = ("import os; from modeld.daemon.grammarproc import lower_priority; lower_priority(); "
            "print(os.nice(0)); "
            "print(open('/proc/self/autogroup').read() if os.path.exists('/proc/self/autogroup')"
            " else 'nice 19')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, start_new_session=True).stdout.split("\n")
    assert out[0] == str(grammarproc.NICENESS)
    assert out[1].split()[-2:] == ["nice", str(grammarproc.NICENESS)]


def test_stopping_kills_a_build_and_its_request_gets_an_error() -> None:
    words = [f"w{i:06d}y" for i in range(200_000)]  # seconds at nice 19: time to stop it
    result: list[BaseException | str | None] = []

    def build() -> None:
        try:
            result.append(grammarproc.for_request({"enum": words}, (), "auto"))
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=build)
    t.start()
    deadline = time.monotonic() + 30
    while not grammarproc._live and time.monotonic() < deadline:
        time.sleep(0.01)
    pids = [p.pid for p in grammarproc._live]
    assert pids
    grammarproc.stop_all()
    t.join(30)
    assert isinstance(result[0], InvalidRequestError), result
    assert "exited with" in result[0].message
    for pid in pids:  # reaped, not left as a zombie
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
