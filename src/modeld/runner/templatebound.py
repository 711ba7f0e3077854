"""Chat templates bounded in time and memory (issue 45): a GGUF's template is code its
author wrote, and a loop or an allocation in it must cost one request a 400, never the model.

Found by trying: a template that loops when a message holds a word hung that request and every
later one of the model until ``modeld unload``; a doubling string took one runner to 4.7 GB; a
loop at load time burned 120 s before a 503. Jinja's sandbox stops attribute tricks, not work.

- **Time**: each render is watched by one thread; past :data:`RENDER_CPU_S` of the rendering
  thread's own CPU time (its ``pthread_getcpuclockid`` clock: a prompt rendered on an idle-class
  lane of a busy machine is not penalised for waiting), the watchdog raises
  :class:`TemplateStopped` in it (``PyThreadState_SetAsyncExc``: Jinja's compiled templates are
  Python bytecode, which checks for it between instructions). A render that ends first clears
  one that was set too late, under the watchdog's lock, so it never lands elsewhere. Cost: a
  lock and a notify a render (microseconds).
- **Memory**: strings and lists the template builds are bounded before they are made: ``~``
  (compiled to :meth:`BoundedEnvironment.concat_bounded`), ``+``, ``*``, ``**``, ``%``, calls
  and filters given a huge count (``center(10**9)``), and the output as it is written, each at
  most :data:`MAX_RENDER_CHARS`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from jinja2.compiler import CodeGenerator, Frame
from jinja2.nodes import Concat
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: CPU seconds one render may take (ordinary templates: about a millisecond; a 16 MB chat
#: through Qwen3's template: well under a second).
RENDER_CPU_S = 5.0
#: The longest string or list a template may build, and the longest output it may write:
#: four times the largest protocol message, as characters.
MAX_RENDER_CHARS = 64 << 20
#: The largest integer exponent of ``**`` (a big power is a long computation and a big number).
MAX_EXPONENT = 4096
_WIDTH = re.compile(r"%[-+ #0]*(\*|\d+)")  # a %-format's width: 10**9 spaces is 1 GB


class TemplateStopped(BaseException):
    """A render ran past a bound. A BaseException: Jinja's and the template's own
    ``except Exception`` never swallow it."""

    def __init__(self, why: str = "") -> None:
        super().__init__(why or f"it ran past {RENDER_CPU_S:g} s of CPU time")
        self.why = self.args[0]


def _too_big(size: int) -> None:
    if size > MAX_RENDER_CHARS:
        raise TemplateStopped(f"it built a value of over {MAX_RENDER_CHARS} characters")


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple | bytes | dict) else 0


def _check_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, int) and not isinstance(arg, bool):
            _too_big(abs(arg))


def bounded_filter(fn: Callable[..., Any]) -> Callable[..., Any]:
    skip = 2 if getattr(fn, "jinja_pass_arg", None) else 1  # the context, then the value

    @functools.wraps(fn)  # keeps jinja's pass_context/pass_environment marks
    def run(*args: Any, **kwargs: Any) -> Any:
        _check_args(args[skip:], kwargs)
        result = fn(*args, **kwargs)
        _too_big(_length(result))
        return result

    return run


class _Codegen(CodeGenerator):
    """Jinja's code generator with ``a ~ b`` built by the environment (bounded) instead of
    ``str_join`` (a doubling ``{% set s = s ~ s %}`` reaches gigabytes in 30 steps)."""

    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        self.write("environment.concat_bounded((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with the operations that make big values bounded (see the module)."""

    code_generator_class = _Codegen
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filters = {name: bounded_filter(fn) for name, fn in self.filters.items()}

    @staticmethod
    def concat_bounded(parts: tuple[Any, ...]) -> str:
        texts = [str(p) for p in parts]
        _too_big(sum(map(len, texts)))
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":
            _too_big(_length(left) + _length(right))
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and _length(seq):
                    _too_big(_length(seq) * n)
        elif operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise TemplateStopped(f"it raised a number to a power over {MAX_EXPONENT}")
        elif operator == "%" and isinstance(left, str):
            for width in _WIDTH.findall(left):
                if width == "*" or int(width) > MAX_RENDER_CHARS:
                    raise TemplateStopped("it formatted a string to an unbounded width")
        return super().call_binop(context, operator, left, right)

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_args(args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        _too_big(_length(result))
        return result


def render(template: Any, variables: dict[str, Any]) -> str:
    """``template`` (compiled by a :class:`BoundedEnvironment`) rendered within the bounds;
    raises :class:`TemplateStopped` past them."""
    with _watchdog.watching():
        out: list[str] = []
        size = 0
        for piece in _pieces(template, variables):
            size += len(piece)
            _too_big(size)
            out.append(piece)
        return "".join(out)


def _pieces(template: Any, variables: dict[str, Any]) -> Iterator[str]:
    return template.generate(**variables)  # type: ignore[no-any-return]


class _Watched:
    __slots__ = ("clock", "fired", "ident", "limit")

    def __init__(self, ident: int, clock: int | None, limit: float) -> None:
        self.ident, self.clock, self.limit = ident, clock, limit
        self.fired = False


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


def _cpu_clock(ident: int) -> int | None:
    """The CPU-time clock of thread ``ident`` (None where there is none: macOS; then the
    bound is wall time)."""
    try:
        return time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):
        return None


def _now(clock: int | None) -> float:
    return time.monotonic() if clock is None else time.clock_gettime(clock)


class _Watchdog:
    """One thread watching every render in progress (started on the first render)."""

    #: How often a render's CPU clock is read while one runs.
    POLL_S = 0.1

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: set[_Watched] = set()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        ident = threading.get_ident()
        clock = _cpu_clock(ident)
        entry = _Watched(ident, clock, _now(clock) + RENDER_CPU_S)
        with self._cond:
            self._watched.add(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="modeld-template-watch",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._watched.discard(entry)
                if entry.fired:  # set, perhaps not raised yet: never let it land elsewhere
                    _set_async_exc(ctypes.c_ulong(entry.ident), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                self._cond.wait(self.POLL_S if self._watched else None)
                for entry in self._watched:
                    if not entry.fired and _now(entry.clock) > entry.limit:
                        entry.fired = True
                        _set_async_exc(ctypes.c_ulong(entry.ident),
                                       ctypes.py_object(TemplateStopped))


_watchdog = _Watchdog()
